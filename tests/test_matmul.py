"""Matmul y = x @ W^T on every ISA path and weight type, in both modes, against pyinfer.reference.

Bounds, per output element:
- exact mode against a float64 product of the dequantized weights:
  |y - ref| <= K * eps32 * sum_k |x_k| |w_k|  (float32 accumulation of K products);
- fast mode against the NumPy fast reference, which computes the same integer block dot
  products: |y - ref| <= 2 * (K/32 + 16) * eps32 * magnitude (reference.matmul_fast_parts),
  float32 summation order only;
- fast against exact: activation rounding moves each x_k by at most d_x/2 (d_x its block's
  scale), so |y_fast - y_exact| <= sum_b d_x,b / 2 * sum_{k in b} |w_k| plus both float bounds.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest

from pyinfer import _C, quants
from pyinfer import reference as R

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30
TYPES = {"f32": F32, "f16": F16, "bf16": BF16, "q8_0": Q8_0, "q4_0": Q4_0, "q4_1": Q4_1,
         "q5_0": Q5_0, "q5_1": Q5_1, "q4_k": Q4_K, "q5_k": Q5_K, "q6_k": Q6_K}
QUANT = {Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K}  # the types with int8 kernels
EPS = float(np.finfo(np.float32).eps)
SUPER = {Q4_K, Q5_K, Q6_K}  # 256-element super-blocks

KS = [32, 96, 576, 1536]
KS_SUPER = [256, 768, 1536]


def ks_of(w_type: int) -> list[int]:
    return KS_SUPER if w_type in SUPER else KS


def k_small(w_type: int) -> int:
    """A K with a tail for every loop: 96 (K % 64 == 32), or 768 for the super-block types."""
    return 768 if w_type in SUPER else 96


def k_mid(w_type: int) -> int:
    return 768 if w_type in SUPER else 576


CASES = [(tname, k) for tname, t in TYPES.items() for k in ks_of(t)]
NS = [1, 7, 64, 193]
MS = [1, 2, 5, 15, 17, 64]  # 15 and 17: the eight-row tiles with every tail


@functools.cache
def problem(w_type: int, k: int, n: int, m: int = max(MS)):
    """Random activations x[m, k], weights W[n, k] encoded as w_type (raw bytes), and W as
    dequantized float64. Rows of x have different scales; one block is all zeros; a few
    channels are tens to thousands of times larger, as after RMSNorm in a real model, so many
    blocks are split (the quantization keeps their largest element apart)."""
    rng = np.random.default_rng(1000 * k + n + w_type)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
    x[:, 5 :: 37] *= rng.uniform(20, 3000, len(range(5, k, 37))).astype(np.float32)
    x[0, :32] = 0
    w = rng.standard_normal((n, k)).astype(np.float32)
    raw = quants.quantize(w, w_type)
    wd = quants.dequantize(raw, w_type).reshape(n, k).astype(np.float64)
    return x, raw, wd


@functools.cache
def references(w_type: int, k: int, n: int):
    x, raw, wd = problem(w_type, k, n)
    exact = R.matmul_exact(x, raw, w_type, n, k)
    exact_bound = k * EPS * (np.abs(x).astype(np.float64) @ np.abs(wd).T)
    if w_type not in QUANT:
        return exact, exact_bound, exact, exact_bound, exact_bound
    fast, mag = R.matmul_fast_parts(x, raw, w_type, n, k)
    fast_bound = 2 * (k // 32 + 16) * EPS * mag
    dx = R.quantize_activations(x)[1]  # [M, K/32]
    wabs = np.abs(wd).reshape(n, k // 32, 32).sum(axis=2)  # [N, K/32]
    act_err = 0.5 * dx.astype(np.float64) @ wabs.T
    # Expected square of the activation-rounding error, taking each rounding as uniform on
    # [-d_x/2, d_x/2] and independent: sum_b d_x,b^2 / 12 * sum_{k in b} w_k^2.
    w2 = (wd * wd).reshape(n, k // 32, 32).sum(axis=2)
    act_var = (dx.astype(np.float64) ** 2 / 12) @ w2.T
    REF_VAR[w_type, k, n] = act_var
    return exact, exact_bound, fast, fast_bound, act_err * (1 + 1e-5) + exact_bound + fast_bound


REF_VAR: dict[tuple[int, int, int], np.ndarray] = {}


def check_close(y: np.ndarray, ref: np.ndarray, bound: np.ndarray, what: str) -> None:
    assert y.dtype == np.float32 and y.shape == ref.shape
    err = np.abs(y.astype(np.float64) - ref)
    bad = err > bound
    if bad.any():
        i = np.argwhere(bad)[0]
        raise AssertionError(f"{what}: {bad.sum()} elements out of bound, first at {tuple(i)}: "
                             f"y={y[tuple(i)]!r} ref={ref[tuple(i)]!r} err={err[tuple(i)]:.3g} "
                             f"bound={bound[tuple(i)]:.3g}")


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("tname,k", CASES)
def test_matmul_against_reference(isa, tname, precision, k, n):
    w_type = TYPES[tname]
    x, raw, _ = problem(w_type, k, n)
    exact, exact_bound, fast, fast_bound, fast_vs_exact = references(w_type, k, n)
    for m in MS:
        y = _C.matmul(x[:m], raw, w_type, n, k, precision=precision)
        if precision == "exact":
            check_close(y, exact[:m], exact_bound[:m], f"{isa} {tname} exact M={m}")
        else:
            check_close(y, fast[:m], fast_bound[:m], f"{isa} {tname} fast vs NumPy fast M={m}")
            check_close(y, exact[:m], fast_vs_exact[:m], f"{isa} {tname} fast vs exact M={m}")
            if w_type in QUANT and m * n >= 64:
                # The worst-case bound above is loose; the typical error is checked too: the
                # mean square error stays within 2x its expectation.
                mse = np.mean((y.astype(np.float64) - exact[:m]) ** 2)
                assert mse <= 2 * np.mean(REF_VAR[w_type, k, n][:m]), (isa, tname, m)


def test_quantize_activations_bit_exact(isa):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((9, 320)) * rng.uniform(1e-3, 1e3, (9, 1))).astype(np.float32)
    x[1, :32] = 0                      # all-zero block: scale 0, quants 0
    x[2, 32:64] = np.float32(-3.5)      # amax at negative values: -127 everywhere
    x[3, 64:96] = np.arange(32, dtype=np.float32) - 16  # halfway cases of the rounding
    x[4, :] = np.float32(1e-30)         # tiny values
    x[5, 96:128] = 0.01
    x[5, 100] = 50.0                    # a clear outlier: split, 127 * 128 times the scale
    x[5, 110] = 0.02                    # ... with the scale set by the second largest
    x[6, 128:160] = 1.0
    x[6, 140] = np.float32(2.0)         # exactly twice the rest: not split
    x[6, 141] = np.float32(-2.0)        # equal magnitudes: the first is the largest
    x[7, 160:192] = 1e-3
    x[7, 170] = -1e6                    # beyond 128 * 127 levels: the largest sets amax / 128
    # The SIMD paths take blocks sixteen at a time, then the rest one by one: the special
    # blocks (0-5) go through the first way, then (blocks 16-25) the second.
    x = np.concatenate([x, x[:, :192], x], axis=1)
    q, d, s, h, jo = _C.quantize_activations(x)
    rq, rd, rs, rh, rjo = R.quantize_activations(x)
    np.testing.assert_array_equal(q, rq)
    np.testing.assert_array_equal(d.view(np.uint32), rd.view(np.uint32))
    np.testing.assert_array_equal(s, rs)
    np.testing.assert_array_equal(h, rh)
    np.testing.assert_array_equal(jo, rjo)
    assert np.abs(q.astype(np.int32)).max() <= 127
    assert (h[5, 3], jo[5, 3]) == (127, 4) and h[6, 4] == 0 and jo[6, 4] == 12 and h[7, 5] == -127
    # The integers stand for x: each within half a step, the outlier's too.
    a = R.activation_integers(q, h, jo)
    xb = x.reshape(9, 26, 32).astype(np.float64)
    assert np.all(np.abs(a * d[:, :, None] - xb) <= 0.5001 * d[:, :, None] + 1e-30)


def test_quantize_activations_nonfinite_alike_on_both_paths(isa):
    """Non-finite activations are outside the spec, but a block's result still depends on its
    values alone: the same blocks holding NaN or inf give the same fields whether they fall in a
    run of sixteen (blocks 0-15) or in a row's tail (blocks 16-25)."""
    rng = np.random.default_rng(8)
    blocks = rng.standard_normal((10, 32)).astype(np.float32)
    blocks[1, [3, 17, 31]] = np.nan
    blocks[2, 5] = np.inf
    blocks[3, 0] = -np.inf
    blocks[4, :] = np.nan
    row = np.concatenate([blocks.ravel(), rng.standard_normal(6 * 32).astype(np.float32), blocks.ravel()])[None]
    q, d, s, h, jo = (a.reshape(26, -1) for a in _C.quantize_activations(row))
    for a in (q, d.view(np.uint32), s, h, jo):
        np.testing.assert_array_equal(a[:10], a[16:])


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("tname", list(TYPES))
def test_threads_bitwise_identical(isa, tname, precision):
    w_type = TYPES[tname]
    k, n = k_mid(w_type), 1000
    rng = np.random.default_rng(3)
    w = rng.standard_normal((n, k)).astype(np.float32)
    raw = quants.quantize(w, w_type)
    for m in (1, 17):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y1 = _C.matmul(x, raw, w_type, n, k, precision=precision, n_threads=1)
        for t in (2, 3):
            yt = _C.matmul(x, raw, w_type, n, k, precision=precision, n_threads=t)
            np.testing.assert_array_equal(y1.view(np.uint32), yt.view(np.uint32))


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("tname", list(TYPES))
def test_rows_independent_of_batch(isa, tname, precision):
    """Kernels tile activation rows (2 or 4 at a time, then single rows): a row's result is
    the same bits whether it is multiplied alone or in a batch, in either layout."""
    w_type = TYPES[tname]
    k, n = k_small(w_type), 40  # K % 64 == 32 (or an odd count of super-blocks), N % 16 != 0
    x, raw, _ = problem(w_type, k, n)
    layouts = [(raw, False)] + ([(_C.repack(raw, w_type, n, k), True)] if w_type in QUANT else [])
    for w, packed in layouts:
        batch = _C.matmul(x[:8], w, w_type, n, k, precision=precision, packed=packed)
        for m in range(8):
            alone = _C.matmul(x[m:m + 1], w, w_type, n, k, precision=precision, packed=packed)
            np.testing.assert_array_equal(alone.view(np.uint32), batch[m:m + 1].view(np.uint32))


def test_two_python_threads_at_once():
    """Two Python threads, each asking for two pool threads, get the single-threaded results."""
    rng = np.random.default_rng(5)
    k, n = 576, 777
    jobs = []
    for w_type, precision in [(Q4_1, "fast"), (Q8_0, "exact"), (F16, "fast"), (Q4_0, "fast")]:
        raw = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), w_type)
        x = rng.standard_normal((3, k)).astype(np.float32)
        jobs.append((x, raw, w_type, precision, _C.matmul(x, raw, w_type, n, k, precision=precision)))
    errors: list[str] = []

    def worker(offset: int) -> None:
        for i in range(60):
            x, raw, w_type, precision, want = jobs[(i + offset) % len(jobs)]
            got = _C.matmul(x, raw, w_type, n, k, precision=precision, n_threads=2)
            if not np.array_equal(got, want):
                errors.append(f"type {w_type} {precision}: wrong result")

    threads = [threading.Thread(target=worker, args=(o,)) for o in (0, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_out_argument_and_typed_weights():
    rng = np.random.default_rng(9)
    k, n = 64, 5
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((2, k)).astype(np.float32)
    want = _C.matmul(x, w.view(np.uint8).reshape(-1), F32, n, k)
    out = np.full((2, n), np.nan, np.float32)
    got = _C.matmul(x, w, F32, n, k, precision="exact", out=out)  # a float32 [n, k] array as W
    assert got is out or np.shares_memory(got, out)
    np.testing.assert_array_equal(out, want)
    h = w.astype(np.float16)
    np.testing.assert_array_equal(_C.matmul(x, h, F16, n, k), _C.matmul(x, h.view(np.uint8), F16, n, k))


def test_validation_errors():
    k, n = 64, 3
    x = np.zeros((2, k), np.float32)
    w = np.zeros((n, k), np.float32)
    with pytest.raises(ValueError, match="precision must be 'fast' or 'exact'"):
        _C.matmul(x, w, F32, n, k, precision="approximate")
    with pytest.raises(ValueError, match="float32"):
        _C.matmul(x.astype(np.float64), w, F32, n, k)
    with pytest.raises(ValueError, match="float32"):
        _C.matmul(np.zeros((2, 2 * k), np.float32)[:, ::2], w, F32, n, k)  # not contiguous
    with pytest.raises(ValueError, match="shape"):
        _C.matmul(np.zeros((2, 32), np.float32), w, F32, n, k)
    with pytest.raises(ValueError, match="bytes"):
        _C.matmul(x, w[:2], F32, n, k)
    with pytest.raises(ValueError, match="type"):
        _C.matmul(x, np.zeros(n * k // 32 * 36, np.uint8), 9, n, k)  # Q8_1: no kernel
    with pytest.raises(ValueError, match="block size"):
        _C.matmul(x, w, Q4_K, n, k)  # Q4_K rows are whole 256-element blocks
    with pytest.raises(ValueError, match="multiple of 32"):
        _C.matmul(np.zeros((2, 48), np.float32), np.zeros((n, 48), np.float32), F32, n, 48)
    with pytest.raises(ValueError, match="n_threads"):
        _C.matmul(x, w, F32, n, k, n_threads=0)
    with pytest.raises(ValueError, match="out"):
        _C.matmul(x, w, F32, n, k, out=np.zeros((2, n + 1), np.float32))
    with pytest.raises(ValueError, match="overlap"):
        buf = np.zeros((2, k), np.float32)
        _C.matmul(buf, w, F32, n, k, out=buf.reshape(-1)[: 2 * n].reshape(2, n))


def test_empty_m():
    y = _C.matmul(np.zeros((0, 32), np.float32), np.zeros((4, 32), np.float32), F32, 4, 32)
    assert y.shape == (0, 4)


def test_pool_size():
    before = _C.pool_size()
    _C.set_pool_size(3)
    assert _C.pool_size() == 3
    _C.set_pool_size(1)
    assert _C.pool_size() == 1
    x = np.ones((1, 32), np.float32)
    # A call asking for more threads than the pool has grows it.
    y = _C.matmul(x, np.ones((64, 32), np.float32), F32, 64, 32, n_threads=2)
    assert _C.pool_size() >= 2 and np.all(y == 32)
    _C.set_pool_size(max(before, 1))
    with pytest.raises(ValueError):
        _C.set_pool_size(0)


# ---- the 16-row packed layout ----------------------------------------------------------------

QTYPES = {name: t for name, t in TYPES.items() if t in QUANT}


@pytest.mark.parametrize("n", [1, 7, 16, 64, 193])
@pytest.mark.parametrize("tname", list(QTYPES))
def test_repack_round_trip(tname, n):
    w_type = QTYPES[tname]
    k = k_small(w_type)
    _, raw, _ = problem(w_type, k, n)
    packed = _C.repack(raw, w_type, n, k)
    row_bytes = raw.size // n
    assert packed.size == -(-n // 16) * 16 * row_bytes
    np.testing.assert_array_equal(_C.unpack(packed, w_type, n, k), raw)
    # Padding rows are zero blocks: every byte unpacks to 0 (Q8_0's quants are held as q + 128
    # in the packed copy), so their scales are zero and they multiply to 0.
    n_pad = -(-n // 16) * 16
    tail = _C.unpack(packed, w_type, n_pad, k)[n * row_bytes:]
    assert tail.size == (n_pad - n) * row_bytes and not np.any(tail)
    assert np.all(R.matmul_exact(np.ones((1, k), np.float32), tail, w_type, n_pad - n, k) == 0)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("tname,k", [(tname, k) for tname, k in CASES if tname in QTYPES])
def test_packed_matmul(isa, tname, k, n):
    """Packed fast mode on every path equals the scalar reference kernel on the unpacked W
    bit for bit (same integer sums, same float operations per row); packed exact mode equals
    unpacked exact mode on the same path."""
    w_type = QTYPES[tname]
    x, raw, _ = problem(w_type, k, n)
    _, _, fast, fast_bound, _ = references(w_type, k, n)
    packed = _C.repack(raw, w_type, n, k)
    _C.set_isa("scalar")
    want = _C.matmul(x, raw, w_type, n, k, precision="fast")
    _C.set_isa(isa)
    for m in MS:
        y = _C.matmul(x[:m], packed, w_type, n, k, precision="fast", packed=True)
        check_close(y, fast[:m], fast_bound[:m], f"{isa} {tname} packed fast M={m}")
        np.testing.assert_array_equal(y.view(np.uint32), want[:m].view(np.uint32))
        ye = _C.matmul(x[:m], packed, w_type, n, k, precision="exact", packed=True)
        np.testing.assert_array_equal(ye, _C.matmul(x[:m], raw, w_type, n, k, precision="exact"))


@pytest.mark.parametrize("tname", list(QTYPES))
def test_packed_long_rows(isa, tname):
    """Rows past 8192 elements with several activation rows: the SIMD kernels keep unpacking
    in place there instead of copying a group's columns once per call (the copy is meant to
    stay in L2), and both ways give the scalar kernel's bits, the outliers' split terms
    included."""
    w_type, n, k = QTYPES[tname], 19, 8448
    rng = np.random.default_rng(9)
    raw = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), w_type)
    packed = _C.repack(raw, w_type, n, k)
    x = rng.standard_normal((7, k)).astype(np.float32)
    x[:, ::97] *= 40.0  # outliers: split activation blocks
    _C.set_isa("scalar")
    want = _C.matmul(x, raw, w_type, n, k, precision="fast")
    _C.set_isa(isa)
    for m in (4, 7):
        y = _C.matmul(x[:m], packed, w_type, n, k, precision="fast", packed=True)
        np.testing.assert_array_equal(y.view(np.uint32), want[:m].view(np.uint32))


@pytest.mark.parametrize("tname", list(QTYPES))
def test_packed_many_rows(isa, tname):
    """With 32 to 64 activation rows in a kernel call (calls take 64 at most) the AVX-512
    kernels unpack each group of a 5- or 6-bit type or a K-quant once per call into a buffer,
    and every tile reads that. The row counts leave every tail tile after the eight-row ones
    (35: 3, 38: 4 + 2, 45: 4 + 1), and 71 is a full call of 64 and seven rows in place; the
    weight rows end in a partial group, and outliers split activation blocks. Every path,
    every type, gives the scalar kernel's bits."""
    w_type, n = QTYPES[tname], 37
    k = k_mid(w_type)
    rng = np.random.default_rng(11)
    raw = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), w_type)
    packed = _C.repack(raw, w_type, n, k)
    x = (rng.standard_normal((71, k)) * rng.uniform(0.1, 10.0, (71, 1))).astype(np.float32)
    x[:, ::53] *= 60.0
    _C.set_isa("scalar")
    want = _C.matmul(x, raw, w_type, n, k, precision="fast")
    _C.set_isa(isa)
    for m in (35, 38, 45, 71):
        y = _C.matmul(x[:m], packed, w_type, n, k, precision="fast", packed=True)
        np.testing.assert_array_equal(y.view(np.uint32), want[:m].view(np.uint32))


@pytest.mark.parametrize("tname", list(QTYPES))
def test_packed_threads_bitwise_identical(isa, tname):
    w_type, n = QTYPES[tname], 1000
    k = k_mid(w_type)
    rng = np.random.default_rng(4)
    packed = _C.repack(quants.quantize(rng.standard_normal((n, k)).astype(np.float32), w_type), w_type, n, k)
    for m in (1, 17):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y1 = _C.matmul(x, packed, w_type, n, k, packed=True, n_threads=1)
        y2 = _C.matmul(x, packed, w_type, n, k, packed=True, n_threads=2)
        np.testing.assert_array_equal(y1.view(np.uint32), y2.view(np.uint32))


@pytest.mark.parametrize("precision,mix", [
    ("fast", ("q4_k", "q6_k", "q8_0")), ("fast", ("q5_0", "q4_1")), ("fast", ("q6_k",)),
    ("fast", ("q8_0", "q4_0", "q5_1")), ("fast", ("f16", "q4_k", "bf16")), ("fast", ("f32", "f16")),
    ("fast", ("q8_0 as stored", "q4_1", "q6_k")), ("exact", ("f16", "f16", "f32")), ("exact", ("bf16",)),
    ("exact", ("q4_1 as stored", "q6_k as stored", "f16")), ("exact", ("q8_0 as stored", "q5_k as stored"))])
def test_parts_in_one_job(isa, precision, mix):
    """Several matrices of any types sharing one input, in one job (a model's Q, K, V or gate
    and up): each part's outputs, side by side, are the bits of its own matmul, on any thread
    count and activation row count. The parts are split over the threads by bytes, so shares
    start and end inside parts: rows of 37 and 100 (partial groups); several 512 KiB shares per
    thread in a many-row call where the total allows (the float mixes, and an 8-bit one with
    its first part "as stored": a fast kernel of its own, the 16-row layout not needed). In exact
    mode quantized rows as stored are parts too, their rows dequantized in registers for one or
    two activation rows where the ISA has a kernel for that, else a group at a time into
    scratch."""
    k = 1024
    rng = np.random.default_rng(21)
    parts = []
    for tname, n in zip(mix, [1200 if mix[0].startswith("q8_0") else 400, 37, 100]):
        w_type = TYPES[tname.split()[0]]
        w = rng.standard_normal((n, k)).astype(np.float32)
        if w_type in QUANT and not tname.endswith("as stored"):
            parts.append((_C.repack(quants.quantize(w, w_type), w_type, n, k), w_type, n, True))
        else:
            parts.append((quants.quantize(w, w_type) if w_type != F32 else w, w_type, n, False))
    x = (rng.standard_normal((150, k)) * rng.uniform(0.1, 10.0, (150, 1))).astype(np.float32)
    for m in (1, 2, 3, 64, 65, 150):
        want = np.concatenate([_C.matmul(x[:m], w, t, n, k, precision=precision, packed=pk) for w, t, n, pk in parts],
                              axis=1)
        for threads in (1, 2, 3, 5):
            y = _C.matmul_parts(x[:m], parts, k, precision=precision, n_threads=threads)
            np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32),
                                          err_msg=f"{precision} {mix} M={m} t={threads}")
    w0, t0, n0, pk0 = parts[0]
    with pytest.raises(ValueError, match="exactly n rows"):
        _C.matmul_parts(x[:1], [(w0[:-1], t0, n0, pk0)], k, precision=precision)  # a row or byte short
    with pytest.raises(ValueError, match="1 to 8"):
        _C.matmul_parts(x[:1], [], k)
    if pk0:  # a packed part has no exact kernel of its own
        with pytest.raises(ValueError, match="no exact kernel"):
            _C.matmul_parts(x[:1], [parts[0]], k, precision="exact")


def test_packed_validation():
    k, n = 64, 3
    raw = quants.quantize(np.zeros((n, k), np.float32), Q4_1)
    with pytest.raises(ValueError, match="Q8_0, Q4_0, Q4_1, .* or Q6_K"):
        _C.repack(np.zeros((n, k), np.float32), F32, n, k)
    with pytest.raises(ValueError, match="block size"):
        _C.repack(np.zeros(n * 144 // 4, np.uint8), Q4_K, n, k)  # Q4_K rows are 256 elements
    with pytest.raises(ValueError, match="rows"):
        _C.repack(raw[:-1], Q4_1, n, k)
    with pytest.raises(ValueError, match="bytes"):
        _C.matmul(np.zeros((1, k), np.float32), raw, Q4_1, n, k, packed=True)  # not repacked
    with pytest.raises(ValueError, match="packed"):
        _C.matmul(np.zeros((1, k), np.float32), np.zeros((n, k), np.float32), F32, n, k, packed=True)
    with pytest.raises(ValueError, match="bytes"):
        _C.unpack(raw, Q4_1, n, k)


def test_int8_peak_probe():
    # One core's int8 dot-product instruction rate: a rate on the SIMD paths, refused on the
    # scalar one (which has no such instruction) and for a bad duration.
    was = _C.get_isa()
    try:
        if was != "scalar":
            assert _C.int8_peak(0.02) > 1e8
        with pytest.raises(ValueError, match="min_seconds"):
            _C.int8_peak(0)
        _C.set_isa("scalar")
        with pytest.raises(RuntimeError, match="scalar"):
            _C.int8_peak()
    finally:
        _C.set_isa(was)


@pytest.mark.parametrize("tname", list(QTYPES))
def test_unpacked_fast_against_packed(isa, tname):
    """What _C.matmul's docstring states: unpacked fast Q8_0/Q4_0/Q4_1 on a SIMD path sum the
    block products in another order than the packed kernels (float32 rounding apart); every
    other type, and every type on the scalar path, gives the packed layout's bits."""
    w_type = QTYPES[tname]
    k, n = k_mid(w_type), 193
    x, raw, _ = problem(w_type, k, n)
    packed = _C.matmul(x, _C.repack(raw, w_type, n, k), w_type, n, k, precision="fast", packed=True)
    unpacked = _C.matmul(x, raw, w_type, n, k, precision="fast")
    if isa != "scalar" and w_type in (Q8_0, Q4_0, Q4_1):
        rel = np.abs(unpacked - packed).max(axis=1) / np.abs(packed).max(axis=1)
        assert 0 < rel.max() < 1e-5  # they differ, by float32 rounding
    else:
        np.testing.assert_array_equal(unpacked.view(np.uint32), packed.view(np.uint32))
