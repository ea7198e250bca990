"""Sizes computed from parameters or file metadata never wrap: each product that would pass
64 bits is a ValueError naming the quantity and its factors, raised before anything is
allocated (these calls crashed with SIGSEGV or SIGFPE when the products wrapped to small
numbers that passed the size checks), and the process goes on working after them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pyinfer import _C, Model
from pyinfer.gguf_types import GGMLType

Q8_0, Q4_0, F32 = int(GGMLType.Q8_0), int(GGMLType.Q4_0), int(GGMLType.F32)
EMPTY = np.zeros(0, np.uint8)


@pytest.fixture(scope="module")
def model(default_model: Path) -> Model:
    return Model.load(default_model, n_threads=2)


KERNEL_CASES = [
    # (name, call, the quantity the message must name, a factor it must show)
    ("repack: n * k wraps to 0 bytes", lambda: _C.repack(EMPTY, Q8_0, 2**23, 2**45), "packed weight bytes", "8388608"),
    ("repack: n rounds past int64", lambda: _C.repack(EMPTY, Q4_0, 2**63 - 1, 32), "rows rounded up to 16-row groups",
     str(2**63 - 1)),
    ("unpack: n * k", lambda: _C.unpack(EMPTY, Q8_0, 2**40, 2**40), "packed weight bytes", str(2**40)),
    ("embedding: F32 row of 2**62", lambda: _C.embedding(np.ones(4, np.float32), F32, [0], 2**62),
     "an embedding row's bytes", str(2**62)),
    ("dequantize: n near 2**63", lambda: _C.dequantize(Q8_0, EMPTY, (2**63 - 1) // 32 * 32), "bytes of n elements",
     "* 34"),
    ("matmul: n * row bytes", lambda: _C.matmul(np.zeros((1, 32), np.float32), EMPTY, Q8_0, 2**62, 32),
     "weight bytes (n * row bytes)", str(2**62)),
    ("matmul: an F32 row of 2**62", lambda: _C.matmul(np.zeros((1, 32), np.float32), EMPTY, F32, 1, 2**62),
     "a weight row's bytes", str(2**62)),
    ("KVCache: every factor 2**20", lambda: _C.KVCache(2**20, 2**20, 2**20, 2**20), "KV cache bytes of V",
     "1048576 * 1048576"),
    ("KVCache: n_ctx 2**62", lambda: _C.KVCache(1, 1, 2, 2**62), "KV cache bytes of V", str(2**62)),
    ("KVCache: n_ctx at int64's end", lambda: _C.KVCache(1, 1, 1, 2**63 - 1), "KV cache", str(2**63 - 1)),
    ("Model: tensor of 2**40 x 2**40 Q8_0 in 0 bytes",
     lambda: _C.Model("llama", {}, {"blk.0.attn_q.weight": (EMPTY, Q8_0, 2**40, 2**40)}),
     "blk.0.attn_q.weight bytes", str(2**40)),
    ("Model: metadata dimensions whose product wraps",
     lambda: _C.Model("llama", {"n_layer": 1, "n_embd": 10**12, "n_head": 1, "n_head_kv": 1, "head_dim": 2,
                                "n_ff": 1, "n_vocab": 10**12, "rms_eps": 1e-5, "rope_base": 1e4}, {}),
     "embedding elements (n_vocab * n_embd)", str(10**12)),
]


@pytest.mark.parametrize(("call", "what", "factor"), [c[1:] for c in KERNEL_CASES], ids=[c[0] for c in KERNEL_CASES])
def test_a_wrapping_size_is_refused_naming_the_quantity(call, what: str, factor: str) -> None:
    with pytest.raises(ValueError, match="overflows 64 bits") as info:
        call()
    assert what in str(info.value) and factor in str(info.value), str(info.value)


def test_native_sequences_and_batches_check_their_sizes(model: Model) -> None:
    native = model._native
    with pytest.raises(ValueError, match=re.escape("KV cache bytes of V") + ".*overflows 64 bits"):
        _C.Sequence(native, 2**62, 1)
    # The cache fits; the scratch for 2**58 rows would not.
    with pytest.raises(ValueError, match=r"scratch rows \* n_embd overflows 64 bits: 288230376151711744 \* 576"):
        _C.Sequence(native, 16, 2**58)
    with pytest.raises(ValueError, match=r"scratch rows .* overflows 64 bits"):
        _C.Batch(native, 2**60)
    with pytest.raises(ValueError, match=r"n_batch must be >= 1"):
        _C.Sequence(native, 16, 0)
    with pytest.raises(ValueError, match=r"KVCache needs .* n_ctx >= 1"):
        _C.Sequence(native, -(2**62), 1)


def test_the_python_layer_refuses_token_counts_past_32_bits(model: Model) -> None:
    with pytest.raises(ValueError, match=r"n_ctx must be in \[1, 2147483647\], got 4611686018427387904"):
        model.context(n_ctx=2**62)
    with pytest.raises(ValueError, match=r"n_batch must be in \[1, 2147483647\], got 18446744073709551616"):
        model.context(n_ctx=16, n_batch=2**64)


def _answers(model: Model) -> list[np.ndarray]:
    w = (np.arange(64 * 34, dtype=np.uint8).reshape(64, 34) % 50).astype(np.uint8)
    w[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    packed = _C.repack(w.reshape(-1), Q8_0, 64, 32)
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    ids = model.tokenize("The capital of France is")
    return [packed, _C.unpack(packed, Q8_0, 64, 32), _C.matmul(x, packed, Q8_0, 64, 32, packed=True),
            _C.matmul(x, w, Q8_0, 64, 32), model.context(n_ctx=16).eval(ids).copy()]


def test_after_the_refusals_everything_still_computes(model: Model) -> None:
    before = _answers(model)
    for call, _, _ in [c[1:] for c in KERNEL_CASES]:
        with pytest.raises(ValueError):
            call()
    for got, want in zip(_answers(model), before):
        np.testing.assert_array_equal(got, want)


def test_a_refused_allocation_names_its_bytes_and_purpose() -> None:
    # 2**36 positions of 64 float32 keys: 16 TiB, in range of int64, past any machine's memory.
    with pytest.raises(MemoryError, match=r"cannot allocate 17592186044416 bytes for the KV cache's keys"):
        _C.KVCache(1, 1, 64, 2**36, "float32")
    cache = _C.KVCache(1, 1, 64, 16, "float32")  # and the next one is made as before
    assert cache.nbytes > 0


def test_counts_past_32_bits_and_windows_past_the_text(model: Model) -> None:
    ctx = model.context(n_ctx=16)
    ctx.eval([1, 2, 3])
    with pytest.raises(ValueError, match=r"n must be an integer in \[0, 2147483647\], got 18446744073709551616"):
        ctx.copy_prefix(ctx, 2**64)
    text = "The quick brown fox jumps over the lazy dog. " * 4
    # A window longer than the text takes the room of the text, not of the window.
    assert model.perplexity(text, window=10**9) == model.perplexity(text, window=len(model.tokenize(text)))
