"""Fuzz harness: GGUFReader on arbitrary bytes, then what is built on a file it accepts (tensor
views, NumPy dequantization, the architecture description, `info`, the tokenizer and chat
template from the metadata). A malformed file may only raise the errors that name the problem
(GGUFError, UnsupportedModelError, ChatTemplateError, the tokenizer's ValueError/TypeError);
anything else, a crash or a hang is a finding."""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings

from common import fuzz

import pyinfer.arch.base
import pyinfer.arch.llama
import pyinfer.gguf
import pyinfer.info
import pyinfer.quants
from pyinfer.arch import UnsupportedModelError, describe
from pyinfer.chat import ChatTemplate
from pyinfer.errors import ChatTemplateError, GGUFError
from pyinfer.gguf import GGUFReader
from pyinfer.info import model_info
from pyinfer.tokenizer import Tokenizer

_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
_PATH = os.path.join(tempfile.mkdtemp(prefix="pyinfer-fuzz-", dir=_DIR), "input.gguf")
MAX_DEQUANT_BYTES = 1 << 16  # dequantize small tensors only: the harness measures parsing, not NumPy
# Fuzzed scales are NaN and inf as often as not: data, not findings.
warnings.simplefilter("ignore", RuntimeWarning)


def test_one_input(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(data)
    try:
        reader = GGUFReader(_PATH)
    except GGUFError as e:
        assert str(e).startswith(_PATH), e  # every message names the file
        return
    with reader:
        for name, t in reader.tensors.items():
            view = reader.tensor(name)
            assert view.nbytes == t.nbytes and t.offset + t.nbytes <= reader.file_size
            if t.nbytes <= MAX_DEQUANT_BYTES:
                try:
                    values = reader.dequantize(name)
                except NotImplementedError:
                    pass  # a type the NumPy path does not dequantize (named in the message)
                else:
                    assert values.size == t.n_elements
            del view
        try:
            describe(reader)
            model_info(reader)
        except UnsupportedModelError:
            pass
        if "tokenizer.ggml.model" in reader.metadata:
            with contextlib.suppress(ValueError, TypeError):
                Tokenizer(reader.metadata)
        if "tokenizer.chat_template" in reader.metadata:
            with contextlib.suppress(ChatTemplateError):
                ChatTemplate.from_metadata(reader.metadata)


if __name__ == "__main__":
    fuzz(test_one_input, [pyinfer.gguf, pyinfer.quants, pyinfer.arch.base, pyinfer.arch.llama, pyinfer.info])
