"""NaN and infinities in activations or weights come out in the same places on every ISA path
as on the scalar one: a kernel never clamps a NaN into a finite number on one path and keeps
it on another (the AVX2/AVX-512 exp once turned a NaN score into 0, hiding it in softmax and
attention)."""

from __future__ import annotations

import numpy as np
import pytest

from pyinfer import _C
from pyinfer.gguf_types import GGMLType
from pyinfer.quants import quantize

ISAS = _C.cpu_info()["available"]
TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1]


def _special(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random float32 values with a NaN, a +inf and a -inf in rows of their own."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x.reshape(-1, shape[-1])[0, 5] = np.nan
    x.reshape(-1, shape[-1])[1, 7] = np.inf
    x.reshape(-1, shape[-1])[2, 9] = -np.inf
    return x


def _pattern(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.isnan(y), np.isposinf(y), np.isneginf(y)


def _on_each_isa(f):
    before = _C.get_isa()
    out = {}
    try:
        for isa in ISAS:
            _C.set_isa(isa)
            out[isa] = f()
    finally:
        _C.set_isa(before)
    return out


def _assert_same_pattern(results: dict[str, np.ndarray]) -> None:
    ref = _pattern(results["scalar"])
    assert ref[0].any(), "the input's NaN must show somewhere"
    for isa, y in results.items():
        for name, a, b in zip(("NaN", "+inf", "-inf"), _pattern(y), ref):
            bad = np.argwhere(a != b)
            assert bad.size == 0, f"{isa}: {name} at {bad[:5].tolist()} differs from scalar"


X = _special((4, 64), 0)

OPS = {
    "softmax": lambda: _C.softmax(X),
    "rms_norm": lambda: _C.rms_norm(X, np.ones(64, np.float32), 1e-5),
    "swiglu": lambda: _C.swiglu(X, X[::-1].copy()),
    "add": lambda: _C.add(X, X[::-1].copy()),
}


@pytest.mark.parametrize("op", list(OPS))
def test_row_ops_agree_on_special_values(op: str) -> None:
    _assert_same_pattern(_on_each_isa(OPS[op]))


def test_silu_of_infinities_is_the_scalar_formula_on_every_path() -> None:
    # g / (1 + exp(-g)): exp(inf) is inf on every path (not a clamped FLT_MAX), so -inf gives
    # NaN, a large negative gate -0, and +inf gives inf.
    g = np.array([-np.inf, -200.0, -90.0, 0.0, 90.0, np.inf, np.nan] + [1.0] * 9, np.float32)
    out = _on_each_isa(lambda: _C.swiglu(g, np.ones_like(g)))
    ref = out["scalar"]
    assert np.isnan(ref[0]) and ref[1] == 0 and np.signbit(ref[1]) and ref[5] == np.inf and np.isnan(ref[6])
    for isa, y in out.items():
        np.testing.assert_array_equal(y[[0, 1, 3, 5, 6]], ref[[0, 1, 3, 5, 6]], err_msg=isa)
        np.testing.assert_allclose(y[[2, 4]], ref[[2, 4]], rtol=1e-6, err_msg=isa)


@pytest.mark.parametrize("tname", [t.name for t in TYPES if t.name.startswith("Q")])
def test_quantize_refuses_non_finite_values(tname: str) -> None:
    w = _special((16, 64), 2)
    with pytest.raises(ValueError, match=r"value 5 is nan: .* blocks can only hold finite values"):
        quantize(w, GGMLType[tname])
    w[0, 5] = 0
    with pytest.raises(ValueError, match=r"value 71 is inf"):
        quantize(w, GGMLType[tname])


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("tname", [t.name for t in TYPES if t.name.startswith("Q")])
def test_non_finite_block_scales_give_non_finite_outputs_in_the_same_places(tname: str, precision: str) -> None:
    """Blocks as a file may hold them: scales of NaN, +inf and -inf (and an inf min for Q4_1).
    Every path makes the same outputs non-finite; which of NaN and inf may differ (documented
    in _C.matmul)."""
    t = GGMLType[tname]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    raw = quantize(rng.standard_normal((16, 64)).astype(np.float32), t).copy()
    blocks = raw.reshape(32, -1)  # 16 rows of 2 blocks
    bad_rows = {0: np.nan, 1: np.inf, 2: -np.inf}
    for r, v in bad_rows.items():
        blocks[2 * r + 1, :2] = np.frombuffer(np.float16(v).tobytes(), np.uint8)
    if t == GGMLType.Q4_1:
        blocks[6, 2:4] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)  # row 3's min
        bad_rows[3] = np.inf
    out = _on_each_isa(lambda: _C.matmul(x, raw, int(t), 16, 64, precision=precision))
    want = np.zeros((4, 16), bool)
    want[:, list(bad_rows)] = True
    for isa, y in out.items():
        np.testing.assert_array_equal(~np.isfinite(y), want, err_msg=isa)


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize(("where", "tname"), [("activations", t.name) for t in TYPES] + [
    ("weights", t.name) for t in TYPES if not t.name.startswith("Q")])
def test_matmul_agrees_on_special_values(where: str, tname: str, precision: str) -> None:
    t = GGMLType[tname]
    rng = np.random.default_rng(1)
    x = X if where == "activations" else rng.standard_normal((4, 64)).astype(np.float32)
    w = _special((16, 64), 2) if where == "weights" else rng.standard_normal((16, 64)).astype(np.float32)
    raw = quantize(w, t)
    _assert_same_pattern(_on_each_isa(lambda: _C.matmul(x, raw, int(t), 16, 64, precision=precision)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "q8_0"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_attention_agrees_on_special_values(where: str, dtype: str) -> None:
    n_head, n_kv, hd, n = 4, 2, 64, 20
    rng = np.random.default_rng(3)
    q = _special((n, n_head * hd), 4) if where == "q" else rng.standard_normal((n, n_head * hd)).astype(np.float32)
    k = _special((n, n_kv * hd), 5) if where == "k" else rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    v = _special((n, n_kv * hd), 6) if where == "v" else rng.standard_normal((n, n_kv * hd)).astype(np.float32)

    def run() -> np.ndarray:
        cache = _C.KVCache(1, n_kv, hd, 32, dtype)
        cache.append(0, k, v, 0)
        return _C.attention(q, cache, 0, 0, n_head)

    _assert_same_pattern(_on_each_isa(run))
