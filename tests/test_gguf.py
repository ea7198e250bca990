"""GGUF reader and writer: every value type, every tensor type, dequantization against an
independent implementation (the `gguf` package) and hand-built blocks, and the real model."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf as gguf_ref
import numpy as np
import pytest

from pyinfer import quants
from pyinfer.gguf import BLOCK_SIZES, GGMLType, GGUFReader, GGUFWriter, ValueType
from pyinfer.gguf_types import TYPE_TRAITS

rng = np.random.default_rng(1234)
DEQUANT_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0,
                 GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K]
QUANTIZE_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1,
                  GGMLType.Q5_0]


def random_blocks(t: GGMLType, n_blocks: int) -> np.ndarray:
    """Random raw bytes with every fp16 field set to a finite scale (incl. negative, subnormal)."""
    nbytes = BLOCK_SIZES[t][1]
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    scales = rng.choice(np.array([0.0, 1e-7, -3e-6, 0.01, -0.5, 2.0, 65504.0], np.float16), size=(n_blocks, 2))
    scales = np.where(rng.random((n_blocks, 2)) < 0.5, rng.standard_normal((n_blocks, 2)).astype(np.float16), scales)
    field = scales.astype("<f2").view(np.uint8)
    tr = TYPE_TRAITS[t]
    if tr.block_elems > 1:
        raw[:, tr.d_offset:tr.d_offset + 2] = field[:, 0:2]
        if tr.has_min:
            raw[:, tr.m_offset:tr.m_offset + 2] = field[:, 2:4]
    elif t == GGMLType.F16:
        raw = rng.standard_normal(n_blocks).astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    elif t == GGMLType.F32:
        raw = rng.standard_normal(n_blocks).astype("<f4").view(np.uint8).reshape(n_blocks, 4)
    return raw.reshape(-1)


@pytest.mark.parametrize("t", DEQUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_blocks", [1, 3, 17, 64])
def test_dequantize_matches_gguf_package(t, n_blocks):
    raw = random_blocks(t, n_blocks)
    ours = quants.dequantize(raw, t)
    theirs = gguf_ref.quants.dequantize(raw, gguf_ref.GGMLQuantizationType(int(t))).reshape(-1)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs.astype(np.float32))


def _f16(x: float) -> bytes:
    return np.float16(x).tobytes()


def test_q4_0_hand_built_block():
    qs = bytes((lo | (hi << 4)) for lo, hi in zip(range(16), range(15, -1, -1)))
    out = quants.dequantize(np.frombuffer(_f16(0.5) + qs, np.uint8), GGMLType.Q4_0)
    expected = [(q - 8) * 0.5 for q in range(16)] + [(q - 8) * 0.5 for q in range(15, -1, -1)]
    assert out.tolist() == expected


def test_q4_1_hand_built_block():
    qs = bytes((q | (q << 4)) for q in range(16))
    out = quants.dequantize(np.frombuffer(_f16(0.25) + _f16(-1.0) + qs, np.uint8), GGMLType.Q4_1)
    assert out.tolist() == [q * 0.25 - 1.0 for q in range(16)] * 2


def test_q8_0_hand_built_block():
    qs = np.arange(-16, 16, dtype=np.int8).tobytes()
    out = quants.dequantize(np.frombuffer(_f16(-2.0) + qs, np.uint8), GGMLType.Q8_0)
    assert out.tolist() == [q * -2.0 for q in range(-16, 16)]


def test_q4_k_hand_built_block():
    # Sub-block j has scale j+1 and min 2j (6-bit packing: low 6 bits in bytes 0..7 for j < 4,
    # nibbles in bytes 8..11 plus the top two bits of bytes 0..7 for j >= 4).
    sc = [j + 1 for j in range(8)]
    mn = [2 * j for j in range(8)]
    packed = [0] * 12
    for j in range(4):
        packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        packed[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6)
        packed[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4)
    qs = bytes(((i % 16) | ((15 - i % 16) << 4)) for i in range(128))
    raw = np.frombuffer(_f16(0.5) + _f16(0.25) + bytes(packed) + qs, np.uint8)
    out = quants.dequantize(raw, GGMLType.Q4_K).reshape(8, 32)
    for j in range(8):
        q = [(i % 16) if j % 2 == 0 else 15 - i % 16 for i in range(32)]
        assert out[j].tolist() == [0.5 * sc[j] * v - 0.25 * mn[j] for v in q]


@pytest.mark.parametrize("t", QUANTIZE_TYPES, ids=lambda t: t.name)
def test_quantize_error_bounded_and_idempotent(t):
    x = rng.standard_normal((6, 64)).astype(np.float32)
    raw = quants.quantize(x, t)
    y = quants.dequantize(raw, t).reshape(x.shape)
    amax = np.abs(x.reshape(-1, 32)).max(axis=1)
    # Per-block bound: half a quantization step (Q8_0: amax/127; Q4_1: range/15), except Q4_0
    # and Q5_0, whose grids are [-8, 7] steps of amax/8 and [-16, 15] of amax/16: a value at
    # +amax can be a whole step off. Plus the fp16 rounding of the scale (relative 2^-11 of
    # amax at most, per element).
    vmax = x.reshape(-1, 32).max(axis=1)
    vmin = x.reshape(-1, 32).min(axis=1)
    bound = {GGMLType.Q8_0: amax / 127 / 2, GGMLType.Q4_0: amax / 8, GGMLType.Q4_1: (vmax - vmin) / 15 / 2,
             GGMLType.Q5_0: amax / 16}
    err = np.abs(y - x).reshape(-1, 32).max(axis=1)
    if t == GGMLType.F32:
        assert np.array_equal(x, y)
    elif t in (GGMLType.F16, GGMLType.BF16):
        eps = 2.0**-11 if t == GGMLType.F16 else 2.0**-8
        assert np.all(np.abs(y - x) <= eps * np.abs(x))
    else:
        assert np.all(err <= bound[t] + amax * 2.0**-10), (err / amax).max()
    # Values that are already on the grid survive another round exactly.
    assert np.array_equal(quants.quantize(y, t), raw)


def k_quant_bound(x: np.ndarray, t: GGMLType) -> np.ndarray:
    """Per sub-block bound on |dequantize(quantize(x)) - x| of the simple K-quantizers: half a
    step, plus what rounding the sub-block scales (and mins) to 6 or 8 bits of the super-block's
    can move the grid's ends, plus the fp16 rounding of d and dmin."""
    if t == GGMLType.Q4_K:
        sub = x.reshape(-1, 8, 32).astype(np.float64)
        lo = np.minimum(sub.min(axis=2), 0)
        step = (sub.max(axis=2) - lo) / 15
        d, dmin = step.max(axis=1, keepdims=True) / 63, (-lo).max(axis=1, keepdims=True) / 63
        # The step moves by d/2 and the min by dmin/2, so the grid's top moves by 15 d/2 + dmin/2.
        return step / 2 + d / 2 + (15 * d + dmin) / 2 + 2.0**-9 * np.abs(sub).max(axis=(1, 2))[:, None]
    sub = x.reshape(-1, 16, 16).astype(np.float64)  # Q6_K: grids [-32, 31] steps of |v|max/32
    step = np.abs(sub).max(axis=2) / 32
    d = step.max(axis=1, keepdims=True) / 127
    # +|v|max can be a whole step off (the grid ends at 31), and the step moves by d/2, so
    # the grid's ends move by 32 d/2.
    return step + d / 2 + 32 * d / 2 + 2.0**-9 * np.abs(sub).max(axis=(1, 2))[:, None]


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
def test_k_quantizers_are_valid_and_close(t):
    """The K-quant blocks the writer makes read the same in the gguf package (so they are
    valid blocks of the type), and hold the values within the quantizer's bound."""
    x = (rng.standard_normal((6, 512)) * rng.uniform(0.01, 100, (6, 1))).astype(np.float32)
    x[0, :256] = 0                           # an all-zero super-block
    x[1] = np.abs(x[1])                      # all positive: no min below zero
    x[2, :32] *= 1000                        # one loud sub-block beside quiet ones
    x[3, 256:] = -np.abs(x[3, 256:])         # all negative
    raw = quants.quantize(x, t)
    assert raw.size == x.size // 256 * BLOCK_SIZES[t][1]
    y = quants.dequantize(raw, t).reshape(x.shape)
    theirs = gguf_ref.quants.dequantize(raw.reshape(x.size // 256, -1), gguf_ref.GGMLQuantizationType(int(t)))
    np.testing.assert_array_equal(y.reshape(-1), theirs.astype(np.float32).reshape(-1))
    n_sub = 8 if t == GGMLType.Q4_K else 16
    err = np.abs(y - x).astype(np.float64).reshape(-1, n_sub, 256 // n_sub).max(axis=2)
    assert np.all(err <= k_quant_bound(x, t)), (err / k_quant_bound(x, t)).max()
    assert np.array_equal(y[0, :256], np.zeros(256, np.float32))
    # Typical error: well under a step (about a third of one on random data).
    assert np.sqrt(np.mean((y[4:] - x[4:]) ** 2)) < 0.05 * np.abs(x[4:]).max()


def test_writer_round_trip_all_value_types(tmp_path):
    w = GGUFWriter(tmp_path / "kv.gguf", version=3)
    scalars = {
        ValueType.UINT8: 255, ValueType.INT8: -128, ValueType.UINT16: 65535, ValueType.INT16: -32768,
        ValueType.UINT32: 2**32 - 1, ValueType.INT32: -(2**31), ValueType.FLOAT32: 1.5,
        ValueType.BOOL: True, ValueType.STRING: "héllo ✓", ValueType.UINT64: 2**64 - 1,
        ValueType.INT64: -(2**63), ValueType.FLOAT64: 1e300,
    }
    for vt, v in scalars.items():
        w.add(f"s.{vt.name}", v, vt)
    arrays = {
        ValueType.UINT8: np.array([0, 255], np.uint8), ValueType.INT8: np.array([-1, 1], np.int8),
        ValueType.UINT16: np.array([7], np.uint16), ValueType.INT16: np.array([-7], np.int16),
        ValueType.UINT32: np.array([1, 2, 3], np.uint32), ValueType.INT32: np.array([-3], np.int32),
        ValueType.FLOAT32: np.array([0.5, -2.0], np.float32), ValueType.BOOL: np.array([True, False]),
        ValueType.UINT64: np.array([2**64 - 1], np.uint64), ValueType.INT64: np.array([-5], np.int64),
        ValueType.FLOAT64: np.array([1e-300], np.float64),
    }
    for vt, v in arrays.items():
        w.add(f"a.{vt.name}", v, ValueType.ARRAY, vt)
    w.add("a.STRING", ["", "x", "日本語", "<|im_start|>"])
    w.add("a.EMPTY", [], ValueType.ARRAY, ValueType.UINT32)
    w.write()

    r = GGUFReader(tmp_path / "kv.gguf")
    for vt, v in scalars.items():
        assert r.metadata[f"s.{vt.name}"] == v and r.metadata_types[f"s.{vt.name}"] == (vt,)
    for vt, v in arrays.items():
        got = r.metadata[f"a.{vt.name}"]
        assert np.array_equal(got, v) and got.dtype == v.dtype
        assert r.metadata_types[f"a.{vt.name}"] == (ValueType.ARRAY, vt)
    assert r.metadata["a.STRING"] == ["", "x", "日本語", "<|im_start|>"]
    assert len(r.metadata["a.EMPTY"]) == 0
    # The independent reader agrees on the values.
    ref = gguf_ref.GGUFReader(tmp_path / "kv.gguf")
    assert ref.fields["s.STRING"].contents() == "héllo ✓"
    assert ref.fields["s.UINT64"].contents() == 2**64 - 1


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("alignment", [32, 64])
def test_writer_round_trip_tensors(tmp_path, version, alignment):
    path = tmp_path / "t.gguf"
    w = GGUFWriter(path, version=version, alignment=alignment)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    for t in QUANTIZE_TYPES:
        w.add_tensor(f"q.{t.name}", x, t)
    raws = {t: random_blocks(t, 6) for t in (GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q5_0)}
    for t, raw in raws.items():
        elems = 6 * BLOCK_SIZES[t][0]
        w.add_raw_tensor(f"r.{t.name}", raw, (elems // 2, 2), t)
    w.write()

    r = GGUFReader(path)
    assert r.version == version and r.alignment == alignment
    for t in QUANTIZE_TYPES:
        info = r.tensors[f"q.{t.name}"]
        assert info.shape == (64, 4, 3) and info.type == t and info.offset % alignment == 0
        assert np.array_equal(r.raw(info.name), quants.quantize(x, t))
        assert r.dequantize(info.name).shape == (3, 4, 64)
    for t, raw in raws.items():
        assert np.array_equal(r.raw(f"r.{t.name}"), raw)
    ref = gguf_ref.GGUFReader(path)
    for rt in ref.tensors:
        ours = r.dequantize(rt.name).reshape(-1)
        assert np.array_equal(ours, gguf_ref.quants.dequantize(rt.data, rt.tensor_type).reshape(-1))


def test_tensor_views_are_zero_copy(tmp_path):
    path = tmp_path / "z.gguf"
    w = GGUFWriter(path)
    w.add_tensor("f", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("q", np.arange(64, dtype=np.float32).reshape(2, 32), GGMLType.Q4_1)
    w.write()
    r = GGUFReader(path)
    f, q = r.tensor("f"), r.tensor("q")
    assert f.shape == (2, 32) and f.dtype == np.float32 and not f.flags.writeable
    assert q.shape == (2, 20) and q.dtype == np.uint8
    assert np.shares_memory(f, r.raw("f"))
    assert f[1, 3] == 35.0
    r.close()  # views handed out stay valid
    assert f[1, 3] == 35.0
    with GGUFReader(path) as r2:
        assert r2.tensors["q"].type == GGMLType.Q4_1


def test_writer_rejects_bad_input(tmp_path):
    w = GGUFWriter(tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="empty"):
        w.add("", 1)
    w.add("k", 1)
    with pytest.raises(ValueError, match="duplicate"):
        w.add("k", 2)
    with pytest.raises(ValueError, match="block size"):
        w.add_tensor("t", np.ones(33, np.float32), GGMLType.Q8_0)
    with pytest.raises(NotImplementedError, match="Q2_K"):
        w.add_tensor("t", np.ones(256, np.float32), GGMLType.Q2_K)
    with pytest.raises(ValueError, match="bytes given"):
        w.add_raw_tensor("t", np.zeros(10, np.uint8), (32,), GGMLType.Q8_0)
    with pytest.raises(ValueError, match="power of two"):
        GGUFWriter(tmp_path / "y.gguf", alignment=24)


def test_default_model_tensors(default_model):
    r = GGUFReader(default_model)
    ref = gguf_ref.GGUFReader(default_model)
    assert len(r.tensors) == 272 == len(ref.tensors)
    for rt in ref.tensors:
        t = r.tensors[rt.name]
        assert list(t.shape) == [int(d) for d in rt.shape]
        assert int(t.type) == int(rt.tensor_type)
        assert t.nbytes == rt.n_bytes and t.offset == rt.data_offset
    counts = {}
    for t in r.tensors.values():
        counts[t.type.name] = counts.get(t.type.name, 0) + 1
    assert counts == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert r.metadata["general.architecture"] == "llama"
    assert len(r.metadata["tokenizer.ggml.tokens"]) == 49152
    assert r.metadata["tokenizer.ggml.merges"][0].count(" ") == 1
    # Dequantization of real tensors agrees with the independent implementation.
    for name in ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight", "output_norm.weight"]:
        rt = next(x for x in ref.tensors if x.name == name)
        theirs = gguf_ref.quants.dequantize(rt.data, rt.tensor_type)
        assert np.array_equal(r.dequantize(name), theirs.reshape(r.tensors[name].np_shape))


def test_info_cli_reports_default_model(default_model, tmp_path):
    out = subprocess.run([sys.executable, "-m", "pyinfer", "info", str(default_model), "--json"],
                         check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    info = json.loads(out)
    r = GGUFReader(default_model)
    assert info["n_tensors"] == 272
    assert [(t["name"], tuple(t["shape"]), t["type"]) for t in info["tensors"]] == [
        (t.name, t.shape, t.type.name) for t in r.tensors.values()]
    assert (info["n_layer"], info["n_embd"], info["n_head"], info["n_head_kv"], info["n_ff"], info["n_vocab"]) == (
        30, 576, 9, 3, 1536, 49152)
    assert info["tied_embeddings"] and info["tokenizer_model"] == "gpt2" and info["tokenizer_pre"] == "smollm"
    assert abs(info["weight_bytes_per_token"] / 1e6 - 96.5) < 0.2
    # K and V, 30 layers x 3 heads x 64, per token.
    assert info["kv_bytes_per_token"] == {"f32": 46080, "f16": 23040, "q8_0": 12960}
    text = subprocess.run([sys.executable, "-m", "pyinfer", "info", str(default_model)],
                          check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    assert "272: 210 Q4_1, 61 F32, 1 Q8_0" in text and "96.6 MB of weights per token" in text
