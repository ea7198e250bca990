"""Tokenizer: llama.cpp's ids on every reference text in both special modes, exact round
trips, streaming decode at character boundaries, and the pre-tokenizer table."""

from __future__ import annotations

import re
import sysconfig
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from pyinfer import Tokenizer, _bpe
from pyinfer import tokenizer as tokenizer_mod
from pyinfer.gguf import GGUFReader
from pyinfer.tokenizer import PRE_TOKENIZERS, StreamDecoder

from _reference import load, text

CASES = load("tok_llamacpp.json")["cases"]


@pytest.fixture(scope="module")
def metadata(default_model: Path) -> dict:
    with GGUFReader(default_model) as r:
        return dict(r.metadata)


@pytest.fixture(scope="module")
def tok(metadata: dict) -> Tokenizer:
    return Tokenizer(metadata)


# ---- llama.cpp's ids


def test_reference_file_is_complete():
    assert len(CASES) == 41
    assert any(c["ids"] != c["ids_special"] for c in CASES)  # special mode is exercised


@pytest.mark.parametrize("i", range(len(CASES)))
def test_reference_ids(tok: Tokenizer, i: int):
    case = CASES[i]
    assert tok.tokenize(case["text"]) == case["ids"]
    assert tok.tokenize(case["text"], special=True) == case["ids_special"]


def test_reference_ids_cold_and_warm_cache(tok: Tokenizer):
    """The per-word cache changes nothing: same ids with it empty and full."""
    tok.clear_cache()
    cold = [tok.tokenize(c["text"]) for c in CASES]
    warm = [tok.tokenize(c["text"]) for c in CASES]
    assert cold == warm == [c["ids"] for c in CASES]


def test_reference_texts_in_one_call(tok: Tokenizer):
    """Fragments between special tokens are tokenized apart, as llama.cpp does."""
    sep = "<|im_end|>"
    text = sep.join(c["text"] for c in CASES)
    expected: list[int] = []
    for j, c in enumerate(CASES):
        if j:
            expected.append(2)
        expected.extend(c["ids_special"])
    assert tok.tokenize(text, special=True) == expected


def test_generation_prompts_and_outputs(tok: Tokenizer):
    """llama.cpp's prompt ids for raw and chat prompts, and its generated text."""
    gen = load("gen_llamacpp.json")
    assert len(gen["cases"]) == 12
    for c in gen["cases"]:
        assert tok.tokenize(c["prompt"], special=True) == c["prompt_ids"]
        assert tok.detokenize(c["greedy_ids"], special=False).decode() == c["greedy_text"]


def test_perplexity_text_ids(tok: Tokenizer):
    """The perplexity tests score this text; llama.cpp's ids of it are what its figures scored."""
    ref = load("ppl.json")
    ids = tok.tokenize(text("ppl_text.txt"))
    assert len(ids) == ref["n_tokens"] > 2000
    assert ids == ref["ids"]


# ---- special tokens and ids


def test_special_ids(tok: Tokenizer):
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.eot_ids == frozenset({0, 2})  # <|endoftext|>, <|im_end|> (= EOS)
    assert tok.add_bos is False
    assert tok.tokenize("Hello world") == [19556, 905]
    assert tok.tokenize("Hello world", add_bos=True) == [1, 19556, 905]
    assert tok.tokenize("") == []
    assert tok.tokenize("", add_bos=True) == [1]


def test_control_tokens_only_with_special(tok: Tokenizer):
    text = "<|im_start|>user\nhi<|im_end|>"
    with_special = tok.tokenize(text, special=True)
    assert with_special[0] == 1 and with_special[-1] == 2
    plain = tok.tokenize(text)
    assert 1 not in plain and 2 not in plain
    assert tok.detokenize(with_special) == text.encode()
    assert tok.detokenize(with_special, special=False) == b"user\nhi"
    assert tok.is_control(2) and not tok.is_control(19556)


def test_adjacent_special_tokens(tok: Tokenizer):
    ids = tok.tokenize("<|im_start|><|im_start|><|im_end|>x<|endoftext|>", special=True)
    assert ids[:3] == [1, 1, 2] and ids[-1] == 0


def test_token_accessors(tok: Tokenizer):
    assert tok.token_text(905) == "Ġworld"
    assert tok.token_bytes(905) == b" world"
    assert tok.token_bytes(2) == b"<|im_end|>"
    with pytest.raises(ValueError, match="out of range"):
        tok.token_text(tok.vocab_size)
    with pytest.raises(ValueError, match="out of range"):
        tok.detokenize([5, -1])
    with pytest.raises(ValueError, match="out of range"):
        tok.detokenize([tok.vocab_size])


def test_tokenize_rejects_bytes(tok: Tokenizer):
    with pytest.raises(TypeError):
        tok.tokenize(b"abc")  # type: ignore[arg-type]


# ---- round trips


@pytest.mark.parametrize("special", [False, True])
def test_round_trip_reference_texts(tok: Tokenizer, special: bool):
    for c in CASES:
        assert tok.detokenize(tok.tokenize(c["text"], special=special)) == c["text"].encode("utf-8")


# ---- texts every Python install has: standard-library sources, read at test time. They change
# between Python versions, so they are checked only against themselves (round trips, the word
# cache, both merge paths, one call against many), never against stored ids.

STDLIB_FILES = ["json/decoder.py", "textwrap.py", "string.py", "heapq.py"]


@pytest.fixture(scope="module")
def stdlib_texts() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / name).read_text(encoding="utf-8") for name in STDLIB_FILES]
    assert sum(map(len, texts)) > 20_000
    return texts


def test_stdlib_sources_round_trip_and_cache(tok: Tokenizer, stdlib_texts: list[str]):
    tok.clear_cache()
    cold = [tok.tokenize(t) for t in stdlib_texts]
    warm = [tok.tokenize(t) for t in stdlib_texts]
    assert cold == warm
    for t, ids in zip(stdlib_texts, cold):
        assert tok.detokenize(ids) == t.encode("utf-8")
        assert tok.detokenize(tok.tokenize(t, special=True)) == t.encode("utf-8")
        assert tok.decoder().feed(ids) == t
        assert len(ids) < len(t) / 2  # code compresses: the merges did run


def test_stdlib_sources_merge_paths_and_one_call(tok: Tokenizer, stdlib_texts: list[str]):
    for t in stdlib_texts:
        for word in tok._bpe.split(t):
            assert tok._bpe.word_ids(word) == tok._bpe.word_ids(word, force_heap=True)
    joined = tok.tokenize("<|im_end|>".join(stdlib_texts), special=True)
    expected: list[int] = []
    for j, t in enumerate(stdlib_texts):
        expected += ([2] if j else []) + tok.tokenize(t, special=True)
    assert joined == expected


# Bytes with no token in SmolLM2's vocabulary: six C0 controls, and lead bytes of code
# points in unassigned planes (U+40000..U+BFFFF) or never valid in UTF-8. llama.cpp drops
# them, and so must we to give its ids; the round-trip property covers all other text.
MISSING_BYTES = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)}
chars = st.characters(
    codec="utf-8", max_codepoint=0x3FFFF, exclude_characters="\x04\x06\x13\x14\x16\x1d"
) | st.characters(codec="utf-8", min_codepoint=0xC0000)


def test_missing_bytes_are_dropped(tok: Tokenizer):
    assert tok.missing_bytes == MISSING_BYTES
    assert tok.detokenize(tok.tokenize("a\x04b\U00040000c")) == b"ab\x80\x80\x80c"


whitespace = st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u3000\u2009\u0085", min_size=1, max_size=12)
digits = st.text(alphabet="0123456789½²٣௫", min_size=1, max_size=12)
emoji = st.lists(
    st.sampled_from(["🙂", "👍", "🏽", "🇫", "🇷", "👨", "👩", "👧", "\u200d", "\ufe0f", "❤"]),
    min_size=1,
    max_size=8,
).map("".join)
words = st.sampled_from(
    [
        "the",
        " The",
        "don't",
        "'s",
        "'LL",
        "café",
        "naïve",
        "日本語",
        "한국어",
        "<|im_end|>",
        "<|im_start|>",
        "def",
        "    ",
        "x",
        "Ω",
        "e\u0301",
        "\u200b",
    ]
)
mixed = st.lists(
    st.one_of(st.text(chars, max_size=8), whitespace, digits, emoji, words), max_size=12
).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(chars), mixed))
def test_round_trip_property(tok: Tokenizer, s: str):
    data = s.encode("utf-8")
    assert tok.detokenize(tok.tokenize(s)) == data
    assert tok.detokenize(tok.tokenize(s, special=True)) == data


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=200))
def test_merge_paths_agree(tok: Tokenizer, s: str):
    """The scan merge (short words) and the heap merge (long words) give the same ids."""
    for word in tok._bpe.split(s):
        assert tok._bpe.word_ids(word) == tok._bpe.word_ids(word, force_heap=True)


@pytest.mark.parametrize("n", [47, 48, 49, 300, 3000])
def test_long_words(tok: Tokenizer, n: int):
    for unit in ["a", "ab", "日本", "!?", "🙂"]:
        text = unit * n
        ids = tok.tokenize(text)
        assert tok.detokenize(ids) == text.encode()
        word = tok._bpe.split(text)
        assert len(word) == 1
        assert tok._bpe.word_ids(word[0]) == tok._bpe.word_ids(word[0], force_heap=True) == ids


def test_lone_surrogate_is_an_error(tok: Tokenizer):
    with pytest.raises(UnicodeEncodeError):
        tok.tokenize("a\ud800b")


# ---- streaming decode

MULTIBYTE = [c["text"] for c in CASES if len(c["text"].encode()) > len(c["text"])] + [
    "emoji 🙂👍🏽🇫🇷 family 👨\u200d👩\u200d👧\u200d👦 and 日本語テキスト",
]


def _ends_inside_a_character(tok: Tokenizer, ids: list[int]) -> int:
    """How many prefixes of ids end inside a UTF-8 character."""
    n = 0
    for k in range(1, len(ids)):
        try:
            tok.detokenize(ids[:k]).decode("utf-8")
        except UnicodeDecodeError:
            n += 1
    return n


def _complete_prefix(data: bytes) -> str:
    """The longest prefix of `data` (a prefix of valid UTF-8) that is whole characters."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            pass
    raise AssertionError("not a prefix of valid UTF-8")


def test_multibyte_texts_split_characters(tok: Tokenizer):
    """The streaming tests below do cut characters: many tokens end mid-character."""
    assert sum(_ends_inside_a_character(tok, tok.tokenize(t)) for t in MULTIBYTE) > 20


@pytest.mark.parametrize("text", MULTIBYTE, ids=lambda t: t[:12])
def test_stream_decoder_every_prefix(tok: Tokenizer, text: str):
    ids = tok.tokenize(text)
    dec = tok.decoder()
    out = ""
    for k, i in enumerate(ids, 1):
        piece = dec.feed(i)
        assert "\ufffd" not in piece
        out += piece
        data = tok.detokenize(ids[:k])
        assert out == _complete_prefix(data)
        assert out.encode() + dec.pending == data
    assert dec.flush() == ""
    assert out == text


def test_stream_decoder_batches_and_flush(tok: Tokenizer):
    text = "日本語🙂"
    assert tok.decoder().feed(tok.tokenize(text)) == text
    smile = tok.tokenize("🙂")
    assert len(smile) > 1  # the character is cut across tokens
    dec = tok.decoder()
    assert dec.feed(smile[:-1]) == ""
    assert dec.pending == tok.detokenize(smile[:-1])
    assert dec.flush() == "\ufffd"  # the stream ended inside a character
    assert dec.feed(smile) == "🙂"  # and the decoder is ready for a new stream


def test_stream_decoder_control_tokens(tok: Tokenizer):
    ids = tok.tokenize("<|im_start|>assistant\nhi<|im_end|>", special=True)
    assert tok.decoder().feed(ids) == "<|im_start|>assistant\nhi<|im_end|>"
    assert tok.decoder(special=False).feed(ids) == "assistant\nhi"
    assert isinstance(tok.decoder(), StreamDecoder)


# ---- what the metadata selects


def test_pre_tokenizer_table():
    for name in ("gpt2", "llama-bpe", "qwen2", "smollm"):
        assert name in PRE_TOKENIZERS


def test_unknown_pre_tokenizer_is_an_error(metadata: dict):
    md = dict(metadata, **{"tokenizer.ggml.pre": "mystery-bpe"})
    with pytest.raises(ValueError, match="mystery-bpe"):
        Tokenizer(md)
    md = {k: v for k, v in metadata.items() if k != "tokenizer.ggml.pre"}
    with pytest.raises(ValueError, match="tokenizer.ggml.pre"):
        Tokenizer(md)


def test_other_tokenizer_models_are_an_error(metadata: dict):
    with pytest.raises(ValueError, match="'t5'"):
        Tokenizer(dict(metadata, **{"tokenizer.ggml.model": "t5"}))
    with pytest.raises(ValueError, match="tokenizer.ggml.scores"):  # SentencePiece-style needs its scores
        Tokenizer(dict(metadata, **{"tokenizer.ggml.model": "llama"}))
    with pytest.raises(ValueError, match="tokenizer.ggml.model"):
        Tokenizer({k: v for k, v in metadata.items() if k != "tokenizer.ggml.model"})


@pytest.mark.parametrize(("key", "value", "message"), [
    ("tokenizer.ggml.add_bos_token", "false", "tokenizer.ggml.add_bos_token must be a bool, not str"),
    ("tokenizer.ggml.add_bos_token", 0, "tokenizer.ggml.add_bos_token must be a bool, not int"),
    ("tokenizer.ggml.add_space_prefix", "no", "tokenizer.ggml.add_space_prefix must be a bool, not str"),
    ("tokenizer.ggml.eos_token_id", "x", "tokenizer.ggml.eos_token_id must be an integer, not str"),
    ("tokenizer.ggml.bos_token_id", 1.0, "tokenizer.ggml.bos_token_id must be an integer, not float"),
    ("tokenizer.ggml.tokens", np.arange(49152, dtype=np.int32), "tokenizer.ggml.tokens must be a string array"),
])
def test_wrong_typed_metadata_is_an_error_naming_the_key(metadata: dict, key: str, value: object, message: str):
    """A value of the wrong type is refused by name, not read as something else ("false" as
    a true flag, 1.0 as id 1)."""
    if key == "tokenizer.ggml.add_space_prefix":  # read by SentencePiece-style vocabularies only
        metadata = dict(metadata, **{"tokenizer.ggml.model": "llama",
                                     "tokenizer.ggml.scores": np.zeros(49152, np.float32)})
    with pytest.raises(TypeError, match=re.escape(message)):
        Tokenizer(dict(metadata, **{key: value}))


def test_a_special_id_outside_the_vocabulary_names_no_token(metadata: dict):
    assert Tokenizer(dict(metadata, **{"tokenizer.ggml.eos_token_id": 10**6})).eos_id is None
    assert Tokenizer(dict(metadata, **{"tokenizer.ggml.add_bos_token": np.bool_(True)})).add_bos is True


# A vocabulary's pieces come from one conversion of all its texts, cut again: the same bytes as
# converting each text alone, whatever the texts hold (a NUL, a character outside the byte map,
# empty texts), and the per-text path where the batched one cannot cut.
_PIECE_TEXTS = st.lists(
    st.text(alphabet=st.sampled_from(["a", "\u0120", "\u2581", "\x00", " ", "\u00e9", "\u4e00", "\u010a", "<"]),
            max_size=6),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(_PIECE_TEXTS)
def test_batched_pieces_match_one_by_one(texts: list[str]):
    assert tokenizer_mod._normal_pieces(texts) == [tokenizer_mod._normal_piece(t) for t in texts]
    assert tokenizer_mod._spm_pieces(texts) == [tokenizer_mod._spm_piece(t) for t in texts]


def test_awkward_tokens_keep_their_bytes(metadata: dict):
    """Tokens holding a NUL or a character outside the byte map, and control tokens, detokenize
    as they did one by one; end-of-turn texts are control tokens wherever they sit."""
    tokens = list(metadata["tokenizer.ggml.tokens"])
    tokens[1000] = "ab\x00c"  # a NUL: one byte like any other character of the map
    tokens[1001] = "x\u4e00"  # outside the byte map: kept as UTF-8
    t = Tokenizer(dict(metadata, **{"tokenizer.ggml.tokens": tokens}))
    assert t.detokenize([1000]) == b"ab\x00c"
    assert t.detokenize([1001]) == b"x\xe4\xb8\x80"
    im_end = t.tokenize("<|im_end|>", special=True)
    assert len(im_end) == 1 and im_end[0] in t.eot_ids
    assert t.detokenize(im_end, special=False) == b"" and t.detokenize(im_end) == b"<|im_end|>"


def test_bpe_from_a_given_index(metadata: dict, tok: Tokenizer):
    """A BPE handed the tokenizer's text-to-id table merges as one that builds its own, and
    leaves the table as it was (its synthetic symbols go into a copy)."""
    tokens, merges = list(metadata["tokenizer.ggml.tokens"]), list(metadata["tokenizer.ggml.merges"])
    index = {t: i for i, t in enumerate(tokens)}
    args = (tokens, merges, tokenizer_mod.BYTE_CHARS, tok.pre.split)
    given_index = _bpe.BPE(*args, index=index)
    own = _bpe.BPE(*args)
    assert index == {t: i for i, t in enumerate(tokens)}
    for case in CASES:
        a: list[int] = []
        b: list[int] = []
        given_index.encode(case["text"], a)
        own.encode(case["text"], b)
        assert a == b


def test_load_by_path_and_default(default_model: Path, tok: Tokenizer):
    assert Tokenizer.load(default_model).tokenize("Hello world") == [19556, 905]
    assert Tokenizer.load().vocab_size == tok.vocab_size


# ---- code point classes and the splitters against the regexes they implement


def test_char_classes_match_unicode():
    """Letters and numbers are Unicode's L* and N* (the 15.1 table built into _bpe agrees
    with this Python's database wherever that assigns a category), spaces are White_Space."""
    if tuple(map(int, unicodedata.unidata_version.split("."))) > (15, 1, 0):
        pytest.skip(f"Unicode {unicodedata.unidata_version} is newer than the built-in 15.1")
    bad = []
    for c in range(0x110000):
        ch = chr(c)
        f = _bpe.char_class(ch)
        if bool(f & 8) != bool(regex.match(r"\s", ch)):
            bad.append(c)
        cat = unicodedata.category(ch)
        if cat != "Cn" and (bool(f & 2) != (cat[0] == "L") or bool(f & 4) != (cat[0] == "N")):
            bad.append(c)
    assert bad == []


GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")

# Characters whose classes agree across Unicode versions, so that `regex` (whatever its
# Unicode version) is a fair oracle.
SPLIT_ALPHABET = (
    "abcXYZ019 \t\n\r\x0b\x0c'\"!?.,-_()<>|/#"
    "sStTmMdDrReEvVlL"
    "\u00a0\u3000\u2009\u0085é日本ж½²٣\u0301🙂"
)


def _words(pattern: str, text: str) -> list[str]:
    return [m.group() for m in regex.finditer(pattern, text)]


@pytest.fixture(scope="module")
def by_pre(metadata: dict) -> dict[str, Tokenizer]:
    return {pre: Tokenizer(dict(metadata, **{"tokenizer.ggml.pre": pre})) for pre in PRE_TOKENIZERS}


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=SPLIT_ALPHABET, max_size=40))
def test_split_matches_regex(by_pre: dict[str, Tokenizer], s: str):
    assert by_pre["gpt-2"]._bpe.split(s) == _words(GPT2_PATTERN, s)
    assert by_pre["gpt2"]._bpe.split(s) == _words(GPT2_PATTERN, s)
    # smollm: every number code point on its own first, then GPT-2 on each fragment
    expected = []
    for frag in regex.split(r"(\p{N})", s):
        expected.extend(_words(GPT2_PATTERN, frag))
    assert by_pre["smollm"]._bpe.split(s) == expected
    assert by_pre["llama-bpe"]._bpe.split(s) == _words(LLAMA3_PATTERN, s)
    assert by_pre["qwen2"]._bpe.split(s) == _words(QWEN2_PATTERN, s)


def test_pre_tokenizer_defaults(metadata: dict, by_pre: dict[str, Tokenizer]):
    assert by_pre["llama-bpe"].tokenize("Hello world") == [19556, 905]
    assert by_pre["llama-bpe"].add_bos is False  # the file's add_bos_token=False wins
    md = {k: v for k, v in metadata.items() if k != "tokenizer.ggml.add_bos_token"}
    assert Tokenizer(dict(md, **{"tokenizer.ggml.pre": "llama-bpe"})).add_bos is True
    assert Tokenizer(md).add_bos is False
