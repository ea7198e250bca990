"""Architecture descriptions: a file loads only if the forward pass reads every tensor and
implements every metadata key that changes the computation; Llama 3's RoPE frequency factors
and linear RoPE scaling against a forward pass written here from their definitions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pyinfer import Model, _C
from pyinfer import reference as R
from pyinfer.arch import UnsupportedModelError, describe
from pyinfer.bench.synthetic import Shape, write_synthetic, write_synthetic_llama
from pyinfer.gguf import GGUFReader
from pyinfer.gguf_types import GGMLType, ValueType
from pyinfer.info import format_info, model_info

SHAPE = Shape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=260, n_ctx=256)


def write(tmp_path: Path, name: str = "m.gguf", shape: Shape = SHAPE, **kw: object) -> Path:
    return write_synthetic_llama(tmp_path / name, shape, GGMLType.F32, seed=3, **kw)  # type: ignore[arg-type]


# ---- refused files ---------------------------------------------------------------------------

REFUSED_KEYS = [
    ("llama.rope.scaling.type", "yarn", "llama.rope.scaling.type = 'yarn' is not supported"),
    ("llama.rope.scaling.type", "longrope", "llama.rope.scaling.type = 'longrope' is not supported"),
    ("llama.rope.scaling.factor", 4.0, "llama.rope.scaling.factor = 4.0 without a scaling type"),
    ("llama.attention.sliding_window", (-1, ValueType.INT32), "llama.attention.sliding_window = -1 must be >= 0"),
    ("llama.attn_logit_softcapping", 50.0, "llama.attn_logit_softcapping = 50.0"),
    ("llama.final_logit_softcapping", 30.0, "llama.final_logit_softcapping = 30.0"),
    ("llama.expert_count", (8, ValueType.UINT32), "llama.expert_count = 8"),
    ("llama.attention.layer_norm_epsilon", 1e-5, "llama.attention.layer_norm_epsilon"),
    ("llama.rope.dimension_count", (8, ValueType.UINT32), "RoPE on part of a head"),
    ("llama.attention.value_length", (8, ValueType.UINT32), "differs from the key length 16"),
    ("llama.vocab_size", (1000, ValueType.UINT32), "llama.vocab_size = 1000 but token_embd.weight has 260 rows"),
    ("split.count", (3, ValueType.UINT16), "split across 3 files"),
    ("split.count", "two", "split.count = two"),
    ("llama.attention.head_count", (0, ValueType.UINT32), "llama.attention.head_count = 0 must be positive"),
    ("llama.attention.head_count_kv", (3, ValueType.UINT32), "head_count_kv = 3 does not divide"),
    ("llama.context_length", (0, ValueType.UINT32), "llama.context_length = 0 must be positive"),
    ("llama.block_count", (0, ValueType.UINT32), "llama.block_count = 0 must be positive"),
    ("llama.rope.freq_base", float("nan"), "llama.rope.freq_base = nan is not a finite float32 number"),
    ("llama.rope.freq_base", -1.0, "llama.rope.freq_base = -1.0 must be"),
    ("llama.attention.layer_norm_rms_epsilon", float("inf"), "layer_norm_rms_epsilon = inf is not a finite"),
    ("llama.attention.layer_norm_rms_epsilon", -1e-5, "must be a finite number in [0, 1)"),
    ("mixture.router", "top2", "metadata key mixture.router = 'top2' is not known"),
    # Values a float64 or the wrong type carries: the forward pass's parameters are float32
    ("llama.rope.freq_base", 1e300, "llama.rope.freq_base = 1e+300 is not a finite float32 number"),
    ("llama.rope.scale_linear", (1e-300, ValueType.FLOAT64), "llama.rope.scale_linear = 1e-300 is not a finite"),
    ("llama.rope.scale_linear", "abc", "llama.rope.scale_linear = 'abc' is not a number"),
    ("llama.vocab_size", "abc", "llama.vocab_size = 'abc' is not an integer"),
]


# Keys the writer sets itself: the test changes the value it wrote.
WRITTEN = {"llama.rope.dimension_count", "llama.vocab_size", "llama.attention.head_count",
           "llama.attention.head_count_kv", "llama.context_length", "llama.block_count", "llama.rope.freq_base",
           "llama.attention.layer_norm_rms_epsilon"}


@pytest.mark.parametrize(("key", "value", "message"), REFUSED_KEYS, ids=[k[0] + "=" + str(k[1]) for k in REFUSED_KEYS])
def test_unimplemented_key_refuses_the_file(tmp_path: Path, key: str, value: object, message: str) -> None:
    written_anyway = key in WRITTEN
    reader = GGUFReader(write(tmp_path, metadata={} if written_anyway else {key: value}))
    if written_anyway:  # the writer sets these keys: change the value it wrote
        reader.metadata[key] = value[0] if isinstance(value, tuple) else value
    with pytest.raises(UnsupportedModelError, match=_rx(message)):
        describe(reader)
    with pytest.raises(ValueError, match=_rx(message)):
        Model(reader)


def test_a_vocabulary_that_disagrees_with_the_embedding_refuses_the_file(tmp_path: Path) -> None:
    """Sampling picks among the embedding's rows, and the tokenizer must name each of them: a
    count that differs is refused at load, naming both, rather than at the first sampled token."""
    reader = GGUFReader(write(tmp_path))
    assert len(reader.metadata["tokenizer.ggml.tokens"]) == 260
    for n in (10, 300):
        reader.metadata["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(n)]
        message = f"tokenizer.ggml.tokens has {n} entries but token_embd.weight has 260 rows"
        with pytest.raises(UnsupportedModelError, match=message):
            describe(reader)
        with pytest.raises(ValueError, match=message):
            Model(reader)


def test_load_errors_name_the_file_and_the_key(tmp_path: Path) -> None:
    path = write(tmp_path)
    reader = GGUFReader(path)
    reader.metadata["llama.block_count"] = 2**31
    with pytest.raises(ValueError, match=_rx(f"{path}: n_layer (the file's block_count) must be at most 100000, "
                                             "got 2147483648")):
        Model(reader)


REFUSED_TENSORS = [
    ("blk.0.attn_q.bias", (64,)),
    ("blk.1.attn_output.bias", (64,)),
    ("blk.0.attn_q_norm.weight", (16,)),
    ("blk.0.post_attention_norm.weight", (64,)),
    ("output.bias", (260,)),
    ("rope_factors_long.weight", (8,)),
    ("blk.0.ffn_gate_inp.weight", (4, 64)),
]


@pytest.mark.parametrize(("name", "shape"), REFUSED_TENSORS, ids=[t[0] for t in REFUSED_TENSORS])
def test_unused_tensor_refuses_the_file(tmp_path: Path, name: str, shape: tuple[int, ...]) -> None:
    path = write(tmp_path, tensors={name: np.ones(shape, np.float32)})
    with pytest.raises(UnsupportedModelError, match=_rx(f"tensor {name} is not used by the llama architecture")):
        Model.load(path)
    # The reference and `info` read the same description.
    with pytest.raises(UnsupportedModelError, match=_rx(name)):
        R.load_model(GGUFReader(path))
    info = model_info(GGUFReader(path))
    assert name in info["unsupported"]
    assert "not supported: " in format_info(info)


@pytest.mark.parametrize(("name", "shape", "message"), [
    ("blk.0.attn_norm.weight", (2, 32), "blk.0.attn_norm.weight: expected a vector of 64 float32 values, got shape "
                                        "[2, 32]"),
    ("blk.0.ffn_down.weight", (2, 32, 128), "tensor blk.0.ffn_down.weight has shape [128, 32, 2]: a vector or a "
                                            "matrix was expected"),
])
def test_a_tensor_of_the_right_size_and_the_wrong_shape_refuses_the_file(tmp_path: Path, name: str,
                                                                        shape: tuple[int, ...], message: str) -> None:
    path = write_synthetic(tmp_path / "m.gguf", SHAPE, GGMLType.F32, seed=3, omit=(name,),
                           tensors={name: np.ones(shape, np.float32)})
    with pytest.raises(ValueError, match=_rx(message)):
        Model.load(path)


def test_native_model_refuses_a_tensor_its_architecture_does_not_read(tmp_path: Path) -> None:
    """The C++ side is a safety net of its own: every tensor handed over must be read."""
    r = GGUFReader(write(tmp_path))
    d = describe(r)
    tensors = {n: (r.tensor(n), int(r.tensors[n].type), r.tensors[n].n_elements // r.tensors[n].shape[0],
                   r.tensors[n].shape[0]) for n in d.tensors}
    tensors["blk.0.extra.weight"] = tensors["blk.0.attn_norm.weight"]
    with pytest.raises(ValueError, match="tensor blk.0.extra.weight is not used by architecture llama"):
        _C.Model("llama", d.config.params(), tensors)
    with pytest.raises(ValueError, match="architecture 'gemma9' is not supported"):
        _C.Model("gemma9", d.config.params(), {})
    assert "llama" in _C.architectures()


def test_harmless_keys_and_tensors_load(tmp_path: Path) -> None:
    md = {"llama.rope.scaling.type": "none", "llama.rope.scaling.original_context_length": (8192, ValueType.UINT32),
          "llama.rope.scaling.finetuned": (True, ValueType.BOOL), "general.url": "https://example.org",
          "quantize.imatrix.chunks_count": (10, ValueType.UINT32), "split.count": (1, ValueType.UINT16)}
    plain = Model.load(write(tmp_path, "a.gguf"), precision="exact")
    m = Model.load(write(tmp_path, "b.gguf", metadata=md,
                         tensors={"blk.0.attn_rot_embd": np.ones(8, np.float32)}), precision="exact")
    ids = list(range(10, 40))
    np.testing.assert_array_equal(m.logits(ids), plain.logits(ids))
    assert "blk.0.attn_rot_embd" not in describe(m.reader).tensors


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    r = GGUFReader(write(tmp_path))
    r.metadata["general.architecture"] = "mamba"
    with pytest.raises(UnsupportedModelError, match="architecture 'mamba' is not supported"):
        Model(r)


def test_key_length_other_than_width_over_heads(tmp_path: Path) -> None:
    """attention.key_length sets the head dim (here 32 at width 64 with 4 heads)."""
    shape = Shape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=260, n_ctx=256, key_length=32)
    path = write(tmp_path, shape=shape)
    r = GGUFReader(path)
    assert describe(r).config.head_dim == 32
    ids = list(range(50, 80))
    got = Model(r, precision="exact").logits(ids)
    ref = R.forward(r, ids)
    assert np.max(np.abs(got - ref)) <= 1e-4 * max(1.0, float(np.max(np.abs(ref))))


# ---- RoPE scaling: Llama 3's frequency factors, linear interpolation --------------------------


def llama3_factors(head_dim: int, base: float, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """The divisor of each pair's frequency under Llama 3's rope_scaling (rope_type "llama3"):
    wavelengths shorter than original / high keep their frequency, those longer than
    original / low are slowed by `factor`, and the band between blends the two."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    out = np.empty_like(inv)
    for i, f in enumerate(inv):
        wavelen = 2 * math.pi / f
        if wavelen < original / high:
            out[i] = 1.0
        elif wavelen > original / low:
            out[i] = factor
        else:
            smooth = (original / wavelen - low) / (high - low)
            out[i] = 1.0 / ((1 - smooth) / factor + smooth)
    return out


def independent_forward(r: GGUFReader, ids: list[int], inv_freq: np.ndarray) -> np.ndarray:
    """The llama forward pass in float64 with RoPE as complex rotations by pos * inv_freq:
    written from the definitions, sharing nothing with pyinfer.reference."""
    md = r.metadata
    n_head, n_kv = md["llama.attention.head_count"], md["llama.attention.head_count_kv"]
    eps = md["llama.attention.layer_norm_rms_epsilon"]
    w = {n: r.dequantize(n).astype(np.float64) for n in r.tensors}
    n = len(ids)
    x = w["token_embd.weight"][ids]
    hd = x.shape[1] // n_head
    rot = np.exp(1j * np.arange(n)[:, None] * inv_freq[None, :])  # [n, hd/2]

    def norm(v: np.ndarray, name: str) -> np.ndarray:
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w[name]

    def rope(v: np.ndarray, heads: int) -> np.ndarray:
        c = v.reshape(n, heads, hd // 2, 2)
        z = (c[..., 0] + 1j * c[..., 1]) * rot[:, None, :]
        return np.stack([z.real, z.imag], -1).reshape(n, heads, hd)

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for layer in range(md["llama.block_count"]):
        p = f"blk.{layer}."
        h = norm(x, p + "attn_norm.weight")
        q, k = rope(h @ w[p + "attn_q.weight"].T, n_head), rope(h @ w[p + "attn_k.weight"].T, n_kv)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
        out = np.empty((n, n_head, hd))
        for head in range(n_head):
            g = head // (n_head // n_kv)
            s = q[:, head] @ k[:, g].T / math.sqrt(hd) + mask
            pr = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (pr / pr.sum(-1, keepdims=True)) @ v[:, g]
        x = x + out.reshape(n, -1) @ w[p + "attn_output.weight"].T
        h = norm(x, p + "ffn_norm.weight")
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    return norm(x, "output_norm.weight") @ w["output.weight"].T


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


IDS = [int(i) for i in np.random.default_rng(5).integers(0, 256, 96)]


def test_llama3_rope_factors_match_an_independent_forward(tmp_path: Path) -> None:
    hd = SHAPE.head_dim
    factors = llama3_factors(hd, 10000.0, factor=8.0, low=1.0, high=4.0, original=32).astype(np.float32)
    assert factors.min() == 1.0 and factors.max() == 8.0 and ((factors > 1) & (factors < 8)).any()
    path = write(tmp_path, tensors={"rope_freqs.weight": factors})
    r = GGUFReader(path)
    inv = 10000.0 ** (-np.arange(0, hd, 2) / hd)
    ref = independent_forward(r, IDS, inv / factors.astype(np.float64))
    exact = Model(r, precision="exact").logits(IDS)
    assert _rel_err(exact, ref) <= 2e-5
    assert _rel_err(R.forward(r, IDS), ref) <= 1e-9
    # The fast path within its quantization error, and far closer than a model ignoring them.
    ignored = independent_forward(r, IDS, inv)
    assert _rel_err(ignored, ref) > 1e-2
    fast = Model(r).logits(IDS)
    assert _rel_err(fast, ref) <= 0.2 * _rel_err(ignored, ref)


def test_rope_factors_of_one_change_nothing(tmp_path: Path) -> None:
    plain = Model.load(write(tmp_path, "a.gguf"))
    ones = Model.load(write(tmp_path, "b.gguf", tensors={"rope_freqs.weight": np.ones(SHAPE.head_dim // 2, np.float32)}))
    np.testing.assert_array_equal(ones.logits(IDS), plain.logits(IDS))


def test_legacy_linear_scaling_key_defers_to_the_new_one(tmp_path: Path) -> None:
    both = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0, "llama.rope.scale_linear": 4.0}
    assert describe(GGUFReader(write(tmp_path, "a.gguf", metadata=both))).config.rope_freq_scale == 0.25
    legacy = {"llama.rope.scale_linear": 2.0}
    assert describe(GGUFReader(write(tmp_path, "b.gguf", metadata=legacy))).config.rope_freq_scale == 0.5


def test_linear_rope_scaling_matches_an_independent_forward(tmp_path: Path) -> None:
    md = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    r = GGUFReader(write(tmp_path, metadata=md))
    assert describe(r).config.rope_freq_scale == 0.25
    hd = SHAPE.head_dim
    ref = independent_forward(r, IDS, 0.25 * 10000.0 ** (-np.arange(0, hd, 2) / hd))
    assert _rel_err(Model(r, precision="exact").logits(IDS), ref) <= 2e-5
    assert _rel_err(R.forward(r, IDS), ref) <= 1e-9


@pytest.mark.parametrize("bad", [np.zeros(8), np.full(8, np.nan), np.ones(4)])
def test_bad_rope_factors_are_refused(tmp_path: Path, bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="rope_freqs.weight"):
        Model.load(write(tmp_path, tensors={"rope_freqs.weight": bad.astype(np.float32)}))


def test_rope_op_with_factors_against_the_reference() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 2 * 16)).astype(np.float32)
    factors = llama3_factors(16, 10000.0, 8.0, 1.0, 4.0, 16).astype(np.float32)
    for isa in _C.cpu_info()["available"]:
        prev = _C.get_isa()
        _C.set_isa(isa)
        try:
            y = _C.rope(x.copy(), 3, 2, 16, 10000.0, freq_scale=0.5, factors=factors)
        finally:
            _C.set_isa(prev)
        ref = R.rope(x, 3, 2, 16, 10000.0, freq_scale=0.5, factors=factors)
        assert np.max(np.abs(y - ref)) <= 4 * np.finfo(np.float32).eps * np.max(np.abs(x)) * 2
    with pytest.raises(ValueError, match="factors must have shape"):
        _C.rope(x.copy(), 0, 2, 16, 1e4, factors=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="factors must be > 0"):
        _C.rope(x.copy(), 0, 2, 16, 1e4, factors=np.zeros(8, np.float32))


def _rx(s: str) -> str:
    import re

    return re.escape(s)


def test_sequences_and_batches_keep_their_weights_alive(tmp_path: Path) -> None:
    """A sequence or batch outliving every other reference to its model keeps the arrays the
    weights point into (here heap copies) alive, and computes from them; the last one gone,
    they are freed."""
    import gc
    import weakref

    r = GGUFReader(write(tmp_path))
    d = describe(r)
    ids = np.array(IDS[:8], np.int32)

    def model() -> tuple[_C.Model, weakref.ref[np.ndarray]]:
        t = {n: (r.tensor(n).copy(), int(r.tensors[n].type), r.tensors[n].n_elements // r.tensors[n].shape[0],
                 r.tensors[n].shape[0]) for n in d.tensors}
        return _C.Model("llama", d.config.params(), t, False), weakref.ref(t["blk.0.attn_q.weight"][0])

    def logits(seq: _C.Sequence) -> np.ndarray:
        out = np.empty((1, SHAPE.n_vocab), np.float32)
        seq.truncate(0)
        seq.eval(ids, out, False, "exact", 1)
        return out

    m, weights = model()
    seq = _C.Sequence(m, 64, 8)
    first = logits(seq)
    del m
    gc.collect()
    assert weights() is not None
    np.testing.assert_array_equal(logits(seq), first)
    del seq
    gc.collect()
    assert weights() is None

    m, weights = model()
    batch, seq = _C.Batch(m, 2), _C.Sequence(m, 64, 8)
    del m, seq
    gc.collect()
    assert weights() is not None
    del batch
    gc.collect()
    assert weights() is None


@pytest.mark.parametrize("wtype", [GGMLType.F32, GGMLType.F16, GGMLType.BF16])
def test_float_matrices_are_copied_and_give_the_same_logits(tmp_path: Path, wtype: GGMLType) -> None:
    """On the SIMD paths a float model's matrices are copied as stored beside the repacked
    ones (the file's page-cache pages may be small ones): every matrix is counted in
    repacked_bytes, and the logits are the bits of the matrices read in place from the file."""
    path = write_synthetic_llama(tmp_path / "m.gguf", SHAPE, wtype, seed=3)
    copied = Model.load(path, repack=True)
    in_place = Model.load(path, repack=False)
    tensors = GGUFReader(path).tensors  # the head is a matrix of its own (output.weight)
    matrices = [t for n, t in tensors.items() if n != "token_embd.weight" and len(t.shape) == 2]
    assert len(matrices) == 7 * SHAPE.n_layer + 1 and all(t.type == wtype for t in matrices)
    size = 4 if wtype == GGMLType.F32 else 2
    assert copied.repacked_bytes == sum(-(-t.n_elements * size // 64) * 64 for t in matrices)
    assert in_place.repacked_bytes == 0
    for precision in ("fast", "exact"):
        a = Model.load(path, repack=True, precision=precision).logits(IDS)
        b = Model.load(path, repack=False, precision=precision).logits(IDS)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
