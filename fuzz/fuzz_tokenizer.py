"""Fuzz harness: the tokenizer (the default model's byte-level BPE when it is cached, else a
synthetic byte vocabulary) on arbitrary text and bytes, special tokens on and off, and
detokenize / the stream decoder on arbitrary ids. Invariants: ids are in the vocabulary;
detokenize(tokenize(s)) == s's UTF-8 exactly; the stream decoder's text equals the bytes
decoded at once; a lone surrogate is the one text refused (UnicodeEncodeError naming it); an
id out of range is a ValueError naming it."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris
from common import fuzz

import pyinfer._bpe
import pyinfer.tokenizer
from pyinfer.gguf import GGUFReader
from pyinfer.registry import ModelNotFoundError, resolve_model
from pyinfer.tokenizer import Tokenizer


def _tokenizer() -> Tokenizer:
    try:
        path = resolve_model(None, download=False)
    except ModelNotFoundError:
        from pyinfer.bench.synthetic import write_synthetic_llama

        path = write_synthetic_llama(Path(tempfile.mkdtemp()) / "tiny.gguf", "tiny")
    with GGUFReader(path) as r:
        tok = Tokenizer(r.metadata)
    print(f"INFO: fuzzing {tok!r} from {path}", file=sys.stderr)
    return tok


TOK = _tokenizer()
N = TOK.vocab_size


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    special = fdp.ConsumeBool()
    mode = fdp.ConsumeIntInRange(0, 2)
    if mode == 2:  # ids, some out of range
        ids = fdp.ConsumeIntListInRange(fdp.ConsumeIntInRange(0, 64), -2, N + 1)
        try:
            out = TOK.detokenize(ids, special=special)
        except ValueError as e:
            bad = next(i for i in ids if not 0 <= i < N)
            assert f"token id {bad} " in str(e), e
            return
        dec = TOK.decoder(special=special)
        streamed = "".join(dec.feed(i) for i in ids) + dec.flush()
        assert streamed == out.decode("utf-8", errors="replace"), (ids, streamed)
        return
    if mode == 0:
        text = fdp.ConsumeUnicode(fdp.remaining_bytes())  # any code points, surrogates included
    else:
        text = fdp.ConsumeBytes(fdp.remaining_bytes()).decode("utf-8", errors="replace")
    try:
        ids = TOK.tokenize(text, add_bos=False, special=special)
    except UnicodeEncodeError as e:
        assert _has_surrogate(text) and 0xD800 <= ord(text[e.start]) <= 0xDFFF, (text, e)
        return
    assert not _has_surrogate(text)
    assert all(0 <= i < N for i in ids)
    raw = text.encode("utf-8")
    if not TOK.missing_bytes.intersection(raw):
        assert TOK.detokenize(ids) == raw, (text, ids)


if __name__ == "__main__":
    fuzz(test_one_input, [pyinfer.tokenizer, pyinfer._bpe])
