"""KV cache append (exact, float32 and float16) and causal grouped-query attention on every ISA
path, against NumPy (pyinfer/reference.py, float64) with bounds derived from float32's epsilon."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from pyinfer import _C
from pyinfer import reference as R

EPS = float(np.finfo(np.float32).eps)
DTYPES = ["float32", "float16"]
ALL_DTYPES = [*DTYPES, "q8_0"]  # q8_0: head_dim a multiple of 32


def rng_for(*key: int) -> np.random.Generator:
    return np.random.default_rng([4321, *key])


def rows(rng: np.random.Generator, m: int, width: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal((m, width)) * scale).astype(np.float32)


# ---- KV cache -----------------------------------------------------------------------------------


def heads_major(x: np.ndarray, n_head_kv: int, head_dim: int) -> np.ndarray:
    """[M, n_head_kv * head_dim] -> [n_head_kv, M, head_dim], as keys() and values() return."""
    return x.reshape(x.shape[0], n_head_kv, head_dim).transpose(1, 0, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_head_kv,head_dim", [(3, 64), (1, 17), (2, 40)])
def test_append_exact(isa: str, dtype: str, n_head_kv: int, head_dim: int) -> None:
    rng = rng_for(1, n_head_kv, head_dim)
    n_ctx = 23
    c = _C.KVCache(4, n_head_kv, head_dim, n_ctx, dtype)
    assert c.dtype == np.dtype(dtype) and c.n_ctx == n_ctx and c.head_dim == head_dim
    assert c.nbytes == 2 * 4 * n_head_kv * head_dim * n_ctx * np.dtype(dtype).itemsize
    width = n_head_kv * head_dim
    k1, v1 = rows(rng, 5, width), rows(rng, 5, width, 100.0)
    k2, v2 = rows(rng, 1, width, 1e-3), rows(rng, 1, width)
    k3, v3 = rows(rng, n_ctx - 6, width), rows(rng, n_ctx - 6, width)
    c.append(2, k1, v1, 0)
    c.append(2, k2[0], v2[0], 5)  # one position as a 1-D row
    c.append(2, k3, v3, 6)
    assert c.n_pos(2) == n_ctx and c.n_pos(0) == 0
    k_all = np.concatenate([k1, k2, k3]).astype(dtype)
    v_all = np.concatenate([v1, v2, v3]).astype(dtype)
    # float32: copied as is; float16: rounded to nearest even exactly as NumPy does.
    np.testing.assert_array_equal(c.keys(2), heads_major(k_all, n_head_kv, head_dim))
    np.testing.assert_array_equal(c.values(2), heads_major(v_all, n_head_kv, head_dim))
    assert not np.any(c.keys(1)) and not c.keys(2).flags.writeable
    # Overwriting from an earlier position drops what followed it.
    c.append(2, k1[:2], v1[:2], 3)
    assert c.n_pos(2) == 5
    kept = np.concatenate([k_all[:3], k1[:2].astype(dtype)])
    np.testing.assert_array_equal(c.keys(2)[:, :5], heads_major(kept, n_head_kv, head_dim))
    c.clear()
    assert c.n_pos(2) == 0


_DIRTY_HEAP_CHECK = """
import ctypes
import numpy as np
from pyinfer import _C

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
block = libc.malloc(8 << 20)
dirty = ctypes.string_at(block, 64)
libc.free(ctypes.c_void_p(block))
assert any(dirty), "the allocator handed out zeroed memory: the check below would prove nothing"
shape = (4, 2, 64, 4096)
rng = np.random.default_rng(9)
for dtype in ("float32", "float16"):
    for round_ in range(3):
        c = _C.KVCache(*shape, dtype)
        for layer in range(shape[0]):
            assert not np.any(c.keys(layer)) and not np.any(c.values(layer)), (dtype, round_, layer)
        rows = rng.standard_normal((shape[3], shape[1] * shape[2])).astype(np.float32)
        for layer in range(shape[0]):
            c.append(layer, rows, rows, 0)
        assert np.all(c.values(shape[0] - 1) != 0)
        del c
"""


def test_large_cache_reads_zero_until_written() -> None:
    # Keys and values of a few MiB take the huge-page allocation, which hands its block back to
    # the system so that it reads as zero. Checked where the allocator gives out dirty memory:
    # glibc's tunables take blocks up to 32 MiB from the heap and fill each with a pattern (under
    # AddressSanitizer, its own allocator fills them), so a block not handed back would show it,
    # first on a fresh cache and again on one that reuses a freed cache's memory.
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.perturb=165:glibc.malloc.mmap_threshold=33554432")
    r = subprocess.run([sys.executable, "-c", _DIRTY_HEAP_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("dtype", DTYPES)
def test_append_in_pieces(isa: str, dtype: str) -> None:
    """Keys appended in pieces (key blocks of 16 positions filled across appends, written into
    from inside after they filled) read back, and attend, exactly as when appended at once."""
    rng = rng_for(12)
    n_head_kv, hd, n, n_head = 2, 24, 45, 6
    width = n_head_kv * hd
    k, v, junk = rows(rng, n, width), rows(rng, n, width), rows(rng, 20, width)
    whole = _C.KVCache(1, n_head_kv, hd, 48, dtype)
    whole.append(0, k, v, 0)
    c = _C.KVCache(1, n_head_kv, hd, 48, dtype)
    pos = 0
    for m in [1, 6, 13, 3, 19]:
        c.append(0, k[pos : pos + m], v[pos : pos + m], pos)
        pos += m
    c.append(0, junk[:5], junk[:5], 20)  # into the filled block 16..31, which becomes partial
    c.append(0, junk[5:], junk[5:], 25)  # and fills again
    c.append(0, k[20:], v[20:], 20)
    assert c.n_pos(0) == n
    np.testing.assert_array_equal(c.keys(0)[:, :n], whole.keys(0)[:, :n])
    np.testing.assert_array_equal(c.values(0)[:, :n], whole.values(0)[:, :n])
    q = rows(rng, 9, n_head * hd)
    for window in (0, 11):
        np.testing.assert_array_equal(
            _C.attention(q, c, 0, n - 9, n_head, window=window),
            _C.attention(q, whole, 0, n - 9, n_head, window=window),
        )


def test_append_f16_rounding(isa: str) -> None:
    """Round-to-nearest-even at every exponent, ties, subnormals, overflow, infinities, NaN."""
    rng = rng_for(2)
    n = 64 * 1000
    exp = rng.integers(127 - 30, 127 + 17, n).astype(np.uint32)
    man = rng.integers(0, 1 << 23, n).astype(np.uint32)
    # A quarter of the values sit exactly on a rounding tie or one ulp beside one.
    tie = (man & ~np.uint32(0x1FFF)) | np.uint32(0x1000)
    man = np.where(rng.integers(0, 4, n) == 0, tie + rng.integers(-1, 2, n).astype(np.uint32), man)
    sign = rng.integers(0, 2, n).astype(np.uint32) << 31
    x = (sign | (exp << 23) | (man & 0x7FFFFF)).view(np.float32)
    special = np.array(
        [
            0.0,
            -0.0,
            65504,
            65519.99,
            65520,
            -65520,
            1e10,
            np.inf,
            -np.inf,
            2.0**-24,
            2.0**-25,
            2.0**-25 * 1.0001,
            3 * 2.0**-26,
            2.0**-14 - 2.0**-26,
            6.1e-5,
            1e-30,
        ],
        np.float32,
    )
    x[: special.size] = special
    x[-3:] = np.nan
    c = _C.KVCache(1, 1, 64, 1000, np.float16)
    c.append(0, x.reshape(1000, 64), x.reshape(1000, 64), 0)
    got = c.keys(0)[0].reshape(-1)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(got[finite].view(np.uint16), want[finite].view(np.uint16))
    assert np.all(np.isnan(got[~finite]))
    _C.set_isa("scalar")
    c2 = _C.KVCache(1, 1, 64, 1000, "float16")
    c2.append(0, x.reshape(1000, 64), x.reshape(1000, 64), 0)
    _C.set_isa(isa)
    np.testing.assert_array_equal(c2.keys(0).view(np.uint16), c.keys(0).view(np.uint16))


def q8_0_reference(x: np.ndarray) -> np.ndarray:
    """What a q8_0 cache holds for float32 rows x[..., head_dim], as float32: per 32 elements
    s = max |x| / 127 and round(x * (1 / s)) (to nearest even), times s; NaN where the 32 hold a
    NaN or an infinity."""
    c = x.reshape(*x.shape[:-1], -1, 32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        d = (np.abs(c).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
        bad = ~np.isfinite(c).all(axis=-1, keepdims=True)
        inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
        q = np.clip(np.rint((c * inv).astype(np.float32)), -127, 127)
        out = np.where(bad, np.float32(np.nan), q.astype(np.float32) * d)
    return out.astype(np.float32).reshape(x.shape)


@pytest.mark.parametrize("n_head_kv,head_dim", [(3, 64), (1, 32), (2, 256)])
def test_append_q8_0(isa: str, n_head_kv: int, head_dim: int) -> None:
    """A q8_0 cache holds each 32 elements of a row as int8 with one float scale: it reads back
    as exactly those products, within half a step (s / 2) of each element; appends in pieces,
    over a filled key block, and truncations behave as for the float caches."""
    rng = rng_for(13, n_head_kv, head_dim)
    n_ctx = 41
    width = n_head_kv * head_dim
    c = _C.KVCache(2, n_head_kv, head_dim, n_ctx, "q8_0")
    assert c.dtype == "q8_0" and c.head_dim == head_dim
    assert c.nbytes == 2 * 2 * n_head_kv * n_ctx * (head_dim + head_dim // 32 * 4)
    k = rows(rng, n_ctx, width) * rng.uniform(1e-3, 1e3, (n_ctx, 1)).astype(np.float32)
    v = rows(rng, n_ctx, width, 50.0)
    k[3, :32] = 0  # an all-zero chunk: scale 0, reads as zeros
    k[4, 5] = 1e30  # one outlier: its chunk keeps it, the rest of the chunk rounds to 0
    for a, b in [(0, 7), (7, 16), (16, 30), (30, n_ctx)]:
        c.append(1, k[a:b], v[a:b], a)
    want_k, want_v = q8_0_reference(k), q8_0_reference(v)
    np.testing.assert_array_equal(c.keys(1), heads_major(want_k, n_head_kv, head_dim))
    np.testing.assert_array_equal(c.values(1), heads_major(want_v, n_head_kv, head_dim))
    chunk_max = np.abs(k.reshape(n_ctx, -1, 32)).max(axis=-1, keepdims=True)
    assert np.all(np.abs(want_k - k).reshape(n_ctx, -1, 32) <= chunk_max / 127 * (0.5 + 1e-4))
    assert not np.any(want_k[3, :32]) and want_k[4, 5] == pytest.approx(1e30, rel=1e-6)
    # Overwrite from inside the filled block 16..31, then read back what is kept.
    c.append(1, v[:3], k[:3], 20)
    assert c.n_pos(1) == 23
    np.testing.assert_array_equal(c.keys(1)[:, 20:23], heads_major(q8_0_reference(v[:3]), n_head_kv, head_dim))
    np.testing.assert_array_equal(c.keys(1)[:, :20], heads_major(want_k[:20], n_head_kv, head_dim))
    with pytest.raises(ValueError, match="multiple of 32"):
        _C.KVCache(1, 1, 40, 8, "q8_0")
    with pytest.raises(ValueError, match="at most 1024"):  # the query's int16 copy has that room
        _C.KVCache(1, 1, 1056, 8, "q8_0")


def test_q8_0_special_values(isa: str) -> None:
    """A chunk with a NaN or an infinity reads back as NaN, the other chunks of its row as usual."""
    x = rows(rng_for(14), 2, 64)
    x[0, 3], x[1, 40] = np.nan, -np.inf
    c = _C.KVCache(1, 1, 64, 4, "q8_0")
    c.append(0, x, x, 0)
    for got in (c.keys(0)[0, :2], c.values(0)[0, :2]):
        assert np.all(np.isnan(got[0, :32])) and np.all(np.isnan(got[1, 32:]))
        np.testing.assert_array_equal(got[0, 32:], q8_0_reference(x)[0, 32:])
        np.testing.assert_array_equal(got[1, :32], q8_0_reference(x)[1, :32])


def test_cache_errors() -> None:
    c = _C.KVCache(2, 3, 8, 10)
    k = np.zeros((4, 24), np.float32)
    with pytest.raises(ValueError, match="layer"):
        c.append(2, k, k, 0)
    with pytest.raises(ValueError, match="holds 0"):
        c.append(0, k, k, 1)  # a gap
    c.append(0, k, k, 0)
    c.append(0, k, k, 4)
    with pytest.raises(ValueError, match="KV cache full"):
        c.append(0, k, k, 8)
    assert c.n_pos(0) == 8  # the failed append changed nothing
    with pytest.raises(ValueError, match="shape"):
        c.append(1, np.zeros((4, 25), np.float32), k, 0)
    with pytest.raises(ValueError, match="float32"):
        c.append(1, k.astype(np.float64), k, 0)
    with pytest.raises(ValueError, match="same number of rows"):
        c.append(1, k, k[:3], 0)
    with pytest.raises(ValueError, match="float32, float16 or 'q8_0'"):
        _C.KVCache(1, 1, 8, 8, "int8")
    with pytest.raises(ValueError, match="float32, float16 or 'q8_0'"):
        _C.KVCache(1, 1, 8, 8, "q4_0")
    with pytest.raises(ValueError, match=">= 1"):
        _C.KVCache(1, 1, 8, 0)
    with pytest.raises(ValueError, match="layer"):
        c.keys(5)


# ---- attention -----------------------------------------------------------------------------------


def attention_bound(q, k, v, pos: int, n_head: int, scale: float, window: int = 0) -> np.ndarray:
    """Error bound per output element, from float32's epsilon and the problem's magnitudes.

    A score's dot product of head_dim terms errs by at most (head_dim + 2) u S, with
    S = max over keys of scale * sum |q_i k_i|; exp(s - max) then errs relatively by about
    twice that plus a few u (the exp itself, and u |s - max| <= 2 u S from the subtraction);
    the n_kv-term sums of weights and of weighted values add n_kv u each. All of it relative to
    sum_j p_j |v_j|; eps = 2u, and a factor 2 to spare.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    m = q.shape[0]
    n_head_kv, _, hd = k.shape
    group = n_head // n_head_kv
    qh = q.reshape(m, n_head, hd)
    out = np.empty((m, n_head, hd))
    for t in range(m):
        end = pos + t + 1
        start = max(0, end - window) if window > 0 else 0
        for h in range(n_head):
            kk, vv = k[h // group, start:end], v[h // group, start:end]
            s = kk @ qh[t, h] * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            big_s = np.max(np.abs(kk) @ np.abs(qh[t, h])) * scale
            out[t, h] = 2 * EPS * (2 * (hd + 4) * big_s + (end - start) + 8) * (p @ np.abs(vv))
    return out.reshape(m, n_head * hd)


def filled_cache(rng, n_layer, n_head_kv, head_dim, n_ctx, n_fill, dtype, layer, kv_scale=1.0):
    c = _C.KVCache(n_layer, n_head_kv, head_dim, n_ctx, dtype)
    width = n_head_kv * head_dim
    c.append(layer, rows(rng, n_fill, width, kv_scale), rows(rng, n_fill, width), 0)
    return c


def check_attention(c, layer, q, pos, n_head, window=0, n_threads=1):
    scale = np.float32(1.0 / np.sqrt(c.head_dim))
    out = _C.attention(q, c, layer, pos, n_head, window=window, n_threads=n_threads)
    m = q.shape[0]
    k = c.keys(layer)[:, : pos + m]
    v = c.values(layer)[:, : pos + m]
    if c.dtype == "q8_0":  # its scores take the query in int16 per 32 elements, then exact sums
        q = R.query_q16(q)
    ref = R.attention(q, k, v, pos, n_head, float(scale), window)
    bound = attention_bound(q, k, v, pos, n_head, float(scale), window)
    assert out.shape == q.shape and out.dtype == np.float32
    err = np.abs(out - ref)
    assert np.all(err <= bound), float(np.max(err / bound))
    return out


# (n_head, n_head_kv, head_dim): the default model's, shapes off every vector width, and groups
# of query heads the kernels split (7: 4 + 3, 5: 3 + 2) with gemma3's head_dim.
SHAPES = [(9, 3, 64), (4, 1, 17), (6, 2, 40), (2, 2, 80), (3, 1, 8), (7, 1, 256), (10, 2, 24)]
# Every shape in float32 and float16; q8_0 with the head_dims it takes (multiples of 32), and
# groups of 2 (rows in register groups) and 5.
DTYPE_SHAPES = [(d, *shape) for d in DTYPES for shape in SHAPES] + [
    ("q8_0", *shape) for shape in [(9, 3, 64), (7, 1, 256), (4, 2, 32), (10, 2, 96)]
]


@pytest.mark.parametrize("dtype,n_head,n_head_kv,head_dim", DTYPE_SHAPES)
def test_decode(isa: str, dtype: str, n_head: int, n_head_kv: int, head_dim: int) -> None:
    n_ctx = 70
    for pos in [0, 1, 31, n_ctx - 1]:
        rng = rng_for(3, n_head, head_dim, pos)
        c = filled_cache(rng, 2, n_head_kv, head_dim, n_ctx, pos + 1, dtype, 1)
        check_attention(c, 1, rows(rng, 1, n_head * head_dim), pos, n_head)


@pytest.mark.parametrize("dtype,n_head,n_head_kv,head_dim", DTYPE_SHAPES)
def test_prefill(isa: str, dtype: str, n_head: int, n_head_kv: int, head_dim: int) -> None:
    n_ctx, m = 50, 7
    for pos in [0, 20, n_ctx - m]:
        rng = rng_for(4, n_head, head_dim, pos)
        c = filled_cache(rng, 1, n_head_kv, head_dim, n_ctx, pos + m, dtype, 0)
        check_attention(c, 0, rows(rng, m, n_head * head_dim), pos, n_head)


def test_gqa_mapping(isa: str) -> None:
    """Query head h reads KV head h // group: zeroing one KV head's values zeroes exactly the
    outputs of its group of query heads."""
    rng = rng_for(5)
    n_head, n_head_kv, hd = 9, 3, 64
    c = _C.KVCache(1, n_head_kv, hd, 16)
    k = rows(rng, 10, n_head_kv * hd)
    v = rows(rng, 10, n_head_kv * hd)
    v.reshape(10, n_head_kv, hd)[:, 1] = 0
    c.append(0, k, v, 0)
    out = _C.attention(rows(rng, 2, n_head * hd), c, 0, 8, n_head).reshape(2, n_head, hd)
    assert np.all(out[:, 3:6] == 0)
    assert np.all(np.any(out[:, [0, 1, 2, 6, 7, 8]] != 0, axis=-1))


def test_sliding_window(isa: str) -> None:
    rng = rng_for(6)
    c = filled_cache(rng, 1, 2, 32, 40, 40, "float32", 0)
    check_attention(c, 0, rows(rng, 5, 4 * 32), 35, 4, window=8)
    check_attention(c, 0, rows(rng, 3, 4 * 32), 0, 4, window=2)


def test_large_scores_stable(isa: str) -> None:
    """Scores in the thousands: the max-shifted softmax stays finite and accurate."""
    rng = rng_for(7)
    c = filled_cache(rng, 1, 1, 64, 33, 33, "float32", 0, kv_scale=30.0)
    out = check_attention(c, 0, rows(rng, 3, 2 * 64, 30.0), 30, 2)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_threads_identical(isa: str, dtype: str) -> None:
    rng = rng_for(8)
    c = filled_cache(rng, 1, 3, 64, 300, 300, dtype, 0)
    q = rows(rng, 12, 9 * 64)
    one = _C.attention(q, c, 0, 288, 9, n_threads=1)
    for n in (2, 3):
        np.testing.assert_array_equal(_C.attention(q, c, 0, 288, 9, n_threads=n), one)
    qd = rows(rng, 1, 9 * 64)
    np.testing.assert_array_equal(
        _C.attention(qd, c, 0, 299, 9, n_threads=2), _C.attention(qd, c, 0, 299, 9, n_threads=1)
    )


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("window", [0, 21, 3])
@pytest.mark.parametrize("n_head,n_head_kv", [(14, 2), (3, 3), (4, 2)])
def test_split_identical(isa: str, dtype: str, window: int, n_head: int, n_head_kv: int) -> None:
    """A query's result does not depend on which rows, heads or threads share its work: all rows
    at once (prefill), one row at a time (decode), and any thread count give the same bits."""
    rng = rng_for(11, window, n_head)
    hd, pos, m = (64 if dtype == "q8_0" else 40), 37, 9
    c = filled_cache(rng, 1, n_head_kv, hd, 64, pos + m, dtype, 0)
    q = rows(rng, m, n_head * hd)
    whole = _C.attention(q, c, 0, pos, n_head, window=window)
    for n in (2, 3, 5):
        got = _C.attention(q, c, 0, pos, n_head, window=window, n_threads=n)
        np.testing.assert_array_equal(got, whole)
    for n in (1, 3):
        rowwise = [
            _C.attention(q[t], c, 0, pos + t, n_head, window=window, n_threads=n) for t in range(m)
        ]
        np.testing.assert_array_equal(np.stack(rowwise), whole)


@pytest.mark.parametrize("dtype,n_head,n_head_kv,head_dim", DTYPE_SHAPES)
def test_long_decode_split_identical(isa: str, dtype: str, n_head: int, n_head_kv: int, head_dim: int) -> None:
    """A decode step over 512 positions or more is split over the threads by key blocks and
    output elements rather than by heads: the same bits as one thread and as the row within a
    prefill, checked against NumPy too; with and without a window, ending inside a key block
    and at its end."""
    for pos, window in [(700, 0), (1023, 0), (1500, 600), (530, 100)]:
        rng = rng_for(13, n_head, head_dim, pos)
        c = filled_cache(rng, 1, n_head_kv, head_dim, pos + 4, pos + 3, dtype, 0)
        q = rows(rng, 3, n_head * head_dim)
        one = check_attention(c, 0, q[:1], pos, n_head, window=window)
        for n in (2, 3):
            got = check_attention(c, 0, q[:1], pos, n_head, window=window, n_threads=n)
            np.testing.assert_array_equal(got, one)
        whole = _C.attention(q, c, 0, pos, n_head, window=window, n_threads=2)
        np.testing.assert_array_equal(whole[:1], one)
        later = _C.attention(q[2:], c, 0, pos + 2, n_head, window=window, n_threads=2)
        np.testing.assert_array_equal(later, whole[2:])


def test_python_threads_concurrently(isa: str) -> None:
    """The GIL is released and calls share nothing mutable: two Python threads calling at once
    get what each gets alone."""
    rng = rng_for(9)
    c = filled_cache(rng, 1, 3, 64, 500, 500, "float16", 0)
    qs = [rows(rng, 4, 9 * 64) for _ in range(2)]
    alone = [_C.attention(q, c, 0, 496, 9) for q in qs]
    got: list = [None, None]

    def work(i: int) -> None:
        for _ in range(20):
            got[i] = _C.attention(qs[i], c, 0, 496, 9, n_threads=2)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for a, b in zip(alone, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n_head,n_head_kv,m,pos", [(4, 2, 1, 40), (4, 2, 5, 36), (1, 1, 1, 40)])
def test_q8_0_scores_take_the_query_in_int16(isa: str, n_head: int, n_head_kv: int, m: int, pos: int) -> None:
    """Scores against a q8_0 cache take the query in int16 per 32 elements (reference.query_q16).
    Each chunk of these queries is one large element and 31 below half its int16 step: in int16
    they are zeros, and the keys are large where they are and zero where the large one is, so
    every score is 0 and the attention is the plain mean of the values. Float32 queries would
    give scores that differ by about a unit from position to position. (It does not tell int16
    from int8 rounding, which zeroes the same elements: the other q8_0 tests' float32 bounds do.)"""
    rng = rng_for(12, n_head, m)
    hd = 64
    width = n_head_kv * hd
    k = rows(rng, pos + m, width, 1e5)
    k.reshape(pos + m, n_head_kv, hd // 32, 32)[..., 0] = 0.0
    v = rows(rng, pos + m, width)
    c = _C.KVCache(1, n_head_kv, hd, pos + m, "q8_0")
    c.append(0, k, v, 0)
    q = (rng.uniform(-0.45, 0.45, (m, n_head * hd)) / 32767).astype(np.float32)
    q.reshape(m, n_head, hd // 32, 32)[..., 0] = 1.0
    out = check_attention(c, 0, q, pos, n_head)
    vals = c.values(0).astype(np.float64)
    group = n_head // n_head_kv
    for t in range(m):
        for h in range(n_head):
            mean = vals[h // group, : pos + t + 1].mean(axis=0)
            np.testing.assert_allclose(out[t, h * hd:(h + 1) * hd], mean, rtol=0, atol=1e-5)
    scale = 1.0 / np.sqrt(hd)
    as_float = R.attention(q, c.keys(0)[:, : pos + m], c.values(0)[:, : pos + m], pos, n_head, scale)
    assert np.max(np.abs(as_float - out)) > 1e-2  # the problem tells the two apart


def test_out_and_scale(isa: str) -> None:
    rng = rng_for(10)
    c = filled_cache(rng, 1, 1, 16, 8, 8, "float32", 0)
    q = rows(rng, 2, 2 * 16)
    out = np.empty_like(q)
    assert _C.attention(q, c, 0, 6, 2, out=out) is out
    np.testing.assert_array_equal(out, _C.attention(q, c, 0, 6, 2))
    y = _C.attention(q, c, 0, 6, 2, scale=0.5)
    ref = R.attention(q, c.keys(0)[:, :8], c.values(0)[:, :8], 6, 2, scale=0.5)
    bound = attention_bound(q, c.keys(0)[:, :8], c.values(0)[:, :8], 6, 2, 0.5)
    assert np.all(np.abs(y - ref) <= bound)


def test_attention_errors() -> None:
    c = _C.KVCache(2, 3, 8, 10)
    c.append(0, np.zeros((4, 24), np.float32), np.zeros((4, 24), np.float32), 0)
    q = np.zeros((2, 9 * 8), np.float32)
    with pytest.raises(ValueError, match="append K and V first"):
        _C.attention(q, c, 0, 3, 9)  # positions 3..4, cache holds 0..3
    with pytest.raises(ValueError, match="append K and V first"):
        _C.attention(q, c, 1, 0, 9)
    with pytest.raises(ValueError, match="multiple"):
        _C.attention(np.zeros((2, 8 * 8), np.float32), c, 0, 0, 8)
    with pytest.raises(ValueError, match="shape"):
        _C.attention(q, c, 0, 0, 6)
    with pytest.raises(ValueError, match="layer"):
        _C.attention(q, c, 2, 0, 9)
    with pytest.raises(ValueError, match="overlap"):
        _C.attention(q, c, 0, 0, 9, out=q)
    with pytest.raises(ValueError, match="n_threads"):
        _C.attention(q, c, 0, 0, 9, n_threads=0)
