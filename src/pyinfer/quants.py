"""GGUF block formats in NumPy: dequantization of every type pyinfer reads, and
quantization for the types its writer produces. This is the executable spec the C++
dequantization kernels are tested against; it favours clarity over speed.

Arithmetic is float32 in the same order as the C++ scalar kernels (a multiply, then an
add; never a fused multiply-add), so results match them bit for bit.
"""

from __future__ import annotations

import numpy as np

from pyinfer.gguf_types import BLOCK_SIZES, TYPE_TRAITS, GGMLType

_F32 = np.float32


def _f16(col: np.ndarray) -> np.ndarray:
    """A (n_blocks, 2) uint8 column pair holding fp16 bits -> (n_blocks, 1) float32."""
    return np.ascontiguousarray(col).view("<f2").astype(_F32)


def _blocks(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    block_bytes = BLOCK_SIZES[ggml_type][1]
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size % block_bytes:
        raise ValueError(f"{raw.size} bytes is not a whole number of {ggml_type.name} blocks")
    return raw.reshape(-1, block_bytes)


def _d(b: np.ndarray, t: GGMLType) -> np.ndarray:
    """Blocks' fp16 scale d, (n_blocks, 1) float32."""
    o = TYPE_TRAITS[t].d_offset
    return _f16(b[:, o:o + 2])


def _m(b: np.ndarray, t: GGMLType) -> np.ndarray:
    """Blocks' fp16 min (or dmin), (n_blocks, 1) float32."""
    o = TYPE_TRAITS[t].m_offset
    return _f16(b[:, o:o + 2])


def _qs(b: np.ndarray, t: GGMLType) -> np.ndarray:
    """Blocks' quant bytes (their low bits, where split)."""
    tr = TYPE_TRAITS[t]
    return b[:, tr.qs_offset:tr.qs_offset + tr.qs_bytes]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Blocks of 16 packed bytes -> 32 values: low nibbles are elements 0..15, high 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def dequantize(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """Raw GGUF tensor bytes of the given type -> a flat float32 array."""
    t = GGMLType(ggml_type)
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if t == GGMLType.F32:
        return raw.view("<f4").astype(_F32)
    if t == GGMLType.F16:
        return raw.view("<f2").astype(_F32)
    if t == GGMLType.BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(_F32)
    b = _blocks(raw, t)
    bias = TYPE_TRAITS[t].q_bias
    if t == GGMLType.Q8_0:
        return (_qs(b, t).view(np.int8).astype(_F32) * _d(b, t)).reshape(-1)
    if t == GGMLType.Q4_0:
        q = _nibbles(_qs(b, t)).astype(np.int8) - np.int8(bias)
        return (q.astype(_F32) * _d(b, t)).reshape(-1)
    if t == GGMLType.Q4_1:
        q = _nibbles(_qs(b, t)).astype(_F32)
        return (q * _d(b, t) + _m(b, t)).reshape(-1)
    if t in (GGMLType.Q5_0, GGMLType.Q5_1):
        o = TYPE_TRAITS[t].qs_offset - 4  # the fifth bits lie just before the nibbles
        qh = np.ascontiguousarray(b[:, o:o + 4]).view("<u4")  # (nb, 1): bit j is element j's fifth bit
        bit = (qh >> np.arange(32, dtype=np.uint32)) & 1
        q = _nibbles(_qs(b, t)).astype(np.int32) | (bit.astype(np.int32) << 4)
        if t == GGMLType.Q5_1:
            return (q.astype(_F32) * _d(b, t) + _m(b, t)).reshape(-1)
        return ((q - bias).astype(_F32) * _d(b, t)).reshape(-1)
    if t in (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K):
        return _dequantize_k(b, t)
    raise NotImplementedError(f"dequantization of {t.name} is not implemented")


def q4_k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack Q4_K's 12 scale bytes into 8 six-bit scales and 8 six-bit mins per block."""
    s = scales.astype(np.uint8)
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def k_quant_parts(b: np.ndarray, t: GGMLType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K, Q5_K or Q6_K blocks (n_blocks, block bytes) as 32-element sub-blocks: the integer
    quants q (n_blocks, 8, 32) int32, and per sub-block the float32 scale and offset (n_blocks,
    8), value = scale * q - offset. Q4_K and Q5_K: q the stored quant, scale = d * sc and
    offset = dmin * mn. Q6_K: q = sc * (stored - 32), with sc the int8 scale of the element's
    16-element half-sub-block, scale = d and offset 0."""
    nb = b.shape[0]
    if t in (GGMLType.Q4_K, GGMLType.Q5_K):
        # d (f16), dmin (f16), 12 scale bytes, [Q5_K: 32 bytes of fifth bits], 128 bytes of
        # nibbles. Each run of 32 nibble bytes holds two sub-blocks: low nibbles 2c, high 2c+1.
        d, dmin = _d(b, t), _m(b, t)
        sc, mn = q4_k_scales_mins(b[:, 4:16])
        qs = _qs(b, t).reshape(nb, 4, 32)
        q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.int32)
        if t == GGMLType.Q5_K:
            qh = b[:, 16:48]  # bit s of byte l: the fifth bit of element l of sub-block s
            q |= (((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).astype(np.int32) << 4)
        return q, d * sc.astype(_F32), dmin * mn.astype(_F32)
    if t == GGMLType.Q6_K:
        q, sc = _q6_k_quants(b)
        q = (q * np.repeat(sc, 16, axis=3)).reshape(nb, 8, 32)
        return q, np.repeat(_d(b, t), 8, axis=1), np.zeros((nb, 8), _F32)
    raise ValueError(f"{t.name} is not a K-quant with 32-element sub-blocks")


def _q6_k_quants(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K blocks -> quants less 32 (n_blocks, half, k, 32) int32 for element 128*half + 32*k
    + l, and their int8 scales (n_blocks, half, k, 2), one per 16 elements."""
    # Layout: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, d (f16).
    # Each half (128 elements) uses 64 low bytes and 32 high bytes; within it element 32*k + l
    # takes low byte l (+32 for k odd), nibble k // 2, high bits 2k..2k+1 of byte l.
    nb = b.shape[0]
    ql = b[:, 0:128].reshape(nb, 2, 2, 32)  # half, (l or l+32), l
    qh = b[:, 128:192].reshape(nb, 2, 1, 32)
    sc = b[:, 192:208].view(np.int8).reshape(nb, 2, 4, 2).astype(np.int32)  # half, k, l // 16
    low = np.stack([ql[:, :, 0] & 0x0F, ql[:, :, 1] & 0x0F, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], axis=2)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    return (low | (high << 4)).astype(np.int32) - TYPE_TRAITS[GGMLType.Q6_K].q_bias, sc


def _dequantize_k(b: np.ndarray, t: GGMLType) -> np.ndarray:
    if t == GGMLType.Q6_K:
        # value = (d * sc) * (q - 32): the sub-block scale goes onto d, not onto the integer.
        q, sc = _q6_k_quants(b)
        scale = _d(b, t).reshape(-1, 1, 1, 1) * np.repeat(sc, 16, axis=3).astype(_F32)
        return (scale * q.astype(_F32)).reshape(-1)
    q, scale, offset = k_quant_parts(b, t)
    return (scale[:, :, None] * q.astype(_F32) - offset[:, :, None]).reshape(-1)


# -- quantization (float32 -> blocks), for the writer -----------------------------------------


def _round_away(x: np.ndarray) -> np.ndarray:
    """Round half away from zero (C's roundf)."""
    return np.trunc(x + np.copysign(_F32(0.5), x))


def _inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, _F32(1) / d, _F32(0)).astype(_F32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").reshape(-1, 1).view(np.uint8)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even; NaNs stay quiet NaNs."""
    u = np.ascontiguousarray(x, dtype=_F32).view(np.uint32)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), rounded)


def quantize(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """float32 values (count a multiple of the block size) -> raw GGUF bytes of the type."""
    t = GGMLType(ggml_type)
    x = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    if t == GGMLType.F32:
        return x.view(np.uint8).copy()
    if t == GGMLType.F16:
        return x.astype("<f2").view(np.uint8)
    if t == GGMLType.BF16:
        return f32_to_bf16_bits(x).view(np.uint8)
    block_elems = BLOCK_SIZES[t][0]
    if x.size % block_elems:
        raise ValueError(f"{x.size} values is not a multiple of the {t.name} block size {block_elems}")
    if not np.isfinite(x).all():
        # A block's scale is computed from its values: one inf or NaN makes it non-finite and
        # its integers undefined (NaN has no int8), so such a block cannot stand for the row.
        bad = int(np.flatnonzero(~np.isfinite(x))[0])
        raise ValueError(f"value {bad} is {x[bad]}: {t.name} blocks can only hold finite values "
                         "(float types F32/F16/BF16 keep inf and NaN)")
    v = x.reshape(-1, block_elems)
    if t == GGMLType.Q8_0:
        d = np.abs(v).max(axis=1, keepdims=True) / _F32(127)
        q = _round_away(v * _inv(d)).astype(np.int8)
        return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1).reshape(-1)
    if t == GGMLType.Q4_0:
        # The value of largest magnitude maps to -8, so the full range [-8, 7] is used.
        idx = np.abs(v).argmax(axis=1)
        vmax = v[np.arange(v.shape[0]), idx].reshape(-1, 1)
        d = vmax / _F32(-8)
        q = np.minimum(15, np.trunc(v * _inv(d) + _F32(8.5))).astype(np.uint8)
        return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1).reshape(-1)
    if t == GGMLType.Q4_1:
        vmin = v.min(axis=1, keepdims=True)
        d = (v.max(axis=1, keepdims=True) - vmin) / _F32(15)
        q = np.clip(np.trunc((v - vmin) * _inv(d) + _F32(0.5)), 0, 15).astype(np.uint8)
        return np.concatenate([_f16_bytes(d), _f16_bytes(vmin), _pack_nibbles(q)], axis=1).reshape(-1)
    if t == GGMLType.Q5_0:
        return _quantize_q5_0(v)
    if t == GGMLType.Q5_1:
        return _quantize_q5_1(v)
    if t in (GGMLType.Q4_K, GGMLType.Q5_K):
        return _quantize_q4_k(v, bits=4 if t == GGMLType.Q4_K else 5)
    if t == GGMLType.Q6_K:
        return _quantize_q6_k(v)
    raise NotImplementedError(
        f"quantizing to {t.name} is not implemented; pass its raw blocks to the writer instead"
    )


# The quantizers below are simple, not optimal: each scale comes from its block's range, with
# no search for the scale that minimises the error. Their blocks are valid, and dequantize()
# gives back what they hold; they serve tests and model conversion, not the best quality.


def _f16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to what an fp16 field will hold."""
    return x.astype("<f2").astype(_F32)


def _quantize_q5_0(v: np.ndarray) -> np.ndarray:
    # As Q4_0, over [-16, 15]: the value of largest magnitude maps to -16.
    idx = np.abs(v).argmax(axis=1)
    vmax = v[np.arange(v.shape[0]), idx].reshape(-1, 1)
    d = vmax / _F32(-16)
    q = np.minimum(31, np.trunc(v * _inv(d) + _F32(16.5))).astype(np.uint32)
    qs = _pack_nibbles((q & 0x0F).astype(np.uint8))
    return np.concatenate([_f16_bytes(d), _fifth_bits(q), qs], axis=1).reshape(-1)


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    """32 five-bit quants per block -> their fifth bits as a little-endian word's 4 bytes."""
    qh = ((q.astype(np.uint32) >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32).astype("<u4")
    return qh.reshape(-1, 1).view(np.uint8)


def _quantize_q5_1(v: np.ndarray) -> np.ndarray:
    # As Q4_1, over 31 steps.
    vmin = v.min(axis=1, keepdims=True)
    d = (v.max(axis=1, keepdims=True) - vmin) / _F32(31)
    q = np.clip(np.trunc((v - vmin) * _inv(d) + _F32(0.5)), 0, 31).astype(np.uint32)
    qs = _pack_nibbles((q & 0x0F).astype(np.uint8))
    return np.concatenate([_f16_bytes(d), _f16_bytes(vmin), _fifth_bits(q), qs], axis=1).reshape(-1)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per block -> Q4_K's 12 bytes (the inverse of q4_k_scales_mins)."""
    s = np.empty((sc.shape[0], 12), np.uint8)
    s[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    s[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return s


def _quantize_q4_k(v: np.ndarray, bits: int = 4) -> np.ndarray:
    # 8 sub-blocks of 32, value = (d * sc) * q - dmin * mn: each sub-block's range [lo, hi]
    # (lo <= 0, so that mn >= 0) in 15 steps (Q5_K, bits = 5: 31 steps and a fifth bit).
    nb = v.shape[0]
    top = (1 << bits) - 1
    sub = v.reshape(nb, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0)
    step = (sub.max(axis=2) - lo) / _F32(top)
    d = _f16_round(step.max(axis=1, keepdims=True) / _F32(63))
    dmin = _f16_round((-lo).max(axis=1, keepdims=True) / _F32(63))
    sc = np.clip(_round_away(step * _inv(d)), 0, 63).astype(np.uint8)
    mn = np.clip(_round_away(-lo * _inv(dmin)), 0, 63).astype(np.uint8)
    scale = d * sc.astype(_F32)
    offset = dmin * mn.astype(_F32)
    q = _round_away((sub + offset[:, :, None]) * _inv(scale)[:, :, None])
    q = np.clip(q, 0, top).astype(np.uint8)  # (nb, sub-block, l)
    low = (q & 0x0F).reshape(nb, 4, 2, 32)
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(nb, 128)
    head = [_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, mn)]
    if bits == 5:  # bit s of byte l: the fifth bit of element l of sub-block s
        qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint32)
        head.append(qh.astype(np.uint8))
    return np.concatenate(head + [qs], axis=1).reshape(-1)


def _quantize_q6_k(v: np.ndarray) -> np.ndarray:
    # 16 sub-blocks of 16, value = (d * sc) * (q - 32) with int8 sc: each sub-block's value of
    # largest magnitude maps to -32, as in Q4_0.
    nb = v.shape[0]
    sub = v.reshape(nb, 16, 16)
    idx = np.abs(sub).argmax(axis=2)
    step = np.take_along_axis(sub, idx[:, :, None], axis=2)[:, :, 0] / _F32(-32)
    d = _f16_round(np.abs(step).max(axis=1, keepdims=True) / _F32(127))
    sc = np.clip(_round_away(step * _inv(d)), -127, 127).astype(np.int8)
    scale = d * sc.astype(_F32)
    q = np.clip(_round_away(sub * _inv(scale)[:, :, None]) + 32, 0, 63).astype(np.uint8)
    # Element l + 32k of half h (l < 32, k < 4): low 4 bits in ql[64h + l + 32 (k & 1)] (low
    # nibble for k < 2, high for k >= 2), high 2 bits in bits 2k..2k+1 of qh[32h + l].
    q = q.reshape(nb, 2, 4, 32)
    low, high = q & 0x0F, q >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8), _f16_bytes(d)],
                          axis=1).reshape(-1)
