"""Fuzz harness: the native entry points (`pyinfer._C`) with shapes, sizes, type ids, dtypes,
strides and values drawn from the input: matmul (exact, fast, packed), dequantize, repack /
unpack, embedding, the row ops (rms_norm, rope, swiglu, geglu, add, softmax), quantize_activations,
and KV-cache append + attention. Each call either returns an array of the shape its
arguments promise or raises ValueError / TypeError / OverflowError with a message; it never
crashes, hangs or writes outside its output (the sanitizer build runs the same harness). Where
a call is valid and small, its result is also checked against NumPy (f32 matmul and the row
ops, float32 rounding apart)."""

from __future__ import annotations

import numpy as np

import atheris
from common import fuzz

from pyinfer import _C
from pyinfer import reference

# Type ids: every one with a kernel, some without (refused), and out-of-range ones.
TYPE_IDS = [0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30, 9, 10, 15, 24, 39, 40, 2**31, -1]
BLOCK = {t: (info["block_elems"], info["block_bytes"]) for t, info in _C.type_traits().items()}
REFUSED = (ValueError, TypeError, OverflowError, MemoryError)
ISAS = _C.cpu_info()["available"]


def _size(fdp: atheris.FuzzedDataProvider) -> int:
    """Mostly small sizes, now and then an edge (0, negative, huge)."""
    pick = fdp.ConsumeIntInRange(0, 15)
    if pick == 0:
        return fdp.PickValueInList([0, -1, 2**31, 2**45, 2**62, 2**63 - 1])
    return fdp.ConsumeIntInRange(1, 96 if pick < 12 else 600)


def _floats(fdp: atheris.FuzzedDataProvider, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    x = np.random.default_rng(fdp.ConsumeIntInRange(0, 2**16)).standard_normal(n).astype(np.float32)
    if n and fdp.ConsumeBool():
        x[fdp.ConsumeIntInRange(0, n - 1)] = fdp.PickValueInList([np.nan, np.inf, -np.inf, 1e38, 0.0])
    x = x.reshape(shape)
    kind = fdp.ConsumeIntInRange(0, 7)
    if kind == 0 and x.ndim >= 1 and x.shape[-1] > 1:
        x = x[..., ::2]  # not contiguous
    elif kind == 1:
        x = x.astype(np.float64)  # wrong dtype
    elif kind == 2 and x.size:
        x = np.asfortranarray(x) if x.ndim > 1 else x
    return x


def _raw(fdp: atheris.FuzzedDataProvider, n_bytes: int) -> np.ndarray:
    n_bytes = max(0, min(n_bytes, 1 << 16))
    return np.frombuffer(fdp.ConsumeBytes(n_bytes).ljust(n_bytes, b"\0"), np.uint8).copy()


def _refused(e: Exception) -> None:
    """A refusal must say what was wrong; a refused allocation, how much and what for."""
    assert str(e), "an error without a message"
    if isinstance(e, MemoryError):
        assert str(e).startswith("cannot allocate "), e


def _expect(out: np.ndarray, shape: tuple[int, ...]) -> None:
    assert isinstance(out, np.ndarray) and out.shape == shape, (getattr(out, "shape", out), shape)


def check_matmul(fdp: atheris.FuzzedDataProvider) -> None:
    t = fdp.PickValueInList(TYPE_IDS)
    m, n, k = _size(fdp), _size(fdp), 32 * fdp.ConsumeIntInRange(0, 12) + fdp.PickValueInList([0, 0, 0, 1, 16])
    if fdp.ConsumeBool() and t in BLOCK and k > 0:
        be, bb = BLOCK[t]
        k = -(-k // be) * be
    precision = fdp.PickValueInList(["fast", "exact", "bogus"])
    packed = fdp.ConsumeIntInRange(0, 3) == 0
    n_threads = fdp.PickValueInList([1, 2, 0, -3, 2000])
    small = 0 < m <= 600 and 0 < n <= 600 and 0 < k <= 4096
    x = _floats(fdp, (m, k)) if small else np.zeros((1, 32), np.float32)
    be, bb = BLOCK.get(t, (1, 4))
    n_bytes = (n * k // be * bb if small and be else 64) + fdp.PickValueInList([0, 0, 0, -1, 1, 18])
    raw = _raw(fdp, n_bytes)
    w = raw
    if packed and small:
        try:
            w = _C.repack(raw, t, n, k)
        except REFUSED:
            pass
    try:
        y = _C.matmul(x, w, t, n, k, precision=precision, n_threads=n_threads, packed=packed)
    except REFUSED as e:
        _refused(e)
        return
    _expect(y, (x.shape[0], n))
    if t == 0 and precision == "exact" and not packed and np.isfinite(x).all():
        wf = raw[: n * k * 4].view(np.float32).reshape(n, k).astype(np.float64)
        if np.isfinite(wf).all():
            want = x.astype(np.float64) @ wf.T
            mag = np.abs(x).astype(np.float64) @ np.abs(wf).T
            fits = mag < 1e37  # no float32 partial sum can overflow (beyond it, inf is right)
            tol = 1e-4 * mag + 1e-30
            assert (np.abs(y - want) <= tol)[fits].all(), (x, wf, y, want)


def check_dequant_and_layouts(fdp: atheris.FuzzedDataProvider) -> None:
    t = fdp.PickValueInList(TYPE_IDS)
    n = _size(fdp)
    be, bb = BLOCK.get(t, (1, 1))
    raw = _raw(fdp, (n // be * bb if 0 < n < 1 << 14 and be else 64) + fdp.PickValueInList([0, 0, 1, -1]))
    if fdp.ConsumeBool() and raw.size > 1:
        raw = raw[1:]  # at an odd address
    op = fdp.ConsumeIntInRange(0, 2)
    try:
        if op == 0:
            _expect(_C.dequantize(t, raw, n), (n,))
        elif op == 1:
            k = fdp.PickValueInList([32, 64, 256, 0, 33, 2**40])
            p = _C.repack(raw, t, n, k)
            back = _C.unpack(p, t, n, k)
            assert back.tobytes() == raw[: back.size].tobytes() and back.size == raw.size
        else:
            dim = fdp.PickValueInList([32, 64, 256, 0, -32, 2**62])
            ids = [fdp.ConsumeIntInRange(-2, 8) for _ in range(fdp.ConsumeIntInRange(0, 6))]
            _expect(_C.embedding(raw, t, ids, dim), (len(ids), dim))
    except REFUSED as e:
        _refused(e)


def check_row_ops(fdp: atheris.FuzzedDataProvider) -> None:
    rows, n = fdp.ConsumeIntInRange(0, 9), fdp.ConsumeIntInRange(0, 300)
    x = _floats(fdp, (rows, n))
    op = fdp.ConsumeIntInRange(0, 5)
    try:
        if op == 0:
            w = _floats(fdp, (fdp.PickValueInList([n, n, n + 1, 0]),))
            eps = fdp.PickValueInList([1e-5, 0.0, -1.0, float("nan")])
            y = _C.rms_norm(x, w, eps)
            _expect(y, x.shape)
            if (np.isfinite(x).all() and np.isfinite(w).all() and n and eps > 0
                    and np.abs(x).max(initial=0) < 1e18 and np.abs(w).max(initial=0) < 1e18):
                np.testing.assert_allclose(y, reference.rms_norm(x, w, eps), rtol=1e-4, atol=1e-6)
        elif op == 1:
            heads = fdp.ConsumeIntInRange(0, 4)
            hd = fdp.PickValueInList([2, 4, 8, 64, 3, 0])
            pos = fdp.PickValueInList([0, 5, -1, 2**40]) if fdp.ConsumeBool() else \
                np.arange(rows, dtype=np.int64) * fdp.ConsumeIntInRange(-1, 3)
            _expect(_C.rope(x, pos, heads, hd, fdp.PickValueInList([10000.0, 0.0, -1.0, float("inf")]),
                            neox=fdp.ConsumeBool()), x.shape)
        elif op == 2:
            other = _floats(fdp, fdp.PickValueInList([x.shape, (rows, n + 1)]))
            _expect((_C.swiglu if fdp.ConsumeBool() else _C.geglu)(x, other), x.shape)
        elif op == 3:
            other = _floats(fdp, fdp.PickValueInList([x.shape, (rows + 1, n)]))
            _expect(_C.add(x, other), x.shape)
        elif op == 4:
            y = _C.softmax(x)
            _expect(y, x.shape)
            if np.isfinite(x).all() and n:
                assert np.allclose(y.sum(axis=-1), 1, atol=1e-4)
        else:
            q = _C.quantize_activations(x)
            assert q[0].shape == x.shape
    except REFUSED as e:
        _refused(e)


def check_attention(fdp: atheris.FuzzedDataProvider) -> None:
    n_layer, n_kv = fdp.ConsumeIntInRange(0, 3), fdp.ConsumeIntInRange(0, 3)
    hd, n_ctx = fdp.PickValueInList([4, 16, 64, 0, 3]), fdp.PickValueInList([1, 16, 17, 40, 0, 2**40])
    try:
        cache = _C.KVCache(n_layer, n_kv, hd, n_ctx, fdp.PickValueInList(["float32", "float16", "int8"]))
        m = fdp.ConsumeIntInRange(0, 20)
        width = n_kv * hd + fdp.PickValueInList([0, 0, 1])
        layer = fdp.ConsumeIntInRange(-1, n_layer)
        pos = fdp.ConsumeIntInRange(-1, 3)
        cache.append(layer, _floats(fdp, (m, width)), _floats(fdp, (m, width)), pos)
        n_head = n_kv * fdp.PickValueInList([1, 2, 3]) + fdp.PickValueInList([0, 0, 1])
        q = _floats(fdp, (m, n_head * hd))
        y = _C.attention(q, cache, layer, pos, n_head, window=fdp.PickValueInList([0, 1, 5, -1]),
                         n_threads=fdp.PickValueInList([1, 2]))
        _expect(y, (m, n_head * hd))
    except REFUSED as e:
        _refused(e)


CHECKS = [check_matmul, check_dequant_and_layouts, check_row_ops, check_attention]


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    _C.set_isa(fdp.PickValueInList(ISAS))
    fdp.PickValueInList(CHECKS)(fdp)


if __name__ == "__main__":
    import sys

    # The native code has no coverage counters: the harness's own branches (which call, which
    # refusal) guide the search, with the Python wrappers it reaches.
    fuzz(test_one_input, [sys.modules[__name__], reference])
