"""Tokenizers built from GGUF metadata, giving llama.cpp's token ids: byte-level BPE
(`tokenizer.ggml.model = gpt2`) and SentencePiece-style vocabularies (`llama`: merges by
score, the \u2581 space marker, byte fallback)."""

from __future__ import annotations

import codecs
import heapq
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate, compress
from typing import Any

import numpy as np

from pyinfer import _bpe

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class PreTokenizer:
    """How one `tokenizer.ggml.pre` value splits text into words before BPE merges them."""

    split: int  # _bpe.SPLIT_GPT2 or _bpe.SPLIT_LLAMA3: the main pattern
    isolate_numbers: bool = False  # cut out every \p{N} code point before the main pattern
    number_group: int = 0  # SPLIT_LLAMA3: numbers split into runs of \p{N}{1,number_group}
    ignore_merges: bool = False  # a word that is a token as a whole is taken as is
    add_bos: bool = False  # BOS default when the file has no tokenizer.ggml.add_bos_token


# Each line reproduces llama.cpp's handling of that `tokenizer.ggml.pre` value.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "gpt-2": PreTokenizer(_bpe.SPLIT_GPT2),
    "gpt2": PreTokenizer(_bpe.SPLIT_GPT2),
    "smollm": PreTokenizer(_bpe.SPLIT_GPT2, isolate_numbers=True),
    # Llama 3's split: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
    # | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ ; a word that is a token is taken whole.
    "llama3": PreTokenizer(_bpe.SPLIT_LLAMA3, number_group=3, ignore_merges=True, add_bos=True),
    "llama-v3": PreTokenizer(_bpe.SPLIT_LLAMA3, number_group=3, ignore_merges=True, add_bos=True),
    "llama-bpe": PreTokenizer(_bpe.SPLIT_LLAMA3, number_group=3, ignore_merges=True, add_bos=True),
    # Qwen 2's: the same with each digit a word of its own (\p{N} for \p{N}{1,3}).
    "qwen2": PreTokenizer(_bpe.SPLIT_LLAMA3, number_group=1),
}

# Texts of tokens that end a turn or a document. Like llama.cpp, such a token is treated as
# a control token even when the file marks it normal.
END_OF_TURN_TEXTS = frozenset(
    {
        "<|endoftext|>",
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|end|>",
        "<|end_of_text|>",
        "<end_of_turn>",
        "<end_of_utterance>",
        "<EOT>",
        "_<EOT>",
        "<｜end▁of▁sentence｜>",  # noqa: RUF001 (DeepSeek's token is spelled with fullwidth bars)
    }
)


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-character map: printable Latin-1 bytes stand for themselves and the
    rest are moved to U+0100 and up, so that every byte is a visible character."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, n = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(0x100 + n))
            n += 1
    return chars


BYTE_CHARS = _byte_chars()
# byte-level text -> raw bytes, through Latin-1: each character becomes the byte it stands for
_UNMAP = {ord(c): b for b, c in enumerate(BYTE_CHARS)}


def _normal_piece(text: str) -> bytes:
    try:
        return text.translate(_UNMAP).encode("latin-1")
    except UnicodeEncodeError:
        # a character outside the byte map (a malformed vocabulary): keep its UTF-8
        return b"".join(
            bytes([_UNMAP[ord(ch)]]) if ord(ch) in _UNMAP else ch.encode("utf-8") for ch in text
        )


def _spm_piece(text: str) -> bytes:
    """A SentencePiece token's bytes: its space marks are spaces."""
    return text.replace(SPACE_MARK, " ").encode("utf-8")


# A vocabulary's pieces come from one conversion of all its tokens' text, cut at the tokens'
# ends: a call per token made a large vocabulary's tokenizer slow to build (262,144 tokens).
def _normal_pieces(texts: list[str]) -> list[bytes]:
    """_normal_piece of every text: where every character is in the byte map, one byte per
    character, each text's bytes cut from the whole's at its length."""
    try:
        whole = "".join(texts).translate(_UNMAP).encode("latin-1")
    except UnicodeEncodeError:  # a character outside the map: text by text
        return [_normal_piece(t) for t in texts]
    ends = list(accumulate(map(len, texts)))
    return [whole[a:b] for a, b in zip([0, *ends], ends)]


def _spm_pieces(texts: list[str]) -> list[bytes]:
    """_spm_piece of every text: the texts joined by NUL and split again, where none holds a
    NUL of its own."""
    whole = "\0".join(texts)
    if whole.count("\0") == len(texts) - 1:
        try:
            return whole.replace(SPACE_MARK, " ").encode("utf-8").split(b"\0")
        except UnicodeEncodeError:  # a lone surrogate: raised by its own text below
            pass
    return [_spm_piece(t) for t in texts]


def _number_list(values: Any, cast: type[int] | type[float]) -> list[Any]:
    """A metadata array as Python ints or floats: a NumPy array of that kind converted at once
    (tolist gives each element's exact value), anything else element by element."""
    if isinstance(values, np.ndarray) and values.dtype.kind in ("iu" if cast is int else "f"):
        return values.tolist()
    return [cast(v) for v in values]


def _flag(metadata: Mapping[str, Any], key: str) -> bool | None:
    """A BOOL metadata value, or None when the key is absent (a string "false" is not False)."""
    v = metadata.get(key)
    if v is not None and not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{key} must be a bool, not {type(v).__name__}")
    return None if v is None else bool(v)


def _byte_token(text: str) -> bytes:
    """A byte token's value, written <0xXX>."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            pass
    return b""


# SentencePiece writes a space as U+2581 (LOWER ONE EIGHTH BLOCK) inside its tokens.
SPACE_MARK = "\u2581"


class SentencePiece:
    """The merge loop of a SentencePiece-style (`llama`) vocabulary, as llama.cpp runs it.

    A text fragment, its spaces written as SPACE_MARK, starts as one symbol per character.
    Repeatedly, of all adjacent pairs whose concatenation is a token, the one whose token has
    the highest score is merged (ties: the leftmost). Each final symbol is its token, or,
    when it is a character with no token, the byte tokens `<0xNN>` of its UTF-8.
    """

    def __init__(self, ids: dict[str, int], scores: list[float], byte_ids: list[int | None]) -> None:
        self._ids = ids  # token text -> id
        self._scores = scores
        self._byte_ids = byte_ids

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of a plain-text fragment (spaces not yet marked) to out."""
        text = text.replace(" ", SPACE_MARK)
        n = len(text)
        if n == 0:
            return
        ids, scores = self._ids, self._scores
        # Symbol i covers text[start[i]:start[i] + size[i]]; size 0 once merged into its left.
        start = list(range(n))
        size = [1] * n
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            length = size[left] + size[right]
            tid = ids.get(text[start[left]:start[left] + length])
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, length))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            # A pair made stale by an earlier merge of either side: skip it.
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue
            size[left] = length
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        i = 0
        byte_ids = self._byte_ids
        while i >= 0:
            piece = text[start[i]:start[i] + size[i]]
            tid = ids.get(piece)
            if tid is not None:
                out.append(tid)
            else:  # byte fallback; a byte with no token of its own is lost, as in llama.cpp
                out.extend(b for b in (byte_ids[c] for c in piece.encode("utf-8")) if b is not None)
            i = nxt[i]


class StreamDecoder:
    """Turns token ids into text as they arrive, a complete character at a time.

    A token may end inside a multi-byte UTF-8 character; its bytes are held until the
    character is complete, so streamed text never shows U+FFFD for a split character.
    Bytes that can never form a character become U+FFFD at once.
    """

    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: int | Iterable[int]) -> str:
        """Text completed by these ids (one id or several); may be empty."""
        seq: Iterable[int]
        try:
            seq = (operator.index(ids),)  # type: ignore[arg-type]  # one int or NumPy integer
        except TypeError:
            seq = ids  # type: ignore[assignment]
        pieces = self._pieces
        data = b"".join([pieces[_check_id(i, len(pieces))] for i in seq])
        return self._utf8.decode(data)

    def flush(self) -> str:
        """End of stream: bytes still held (an unfinished character) come out as U+FFFD."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out

    @property
    def pending(self) -> bytes:
        """Bytes held back, waiting for the rest of their character."""
        return self._utf8.getstate()[0]


def _surrogate_error(text: str) -> UnicodeEncodeError:
    """The error for a text UTF-8 cannot encode, at its first lone surrogate's index in the
    whole text (the encoder saw one piece of it)."""
    at = next((i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF), 0)
    return UnicodeEncodeError("utf-8", text, at, at + 1, "a lone surrogate: only valid Unicode text can be tokenized "
                              "(decode bytes with errors='replace' first)")


def _check_id(i: int, n: int) -> int:
    if not 0 <= i < n:
        raise ValueError(f"token id {i} is out of range for a vocabulary of {n}")
    return i


class Tokenizer:
    """A GGUF file's vocabulary: byte-level BPE (`tokenizer.ggml.model = gpt2`) or
    SentencePiece-style (`llama`, see SentencePiece).

    >>> tok = Tokenizer.load()                  # the default model
    >>> tok.tokenize("Hello world")
    [19556, 905]
    >>> tok.detokenize([19556, 905])
    b'Hello world'

    Token ids are llama.cpp's: the same pre-tokenizer, merge order and special-token
    matching, checked against its output on the reference texts of both kinds.
    """

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        model = metadata.get("tokenizer.ggml.model")
        if model not in ("gpt2", "llama"):
            if model is None:
                raise ValueError("the GGUF metadata has no tokenizer.ggml.model: no tokenizer")
            raise ValueError(
                f"tokenizer.ggml.model = {model!r} is not supported: byte-level BPE ('gpt2') and "
                "SentencePiece-style vocabularies ('llama') are"
            )
        self.model: str = model
        tokens = metadata.get("tokenizer.ggml.tokens")
        if tokens is not None and not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
            raise TypeError("tokenizer.ggml.tokens must be a string array")
        if not tokens:
            raise ValueError("tokenizer.ggml.tokens is missing or empty")
        if model == "gpt2":
            pre = self._pre_tokenizer(metadata)
            merges = metadata.get("tokenizer.ggml.merges")
            if merges is None:
                raise ValueError("tokenizer.ggml.merges is missing: byte-level BPE needs its merges")
            if not isinstance(merges, list):
                raise TypeError("tokenizer.ggml.merges must be a string array")
        else:
            # llama.cpp ignores tokenizer.ggml.pre for these vocabularies: the merge loop
            # runs over whole fragments, with no pre-tokenizer. Only the BOS default of
            # this entry is read (BOS is added unless the file says otherwise).
            pre = PreTokenizer(_bpe.SPLIT_GPT2, add_bos=True)
            merges = None
        self.pre_name: str = str(metadata.get("tokenizer.ggml.pre", "default"))
        self.pre: PreTokenizer = pre

        n = len(tokens)
        index = dict(zip(tokens, range(n)))  # token text -> id
        if len(index) != n:
            seen: dict[str, int] = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise ValueError(
                        f"duplicate token {t!r} in the vocabulary: ids {seen[t]} and {i}"
                    )
                seen[t] = i
        types_md = metadata.get("tokenizer.ggml.token_type")
        if types_md is None:
            types = [NORMAL] * n
        else:
            types = _number_list(types_md, int)
            if len(types) < n:
                raise ValueError(
                    f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens"
                )
            types = types[:n]
        eot = {index[t] for t in END_OF_TURN_TEXTS if t in index}
        for i in eot:
            types[i] = CONTROL
        self._tokens: list[str] = tokens
        self._types: list[int] = types

        self.vocab_size: int = n
        self.bos_id: int | None = self._special_id(metadata, "bos")
        self.eos_id: int | None = self._special_id(metadata, "eos")
        self.unk_id: int | None = self._special_id(metadata, "unknown")
        self.pad_id: int | None = self._special_id(metadata, "padding")
        add_bos = _flag(metadata, "tokenizer.ggml.add_bos_token")
        self.add_bos: bool = pre.add_bos if add_bos is None else add_bos
        if self.eos_id is not None:
            eot.add(self.eos_id)
        self.eot_ids: frozenset[int] = frozenset(eot)
        # A space before each text fragment that starts the text or follows a special token.
        self.add_space_prefix: bool = False
        self._bpe: Any = None  # the byte-level BPE kernel (gpt2 vocabularies)
        self._encoder: Any
        if merges is not None:
            # Bytes with no token of their own: text containing them loses them, as it does
            # in llama.cpp (SmolLM2 lacks six C0 controls and lead bytes of unused planes).
            self.missing_bytes: frozenset[int] = frozenset(
                b for b, c in enumerate(BYTE_CHARS) if c not in index
            )
            self._bpe = self._encoder = _bpe.BPE(
                tokens,
                merges,
                BYTE_CHARS,
                pre.split,
                isolate_numbers=pre.isolate_numbers,
                number_group=pre.number_group,
                ignore_merges=pre.ignore_merges,
                index=index,
            )
        else:
            scores_md = metadata.get("tokenizer.ggml.scores")
            if scores_md is None or len(scores_md) < n:
                raise ValueError(
                    "tokenizer.ggml.scores is missing or shorter than the vocabulary: a "
                    "SentencePiece-style vocabulary merges by score"
                )
            scores = _number_list(scores_md[:n], float)
            # Byte fallback: <0xNN>, else (as llama.cpp) the byte as a one-character token.
            byte_ids: list[int | None] = [
                index.get(f"<0x{b:02X}>", index.get(chr(b)) if b < 0x80 else None) for b in range(256)
            ]
            self.missing_bytes = frozenset(b for b, i in enumerate(byte_ids) if i is None)
            self._encoder = SentencePiece(index, scores, byte_ids)
            # llama.cpp's default for these vocabularies is a leading space; Gemma's files turn it off.
            space = _flag(metadata, "tokenizer.ggml.add_space_prefix")
            self.add_space_prefix = True if space is None else space

        # Texts matched as single tokens before BPE: longest first, as llama.cpp does.
        # User-defined tokens always; control and unknown ones only with special=True.
        # The ids of the other kinds, in order: few beside the normal ones.
        other = list(compress(range(n), map(NORMAL.__ne__, types)))

        def specials(kinds: tuple[int, ...]) -> list[tuple[str, int]]:
            found = [(tokens[i], i) for i in other if types[i] in kinds and tokens[i]]
            return sorted(found, key=lambda p: (-len(p[0]), p[1]))

        self._special_all = specials((CONTROL, USER_DEFINED, UNKNOWN))
        self._special_user = specials((USER_DEFINED,))

        # Bytes of each token for detokenize; control and unknown tokens render as their
        # text only when asked to (special=True).
        # The normal tokens' bytes (the others' text left out), then the other kinds'.
        texts = list(tokens)
        for i in other:
            texts[i] = ""
        pieces = _normal_pieces(texts) if merges is not None else _spm_pieces(texts)
        plain = list(pieces)
        for i in other:
            t, k = tokens[i], types[i]
            if k == USER_DEFINED:
                pieces[i] = plain[i] = t.encode("utf-8")
            elif k in (CONTROL, UNKNOWN):
                pieces[i], plain[i] = t.encode("utf-8"), b""
            elif k == BYTE:
                pieces[i] = plain[i] = _byte_token(t)
            else:  # unused and undefined tokens have no text, as in llama.cpp
                pieces[i] = plain[i] = b""
        self._pieces = pieces
        self._pieces_plain = plain

    @staticmethod
    def _pre_tokenizer(metadata: Mapping[str, Any]) -> PreTokenizer:
        pre_name = metadata.get("tokenizer.ggml.pre")
        if pre_name is None:
            raise ValueError(
                "tokenizer.ggml.pre is missing: the pre-tokenizer is unknown, and guessing "
                f"would give wrong ids (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
            )
        pre = PRE_TOKENIZERS.get(pre_name)
        if pre is None:
            raise ValueError(
                f"unknown pre-tokenizer tokenizer.ggml.pre = {pre_name!r} "
                f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})"
            )
        return pre

    @staticmethod
    def _special_id(metadata: Mapping[str, Any], name: str) -> int | None:
        key = f"tokenizer.ggml.{name}_token_id"
        v = metadata.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{key} must be an integer, not {type(v).__name__}")
        # An id outside the vocabulary names no token: as llama.cpp does, the file then has none.
        n = len(metadata["tokenizer.ggml.tokens"])
        return int(v) if 0 <= v < n else None

    @classmethod
    def load(cls, model: Any = None) -> Tokenizer:
        """The tokenizer of a GGUF file: a path, a known model name, or None (the default)."""
        from pyinfer.gguf import GGUFReader
        from pyinfer.registry import resolve_model

        with GGUFReader(resolve_model(model)) as reader:
            return cls(reader.metadata)

    # -- encoding ---------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Token ids of `text`.

        add_bos: put the BOS id first (None: the file's tokenizer.ggml.add_bos_token).
        special: match control tokens written in the text (`<|im_start|>`) as their single
        ids; when False they are plain text. User-defined tokens are matched either way.
        """
        if not isinstance(text, str):
            raise TypeError(f"tokenize() takes a str, not {type(text).__name__}")
        if add_bos is not None and not isinstance(add_bos, bool):
            raise TypeError(f"add_bos must be True, False or None (the file's choice), not {add_bos!r}")
        if add_bos is None:
            add_bos = self.add_bos
        out: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos=True, but this vocabulary has no BOS token")
            out.append(self.bos_id)
        specials = self._special_all if special else self._special_user
        try:
            self._encode_into(text, specials, out)
        except UnicodeEncodeError:
            raise _surrogate_error(text) from None
        return out

    def _encode_into(self, text: str, specials: list[tuple[str, int]], out: list[int]) -> None:
        encode = self._encoder.encode
        if not text:
            return  # no fragment, so no space prefix either (llama.cpp: "" has no tokens)
        if self.add_space_prefix:
            prev_special = True  # llama.cpp: the first fragment, and each after a token, gets a space
            for piece in _partition(text, specials) if specials else [text]:
                if isinstance(piece, int):
                    out.append(piece)
                    prev_special = True
                else:
                    encode(" " + piece if prev_special else piece, out)
                    prev_special = False
        elif specials:
            for piece in _partition(text, specials):
                if isinstance(piece, int):
                    out.append(piece)
                else:
                    encode(piece, out)
        else:
            encode(text, out)

    # -- decoding ---------------------------------------------------------------------------

    def detokenize(self, ids: Iterable[int], special: bool = True) -> bytes:
        """The bytes of these tokens, concatenated: tokenize(s) decodes back to s exactly
        (for any s without bytes in `missing_bytes`).

        special=False drops control tokens (`<|im_end|>`) instead of writing their text.
        The bytes may end inside a UTF-8 character; use decoder() to stream text.
        """
        pieces = self._pieces if special else self._pieces_plain
        if isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, Iterable):
            raise TypeError(f"token ids must be a sequence of ints, not {type(ids).__name__}")
        if not isinstance(ids, list):
            ids = list(ids)
        try:
            if ids and (min(ids) < 0 or max(ids) >= len(pieces)):
                bad = next(i for i in ids if not 0 <= i < len(pieces))
                _check_id(bad, len(pieces))
            return b"".join([pieces[i] for i in ids])
        except TypeError:  # diagnosed here, off the common path
            bad = next(((p, i) for p, i in enumerate(ids) if not hasattr(i, "__index__")), None)
            if bad is None:
                raise
            raise TypeError(f"token ids must be ints: item {bad[0]} is {bad[1]!r} ({type(bad[1]).__name__})") from None

    def decoder(self, special: bool = True) -> StreamDecoder:
        """An incremental decoder: feed it ids, get text at complete characters only."""
        return StreamDecoder(self._pieces if special else self._pieces_plain)

    def clear_cache(self) -> None:
        """Forget the cached ids of words seen so far (memory, or a cold-start benchmark)."""
        if self._bpe is not None:
            self._bpe.clear_cache()

    def token_text(self, token_id: int) -> str:
        """A token as stored in the vocabulary (byte-level characters, e.g. 'Ġworld', or
        SentencePiece's space marks, '\u2581world')."""
        return self._tokens[_check_id(token_id, self.vocab_size)]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (a control token's text)."""
        return self._pieces[_check_id(token_id, self.vocab_size)]

    def is_control(self, token_id: int) -> bool:
        """True for control tokens (BOS, EOS, <|im_start|>, ...)."""
        return self._types[_check_id(token_id, self.vocab_size)] == CONTROL

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self.model}/{self.pre_name}, vocab_size={self.vocab_size}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id}, eot_ids={sorted(self.eot_ids)})"
        )


def _partition(text: str, specials: list[tuple[str, int]]) -> list[str | int]:
    """Cut `text` at special-token texts, longest token first over the whole text (the
    order llama.cpp uses), into plain-text fragments (str) and token ids (int)."""
    frags: list[str | int] = [text]
    for tok_text, tok_id in specials:
        if tok_text not in text:
            continue
        new: list[str | int] = []
        for f in frags:
            if isinstance(f, int) or tok_text not in f:
                new.append(f)
                continue
            for j, part in enumerate(f.split(tok_text)):
                if j:
                    new.append(tok_id)
                if part:
                    new.append(part)
        frags = new
    return frags
