"""Gemma 3: the SentencePiece-style vocabulary and the gemma3 architecture, on the real
270M Q4_K_M file against llama.cpp's and transformers' figures (tests/data/reference/), and on
small random-weight files against the NumPy reference forward."""

from __future__ import annotations

from pathlib import Path

import _reference as ref
import pytest

from pyinfer.gguf import GGUFReader
from pyinfer.tokenizer import SPACE_MARK, Tokenizer

REF = ref.load("gemma3.json")


@pytest.fixture(scope="module")
def gemma_reader(gemma3_model: Path):
    with GGUFReader(gemma3_model) as r:
        yield r


@pytest.fixture(scope="module")
def gtok(gemma_reader) -> Tokenizer:
    return Tokenizer(gemma_reader.metadata)


# ---- the vocabulary -----------------------------------------------------------------------------


def test_vocabulary_is_read_as_sentencepiece(gtok: Tokenizer):
    assert gtok.model == "llama" and gtok.vocab_size == 262_144
    assert (gtok.bos_id, gtok.eos_id) == (2, 1) and gtok.add_bos and not gtok.add_space_prefix
    assert gtok.missing_bytes == frozenset()  # every byte has its <0xNN> token
    assert 106 in gtok.eot_ids and gtok.token_text(106) == "<end_of_turn>"


@pytest.mark.parametrize("i", range(len(REF["tokenizer"])))
def test_ids_equal_llamacpp(gtok: Tokenizer, i: int):
    case = REF["tokenizer"][i]
    assert gtok.tokenize(case["text"], add_bos=False, special=False) == case["ids"]
    assert gtok.tokenize(case["text"], add_bos=False, special=True) == case["ids_special"]
    # Every byte comes back: the space marks are spaces again, byte tokens their bytes.
    assert gtok.detokenize(case["ids"]) == case["text"].encode("utf-8")


def test_prompt_ids_equal_llamacpp(gtok: Tokenizer):
    for case in REF["cases"]:
        assert gtok.tokenize(case["prompt"], special=True) == case["prompt_ids"], case["prompt"]
    # BOS comes from the file's add_bos_token; special=False reads turn markers as text.
    chat = next(c for c in REF["cases"] if c["kind"] == "chat")
    plain = gtok.tokenize(chat["prompt"], special=False)
    assert plain[0] == 2 and 105 not in plain and gtok.detokenize(plain[1:]) == chat["prompt"].encode()


def test_byte_fallback_and_space_marks(gtok: Tokenizer):
    # A character with no token of its own becomes the byte tokens of its UTF-8.
    ch = "\U000e0041"  # a tag character, far outside any vocabulary
    ids = gtok.tokenize(ch, add_bos=False)
    assert [gtok.token_text(i) for i in ids] == ["<0xF3>", "<0xA0>", "<0x81>", "<0x81>"]
    assert gtok.detokenize(ids) == ch.encode("utf-8")
    # Spaces are the marker inside tokens, and come back as spaces.
    ids = gtok.tokenize("a b", add_bos=False)
    assert any(SPACE_MARK in gtok.token_text(i) for i in ids)
    assert gtok.detokenize(ids) == b"a b"
    # Control tokens: their text only when asked for.
    assert gtok.detokenize([2, 105], special=False) == b""
    assert gtok.detokenize([2, 105]) == b"<bos><start_of_turn>"


def _tiny_sentencepiece(**extra) -> dict:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)),
              "\u2581", "a", "b", "ab", "\u2581ab", "ba", "<ctl>"]
    scores = [0.0] * 259 + [-1.0, -2.0, -2.0, -0.5, -0.1, -0.4, 0.0]
    types = [2, 3, 3] + [6] * 256 + [1] * 6 + [3]
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1,
          "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}
    md.update(extra)
    return md


def test_merges_follow_scores_and_leftmost_ties():
    tok = Tokenizer(_tiny_sentencepiece(**{"tokenizer.ggml.add_space_prefix": False}))
    ids = {t: i for i, t in enumerate(tok._tokens)}
    # "aba": "ba" (score -0.4) merges before "ab" (-0.5).
    assert tok.tokenize("aba", add_bos=False) == [ids["a"], ids["ba"]]
    # "abab": "ba" at 1 first, then neither "a"+"ba" nor "ba"+"b" is a token.
    assert tok.tokenize("abab", add_bos=False) == [ids["a"], ids["ba"], ids["b"]]
    # " ab": "ab" merges, then "\u2581ab" (-0.1) over nothing else.
    assert tok.tokenize(" ab", add_bos=False) == [ids["\u2581ab"]]
    # Equal scores: the leftmost pair first ("ab" of "abab" if "ba" is no better).
    tok2 = Tokenizer(_tiny_sentencepiece(**{"tokenizer.ggml.add_space_prefix": False,
                                            "tokenizer.ggml.scores": [0.0] * 259 + [-1, -2, -2, -0.5, -0.1, -0.5, 0]}))
    assert tok2.tokenize("aba", add_bos=False) == [ids["ab"], ids["a"]]
    # Text with no token: byte fallback.
    assert tok.tokenize("c", add_bos=False) == [ids["<0x63>"]]


def test_space_prefix_default_and_after_special_tokens():
    tok = Tokenizer(_tiny_sentencepiece())  # no add_space_prefix key: llama.cpp's default, on
    ids = {t: i for i, t in enumerate(tok._tokens)}
    assert tok.add_space_prefix and tok.add_bos
    assert tok.tokenize("ab") == [1, ids["\u2581ab"]]
    assert tok.tokenize("ab<ctl>ab", add_bos=False, special=True) == [ids["\u2581ab"], ids["<ctl>"], ids["\u2581ab"]]


def test_sentencepiece_without_scores_is_refused():
    md = _tiny_sentencepiece()
    del md["tokenizer.ggml.scores"]
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.scores is missing"):
        Tokenizer(md)
