"""RMSNorm, RoPE, SwiGLU, add, softmax and embedding lookup on every ISA path, against NumPy.

References (pyinfer/reference.py) compute in float64. Bounds are relative, derived from
float32's epsilon and the length of each sum: add, RoPE and embedding lookup are exact specs
(RoPE and add match the scalar path bit for bit; lookups match dequantization exactly).
"""

from __future__ import annotations

import numpy as np
import pytest

from pyinfer import _C
from pyinfer import reference as R
from pyinfer.gguf_types import TYPE_TRAITS, GGMLType
from pyinfer.quants import dequantize, quantize

EPS = float(np.finfo(np.float32).eps)  # 2^-23: two units of float32 roundoff
F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 8, 12, 14, 30

# Sizes around the 8- and 16-float vector widths and the default model's widths.
SIZES = [1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 576, 1027]


def rng_for(*key: int) -> np.random.Generator:
    return np.random.default_rng([1234, *key])


# ---- RMSNorm ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_rms_norm(isa: str, n: int) -> None:
    rng = rng_for(1, n)
    x = (rng.standard_normal((3, n)) * rng.uniform(0.01, 100, (3, 1))).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    y = _C.rms_norm(x, w, 1e-5)
    ref = R.rms_norm(x, w, 1e-5)
    # Sum of n squares (each rounded, then summed): relative error <= (n + 1) u of the mean
    # square, half of it through the sqrt, plus a few roundings (divide, add eps, sqrt, 1/x, two
    # products). eps = 2u.
    bound = (n / 2 + 6) * EPS * np.abs(ref)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.all(np.abs(y - ref) <= bound)


def test_rms_norm_in_place_and_out(isa: str) -> None:
    rng = rng_for(2)
    x = rng.standard_normal((4, 37)).astype(np.float32)
    w = rng.standard_normal(37).astype(np.float32)
    expect = _C.rms_norm(x, w, 1e-6)
    out = np.empty_like(x)
    assert _C.rms_norm(x, w, 1e-6, out=out) is out
    np.testing.assert_array_equal(out, expect)
    _C.rms_norm(x, w, 1e-6, out=x)
    np.testing.assert_array_equal(x, expect)
    # 1-D and 3-D inputs normalise along the last axis.
    x3 = rng.standard_normal((2, 3, 37)).astype(np.float32)
    np.testing.assert_array_equal(
        _C.rms_norm(x3, w, 1e-6)[1, 2], _C.rms_norm(x3[1, 2].copy(), w, 1e-6)
    )


def test_rms_norm_errors() -> None:
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="float32"):
        _C.rms_norm(x.astype(np.float64), np.ones(8, np.float32), 1e-5)
    with pytest.raises(ValueError, match="shape"):
        _C.rms_norm(x, np.ones(7, np.float32), 1e-5)
    with pytest.raises(ValueError, match="C-contiguous"):
        _C.rms_norm(np.ones((8, 2), np.float32).T, np.ones(8, np.float32), 1e-5)
    with pytest.raises(ValueError, match="out"):
        _C.rms_norm(x, np.ones(8, np.float32), 1e-5, out=np.empty((2, 9), np.float32))


# ---- RoPE -------------------------------------------------------------------------------------

ROPE_SHAPES = [(9, 64), (3, 64), (1, 2), (2, 6), (3, 18), (1, 34), (2, 128), (1, 256)]
ROPE_POS = [0, 1, 17, 4095, 100000]


def rope_bound(x: np.ndarray, n_heads: int, head_dim: int, neox: bool) -> np.ndarray:
    """Per element: 4 eps (|a| + |b|) of its pair (a, b): cos and sin rounded once each, two
    products and a sum, all on terms no larger than |a| + |b|."""
    h = np.abs(x.astype(np.float64)).reshape(x.shape[0], n_heads, head_dim)
    if neox:
        s = h[..., : head_dim // 2] + h[..., head_dim // 2 :]
        per = np.concatenate([s, s], axis=-1)
    else:
        s = h[..., 0::2] + h[..., 1::2]
        per = np.repeat(s, 2, axis=-1)
    return 4 * EPS * per.reshape(x.shape)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_heads,head_dim", ROPE_SHAPES)
def test_rope(isa: str, n_heads: int, head_dim: int, neox: bool) -> None:
    base = 100000.0
    for pos in ROPE_POS:
        rng = rng_for(3, n_heads, head_dim, pos)
        x = rng.standard_normal((5, n_heads * head_dim)).astype(np.float32)
        y = x.copy()
        assert _C.rope(y, pos, n_heads, head_dim, base, neox) is y
        ref = R.rope(x, pos, n_heads, head_dim, base, neox)
        assert np.all(np.abs(y - ref) <= rope_bound(x, n_heads, head_dim, neox)), pos
        # Every ISA path computes the same float32 operations in the same order.
        _C.set_isa("scalar")
        y0 = _C.rope(x.copy(), pos, n_heads, head_dim, base, neox)
        _C.set_isa(isa)
        np.testing.assert_array_equal(y, y0)


def test_rope_position_array_and_1d(isa: str) -> None:
    rng = rng_for(4)
    x = rng.standard_normal((4, 3 * 64)).astype(np.float32)
    pos = np.array([5, 0, 1000, 3], np.int32)
    y = _C.rope(x.copy(), pos, 3, 64, 10000.0)
    for t in range(4):
        row = _C.rope(x[t].copy(), int(pos[t]), 3, 64, 10000.0)
        np.testing.assert_array_equal(y[t], row)
    assert np.all(np.abs(y - R.rope(x, pos, 3, 64, 10000.0)) <= rope_bound(x, 3, 64, False))


def test_rope_position_zero_is_identity(isa: str) -> None:
    x = rng_for(5).standard_normal((1, 2 * 34)).astype(np.float32)
    np.testing.assert_array_equal(_C.rope(x.copy(), 0, 2, 34, 10000.0), x)


def test_rope_errors() -> None:
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(ValueError, match="head_dim"):
        _C.rope(x, 0, 1, 63, 1e4)
    with pytest.raises(ValueError, match="shape"):
        _C.rope(x, 0, 2, 64, 1e4)
    with pytest.raises(ValueError, match="pos"):
        _C.rope(x, np.array([1, 2, 3]), 1, 64, 1e4)
    with pytest.raises(ValueError, match=">= 0"):
        _C.rope(x, -1, 1, 64, 1e4)
    with pytest.raises(ValueError, match="writeable"):
        ro = x.copy()
        ro.setflags(write=False)
        _C.rope(ro, 0, 1, 64, 1e4)


# ---- SwiGLU, add, softmax ----------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_swiglu(isa: str, n: int) -> None:
    rng = rng_for(6, n)
    gate = (rng.standard_normal(n) * 8).astype(np.float32)
    up = rng.standard_normal(n).astype(np.float32)
    y = _C.swiglu(gate, up)
    ref = R.swiglu(gate, up)
    # exp to a few ulp (polynomial on the SIMD paths), then 1 + e, a divide and a product:
    # each relative, and 1/(1 + e) inherits at most e's relative error.
    assert np.all(np.abs(y - ref) <= 8 * EPS * np.abs(ref))


def test_swiglu_extremes(isa: str) -> None:
    gate = np.array([-1000, -200, -100, -88, 0, 88, 100, 200, 1000, -0.0], np.float32)
    up = np.full_like(gate, 2.0)
    y = _C.swiglu(gate, up)
    assert np.all(np.isfinite(y))
    big = gate > 50
    np.testing.assert_allclose(y[big], 2 * gate[big], rtol=2 * EPS)
    # silu(g) for g <= -88 is below 1e-36 in magnitude; computed values must be as small.
    assert np.all(np.abs(y[gate < -50]) <= 1e-30)
    assert y[4] == 0 and y[9] == 0


def test_swiglu_in_place(isa: str) -> None:
    rng = rng_for(7)
    g = rng.standard_normal((3, 21)).astype(np.float32)
    u = rng.standard_normal((3, 21)).astype(np.float32)
    expect = _C.swiglu(g, u)
    _C.swiglu(g, u, out=g)
    np.testing.assert_array_equal(g, expect)
    with pytest.raises(ValueError, match="shape"):
        _C.swiglu(g, u[:, :20].copy())


@pytest.mark.parametrize("n", SIZES)
def test_geglu(isa: str, n: int) -> None:
    """GeGLU on this path against the scalar spec (the same float32 u, exp a polynomial here:
    swiglu's bound) and against float64's tanh form of GELU (u's own float32 rounding enters
    through exp, most where the gate is large and negative and the result tiny)."""
    rng = rng_for(16, n)
    gate = (rng.standard_normal(n) * 4).astype(np.float32)
    up = rng.standard_normal(n).astype(np.float32)
    y = _C.geglu(gate, up)
    was = _C.get_isa()
    _C.set_isa("scalar")
    try:
        spec = _C.geglu(gate, up)
    finally:
        _C.set_isa(was)
    assert np.all(np.abs(y - spec) <= 8 * EPS * np.abs(spec))
    ref = R.geglu(gate, up)
    g = gate.astype(np.float64)
    z = 2 * np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)  # exp's argument: its rounding, times |z|
    assert np.all(np.abs(y - ref) <= (16 + 4 * np.abs(z)) * EPS * np.abs(ref) + 1e-30)


def test_geglu_extremes(isa: str) -> None:
    gate = np.array([-1e20, -1000, -20, -10, 0, 10, 20, 1000, 1e20, -0.0, np.nan], np.float32)
    up = np.full_like(gate, 2.0)
    y = _C.geglu(gate, up)
    assert np.all(np.isfinite(y[:-1])) and np.isnan(y[-1])
    big = (gate >= 10) & np.isfinite(gate)
    np.testing.assert_allclose(y[big], 2 * gate[big], rtol=2 * EPS)
    assert np.all(np.abs(y[(gate <= -10)]) <= 1e-30)  # gelu(-10) is about -1e-37
    assert y[4] == 0 and y[9] == 0


@pytest.mark.parametrize("n", SIZES)
def test_add_exact(isa: str, n: int) -> None:
    rng = rng_for(8, n)
    a = rng.standard_normal((2, n)).astype(np.float32)
    b = (rng.standard_normal((2, n)) * 1e3).astype(np.float32)
    expect = R.add(a, b)
    np.testing.assert_array_equal(_C.add(a, b), expect)
    _C.add(a, b, out=a)
    np.testing.assert_array_equal(a, expect)
    with pytest.raises(ValueError, match="float32"):
        _C.add(a.astype(np.float16), b)


@pytest.mark.parametrize("n", SIZES)
def test_softmax(isa: str, n: int) -> None:
    rng = rng_for(9, n)
    x = (rng.standard_normal((3, n)) * 5).astype(np.float32)
    y = _C.softmax(x)
    ref = R.softmax(x)
    # exp(x - max): the subtraction's rounding is u |x - max| relative in each term; the sum of
    # n terms adds n u; exp itself, the reciprocal and the product a few u.
    spread = np.max(x, axis=-1, keepdims=True) - np.min(x, axis=-1, keepdims=True)
    bound = EPS * (spread + n + 8) * ref
    assert np.all(np.abs(y - ref) <= bound)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=(n + 8) * EPS)


def test_softmax_masked_and_large(isa: str) -> None:
    x = np.array([[0.0, -np.inf, 1.0, -np.inf, 2.0, 3.0, -np.inf, 4.0, 5.0, 1e4]], np.float32)
    y = _C.softmax(x)
    assert np.all(y[np.isinf(x)] == 0)
    assert y[0, -1] == 1.0  # every other term underflows against 1e4
    out = x.copy()
    _C.softmax(out, out=out)
    np.testing.assert_array_equal(out, y)


# ---- embedding lookup ---------------------------------------------------------------------------


# Every type with a dequantization kernel: the lookup takes each.
EMBEDDING_TYPES = [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K]


@pytest.mark.parametrize("qtype", EMBEDDING_TYPES, ids=lambda t: GGMLType(t).name)
def test_embedding_exact(isa: str, qtype: int) -> None:
    rng = rng_for(10, qtype)
    block = TYPE_TRAITS[GGMLType(qtype)].block_elems
    n_rows, dim = 50, 37 if block == 1 else 3 * block
    if qtype in (F32, F16):  # typed arrays, not only raw bytes
        table = rng.standard_normal((n_rows, dim)).astype(np.float32 if qtype == F32 else np.float16)
    else:
        table = quantize(rng.standard_normal((n_rows, dim)).astype(np.float32), qtype).reshape(n_rows, -1)
    dense = dequantize(table.reshape(-1).view(np.uint8), qtype).reshape(n_rows, dim)
    ids = np.array([0, 49, 7, 7, 13], np.int64)
    np.testing.assert_array_equal(_C.embedding(table, qtype, ids, dim), R.embedding(dense, ids))
    out = np.empty((2, dim), np.float32)
    assert _C.embedding(table, qtype, [3, 4], dim, out=out) is out
    np.testing.assert_array_equal(out, dense[[3, 4]])
    assert _C.embedding(table, qtype, np.array([], np.int32), dim).shape == (0, dim)


def test_embedding_default_model(default_model, isa: str) -> None:
    from pyinfer.gguf import GGUFReader

    r = GGUFReader(default_model)
    info = r.tensors["token_embd.weight"]
    dim = info.shape[0]
    ids = [0, 1, 2, 1000, 49151, 31]
    rows = _C.embedding(r.raw("token_embd.weight"), int(info.type), ids, dim)
    row_bytes = r.tensor("token_embd.weight").shape[1]
    for i, t in enumerate(ids):
        raw = r.raw("token_embd.weight")[t * row_bytes : (t + 1) * row_bytes]
        np.testing.assert_array_equal(rows[i], dequantize(raw, info.type))


def test_embedding_errors() -> None:
    table = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="outside"):
        _C.embedding(table, F32, [4], 8)
    with pytest.raises(ValueError, match="outside"):
        _C.embedding(table, F32, [-1], 8)
    with pytest.raises(ValueError, match="rows"):
        _C.embedding(table, F32, [0], 7)
    with pytest.raises(ValueError, match="block size"):
        _C.embedding(np.zeros(34, np.uint8), Q8_0, [0], 31)
    with pytest.raises(ValueError, match="block size"):  # Q4_K rows are whole 256-blocks
        _C.embedding(np.zeros(144, np.uint8), Q4_K, [0], 128)
    with pytest.raises(ValueError, match="kernel"):  # Q8_1: known, but no kernel
        _C.embedding(np.zeros(36, np.uint8), 9, [0], 32)
    with pytest.raises(ValueError, match="integers"):
        _C.embedding(table, F32, np.array([0.5]), 8)
