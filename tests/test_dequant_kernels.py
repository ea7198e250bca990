"""Dequantization kernels on every ISA path, checked bit for bit against NumPy.

The NumPy dequantizers below are written from the GGUF block layouts, independently of the
C++ code, and do the same float32 operations in the same order (the spec in
csrc/kernels/ref/dequant_ref.cpp), so every non-NaN result must match exactly, sign of zero
included. The `gguf` package's dequantizer is a second, independent check on finite data.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
import sys

import numpy as np
import pytest
from conftest import ISAS

import pyinfer
from pyinfer import _C

# ggml type ids as stored in GGUF.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30
Q8_1 = 9  # a real type pyinfer has no kernel for

# type id -> (elements per block, bytes per block)
BLOCK = {
    F32: (1, 4),
    F16: (1, 2),
    BF16: (1, 2),
    Q4_0: (32, 18),
    Q4_1: (32, 20),
    Q5_0: (32, 22),
    Q5_1: (32, 24),
    Q8_0: (32, 34),
    Q4_K: (256, 144),
    Q5_K: (256, 176),
    Q6_K: (256, 210),
}
QUANT_TYPES = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K]
PLAIN_TYPES = [F32, F16, BF16]
NAMES = {F32: "f32", F16: "f16", BF16: "bf16", Q4_0: "q4_0", Q4_1: "q4_1", Q5_0: "q5_0",
         Q5_1: "q5_1", Q8_0: "q8_0", Q4_K: "q4_K", Q5_K: "q5_K", Q6_K: "q6_K"}

# Element counts around the 8- and 16-float vector widths, for the one-element types.
PLAIN_COUNTS = [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1027]
BLOCK_COUNTS = [1, 2, 3, 17, 64]


# ---- random blocks ----------------------------------------------------------------------

def random_f16_bits(rng: np.random.Generator, n: int, special: bool) -> np.ndarray:
    """fp16 bit patterns: normals of both signs over the whole exponent range, subnormals,
    +-0, and with `special` also +-inf, quiet and signalling NaNs."""
    kind = rng.integers(0, 10 if special else 8, n)
    sign = rng.integers(0, 2, n).astype(np.uint16) << 15
    exp = rng.integers(1, 31, n).astype(np.uint16)
    man = rng.integers(0, 1024, n).astype(np.uint16)
    bits = sign | (exp << 10) | man                    # kinds 0..4: normal
    bits = np.where(kind == 5, sign | np.maximum(man, 1), bits)  # subnormal
    bits = np.where(kind == 6, sign | 1, bits)          # smallest subnormal
    bits = np.where(kind == 7, sign, bits)              # +-0
    bits = np.where(kind == 8, sign | 0x7C00, bits)     # +-inf
    nan_man = np.maximum(man, 1)                        # quiet (bit 9 set) or signalling
    bits = np.where(kind == 9, sign | 0x7C00 | nan_man, bits)
    return bits.astype(np.uint16)


def put_u16(raw: np.ndarray, block_bytes: int, offset: int, bits: np.ndarray) -> None:
    """Write one little-endian uint16 per block at byte `offset` of each block."""
    blocks = raw.reshape(-1, block_bytes)
    blocks[:, offset] = bits & 0xFF
    blocks[:, offset + 1] = bits >> 8


# Byte offsets of each type's fp16 scales inside its block.
SCALE_OFFSETS = {Q4_0: [0], Q4_1: [0, 2], Q5_0: [0], Q5_1: [0, 2], Q8_0: [0], Q4_K: [0, 2], Q5_K: [0, 2],
                 Q6_K: [208]}


def random_blocks(rng: np.random.Generator, qtype: int, n_blocks: int, special: bool) -> np.ndarray:
    """Raw bytes of n_blocks blocks: random quants, random fp16 scales."""
    _, bb = BLOCK[qtype]
    raw = rng.integers(0, 256, n_blocks * bb, dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        put_u16(raw, bb, off, random_f16_bits(rng, n_blocks, special))
    return raw


# ---- independent NumPy dequantization ---------------------------------------------------

def f16_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 at byte `offset` of every block, as float32 (shape (n_blocks, 1))."""
    bits = blocks[:, offset].astype(np.uint16) | (blocks[:, offset + 1].astype(np.uint16) << 8)
    return bits.view(np.float16).astype(np.float32)[:, None]


def nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32): the low nibbles are elements 0..15, the high ones 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def np_dequant_q8_0(raw: np.ndarray) -> np.ndarray:
    b = raw.reshape(-1, 34)
    q = b[:, 2:].view(np.int8).astype(np.float32)
    return (q * f16_at(b, 0)).ravel()


def np_dequant_q4_0(raw: np.ndarray) -> np.ndarray:
    b = raw.reshape(-1, 18)
    q = (nibbles(b[:, 2:]) - 8).astype(np.float32)
    return (q * f16_at(b, 0)).ravel()


def np_dequant_q4_1(raw: np.ndarray) -> np.ndarray:
    b = raw.reshape(-1, 20)
    q = nibbles(b[:, 4:]).astype(np.float32)
    return (q * f16_at(b, 0) + f16_at(b, 2)).ravel()


def q5_quants(b: np.ndarray, qh_at: int) -> np.ndarray:
    """Q5_0/Q5_1 blocks -> (n, 32) five-bit quants: nibbles after the 4 bytes of fifth bits at
    qh_at, bit j of that little-endian word for element j."""
    qh = b[:, qh_at:qh_at + 4].astype(np.uint32)
    qh = qh[:, 0] | (qh[:, 1] << 8) | (qh[:, 2] << 16) | (qh[:, 3] << 24)
    fifth = ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32)
    return nibbles(b[:, qh_at + 4:]) | (fifth << 4)


def np_dequant_q5_0(raw: np.ndarray) -> np.ndarray:
    b = raw.reshape(-1, 22)
    q = (q5_quants(b, 2) - 16).astype(np.float32)
    return (q * f16_at(b, 0)).ravel()


def np_dequant_q5_1(raw: np.ndarray) -> np.ndarray:
    b = raw.reshape(-1, 24)
    return (q5_quants(b, 4).astype(np.float32) * f16_at(b, 0) + f16_at(b, 2)).ravel()


def np_q4_K_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) packed bytes -> (n, 8) 6-bit scales and (n, 8) 6-bit mins."""
    s = s.astype(np.int32)
    sc = np.empty((s.shape[0], 8), np.int32)
    mn = np.empty((s.shape[0], 8), np.int32)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def np_dequant_q4_K(raw: np.ndarray, five: bool = False) -> np.ndarray:
    b = raw.reshape(-1, 176 if five else 144)
    sc, mn = np_q4_K_scales(b[:, 4:16])
    d1 = f16_at(b, 0) * sc.astype(np.float32)     # (n, 8), exact
    m1 = f16_at(b, 2) * mn.astype(np.float32)
    qs = b[:, 48 if five else 16:].reshape(-1, 4, 32)
    # Sub-block 2g is the low nibbles of qs[g], sub-block 2g+1 the high nibbles.
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.int32)
    if five:  # Q5_K: bit j of qh[l] is the fifth bit of element l of sub-block j
        qh = b[:, 16:48].astype(np.int32)
        q |= ((qh[:, None, :] >> np.arange(8)[None, :, None]) & 1) << 4
    return (d1[:, :, None] * q.astype(np.float32) - m1[:, :, None]).ravel()


def np_dequant_q6_K(raw: np.ndarray) -> np.ndarray:
    b = raw.reshape(-1, 210)
    n = b.shape[0]
    ql, qh = b[:, :128].astype(np.int32), b[:, 128:192].astype(np.int32)
    scales = b[:, 192:208].view(np.int8).astype(np.float32)
    ds = f16_at(b, 208) * scales                    # (n, 16), exact
    out = np.empty((n, 256), np.float32)
    for half in range(2):
        for k in range(4):
            low = ql[:, 64 * half + 32 * (k & 1):][:, :32] >> (4 * (k >> 1)) & 0x0F
            high = (qh[:, 32 * half:32 * half + 32] >> (2 * k)) & 3
            q = ((low | (high << 4)) - 32).astype(np.float32)
            for l0 in (0, 16):
                s = ds[:, 8 * half + l0 // 16 + 2 * k][:, None]
                out[:, 128 * half + 32 * k + l0:][:, :16] = s * q[:, l0:l0 + 16]
    return out.ravel()


def np_dequant_f16(raw: np.ndarray) -> np.ndarray:
    h = raw.view(np.uint16)
    out = h.view(np.float16).astype(np.float32)
    # A NaN keeps its payload, signalling or not: sign, all-ones exponent, mantissa << 13.
    nan = (h & 0x7C00) == 0x7C00
    bits = out.view(np.uint32)
    bits[nan] = ((h[nan].astype(np.uint32) & 0x8000) << 16) | 0x7F800000 | (
        (h[nan].astype(np.uint32) & 0x3FF) << 13)
    return out


def np_dequant_bf16(raw: np.ndarray) -> np.ndarray:
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


NP_DEQUANT = {
    F32: lambda raw: raw.view(np.float32).copy(),
    F16: np_dequant_f16,
    BF16: np_dequant_bf16,
    Q8_0: np_dequant_q8_0,
    Q4_0: np_dequant_q4_0,
    Q4_1: np_dequant_q4_1,
    Q5_0: np_dequant_q5_0,
    Q5_1: np_dequant_q5_1,
    Q4_K: np_dequant_q4_K,
    Q5_K: lambda raw: np_dequant_q4_K(raw, five=True),
    Q6_K: np_dequant_q6_K,
}


def assert_same(got: np.ndarray, want: np.ndarray, nan_bits: bool = False) -> None:
    """Bit-exact equality (so -0.0 != +0.0); NaNs must sit at the same places, and with
    nan_bits also carry the same payload."""
    assert got.dtype == np.float32 and got.shape == want.shape
    g, w = got.view(np.uint32), want.view(np.uint32)
    gnan, wnan = np.isnan(got), np.isnan(want)
    differ = (g != w) if nan_bits else ((g != w) & ~(gnan & wnan))
    if differ.any():
        i = int(np.flatnonzero(differ)[0])
        raise AssertionError(
            f"{int(differ.sum())} of {got.size} elements differ; first at {i}: "
            f"got {got[i]!r} ({g[i]:#010x}), want {want[i]!r} ({w[i]:#010x})")


# ---- the kernels against NumPy ----------------------------------------------------------

@pytest.mark.parametrize("special", [False, True], ids=["finite", "inf-nan"])
@pytest.mark.parametrize("n_blocks", BLOCK_COUNTS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=NAMES.get)
def test_quant_types_match_numpy(isa: str, qtype: int, n_blocks: int, special: bool) -> None:
    rng = np.random.default_rng([qtype, n_blocks, int(special)])
    raw = random_blocks(rng, qtype, n_blocks, special)
    n = n_blocks * BLOCK[qtype][0]
    with np.errstate(invalid="ignore", over="ignore"):
        want = NP_DEQUANT[qtype](raw)
    assert_same(_C.dequantize(qtype, raw, n), want)


@pytest.mark.parametrize("n", PLAIN_COUNTS)
@pytest.mark.parametrize("qtype", PLAIN_TYPES, ids=NAMES.get)
def test_plain_types_match_numpy(isa: str, qtype: int, n: int) -> None:
    rng = np.random.default_rng([qtype, n])
    if qtype == F16:
        raw = random_f16_bits(rng, n, special=True).view(np.uint8)
    else:  # every bit pattern, NaNs with all kinds of payload included
        raw = rng.integers(0, 256, n * BLOCK[qtype][1], dtype=np.uint8)
    # Conversions are bit moves: NaN payloads must survive exactly as the scalar path keeps them.
    assert_same(_C.dequantize(qtype, raw, n), NP_DEQUANT[qtype](raw), nan_bits=True)


def test_f16_every_bit_pattern(isa: str) -> None:
    raw = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
    assert_same(_C.dequantize(F16, raw, 1 << 16), np_dequant_f16(raw), nan_bits=True)


@pytest.mark.parametrize("qtype", QUANT_TYPES + PLAIN_TYPES, ids=NAMES.get)
def test_source_at_odd_address(isa: str, qtype: int) -> None:
    # Blocks are 18, 20, 22, ... bytes and a caller's buffer may start anywhere.
    rng = np.random.default_rng([qtype, 99])
    be, bb = BLOCK[qtype]
    n_blocks = 5 if be > 1 else 37
    raw = random_blocks(rng, qtype, n_blocks, False) if be > 1 else \
        random_f16_bits(rng, n_blocks * bb // 2, False).view(np.uint8)
    buf = np.empty(raw.size + 1, np.uint8)
    buf[1:] = raw
    shifted = buf[1:]
    assert shifted.ctypes.data % 2 == 1
    assert_same(_C.dequantize(qtype, shifted, n_blocks * be), NP_DEQUANT[qtype](raw))


@pytest.mark.parametrize("qtype", QUANT_TYPES + [F16, BF16], ids=NAMES.get)
def test_isa_paths_agree_bit_for_bit(qtype: int) -> None:
    """Every path gives the same bits as the scalar one, on a larger buffer."""
    rng = np.random.default_rng([qtype, 7])
    be, bb = BLOCK[qtype]
    n = 4096 * be if be > 1 else 10_003
    raw = random_blocks(rng, qtype, n // be, False) if be > 1 else \
        rng.integers(0, 256, n * bb, dtype=np.uint8)
    before = _C.get_isa()
    try:
        out = {}
        for name in ISAS:
            _C.set_isa(name)
            out[name] = _C.dequantize(qtype, raw, n)
    finally:
        _C.set_isa(before)
    for name in ISAS:
        assert_same(out[name], out["scalar"], nan_bits=True)


# ---- a second, independent check: the gguf package --------------------------------------

GGUF_TYPES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0", Q4_K: "Q4_K",
              Q5_K: "Q5_K", Q6_K: "Q6_K", F16: "F16", BF16: "BF16"}


@pytest.mark.parametrize("qtype", list(GGUF_TYPES), ids=NAMES.get)
def test_matches_gguf_package(isa: str, qtype: int) -> None:
    gq = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    rng = np.random.default_rng([qtype, 3])
    be, bb = BLOCK[qtype]
    n_blocks = 17 if be > 1 else 1001
    raw = random_blocks(rng, qtype, n_blocks, False) if be > 1 else \
        random_f16_bits(rng, n_blocks, False).view(np.uint8)
    want = gq.dequantize(raw.reshape(n_blocks, bb) if be > 1 else raw.reshape(1, -1),
                         GGMLQuantizationType[GGUF_TYPES[qtype]])
    want = np.asarray(want, dtype=np.float32).ravel()
    # gguf computes some products in another order; they are exact, so only a zero's sign
    # may differ: compare values, not bits, here.
    np.testing.assert_array_equal(_C.dequantize(qtype, raw, n_blocks * be), want)


# ---- hand-built blocks ------------------------------------------------------------------

def test_q4_1_one_block_by_hand(isa: str) -> None:
    raw = np.zeros(20, np.uint8)
    put_u16(raw, 20, 0, np.array([0x3800], np.uint16))  # d = 0.5
    put_u16(raw, 20, 2, np.array([0xBC00], np.uint16))  # m = -1
    raw[4:] = np.arange(16, dtype=np.uint8) | ((15 - np.arange(16, dtype=np.uint8)) << 4)
    q = np.concatenate([np.arange(16), 15 - np.arange(16)]).astype(np.float32)
    np.testing.assert_array_equal(_C.dequantize(Q4_1, raw, 32), q * 0.5 - 1)


def test_q4_K_scale_packing_by_hand(isa: str) -> None:
    raw = np.zeros(144, np.uint8)
    put_u16(raw, 144, 0, np.array([0x3C00], np.uint16))  # d = 1
    put_u16(raw, 144, 2, np.array([0x3C00], np.uint16))  # dmin = 1
    sc = np.array([1, 2, 3, 4, 61, 62, 63, 33])
    mn = np.array([5, 6, 7, 8, 40, 50, 60, 17])
    s = np.zeros(12, np.int64)
    s[0:4] = sc[:4] | ((sc[4:] >> 4) << 6)
    s[4:8] = mn[:4] | ((mn[4:] >> 4) << 6)
    s[8:12] = (sc[4:] & 15) | ((mn[4:] & 15) << 4)
    raw[4:16] = s
    raw[16:] = 0x31  # every low nibble 1, every high nibble 3
    q = np.tile(np.repeat([1.0, 3.0], 32), 4)
    want = np.repeat(sc, 32) * q - np.repeat(mn, 32)
    np.testing.assert_array_equal(_C.dequantize(Q4_K, raw, 256), want.astype(np.float32))


def test_q6_K_element_order_by_hand(isa: str) -> None:
    # q = 32 + position-dependent bits, scale 1 and d = 1: the output is q - 32 itself.
    raw = np.zeros(210, np.uint8)
    raw[192:208] = 1
    put_u16(raw, 210, 208, np.array([0x3C00], np.uint16))
    raw[128:192] = 0b10101010  # top 2 bits of every q = 2 -> q in 32..47
    raw[0:128] = (np.arange(128) % 16) | ((15 - np.arange(128) % 16) << 4)
    out = _C.dequantize(Q6_K, raw, 256)
    for half in range(2):
        ql = raw[64 * half:64 * half + 64].astype(np.int64)
        for k in range(4):
            low = (ql[32 * (k & 1):32 * (k & 1) + 32] >> (4 * (k >> 1))) & 15
            want = (low | (2 << 4)) - 32
            np.testing.assert_array_equal(out[128 * half + 32 * k:][:32], want)


# ---- errors and path selection ----------------------------------------------------------

def test_bad_n_raises() -> None:
    raw = np.zeros(18, np.uint8)
    for n in (31, 33, -32, 16):
        with pytest.raises(ValueError):
            _C.dequantize(Q4_0, raw, n)


def test_wrong_raw_size_raises() -> None:
    with pytest.raises(ValueError):
        _C.dequantize(Q4_0, np.zeros(17, np.uint8), 32)
    with pytest.raises(ValueError):
        _C.dequantize(Q4_0, np.zeros(36, np.uint8), 32)
    with pytest.raises(ValueError):
        _C.dequantize(Q4_0, np.zeros((2, 18), np.uint8), 64)
    with pytest.raises(ValueError):
        _C.dequantize(F16, np.zeros(5, np.uint8), 3)


def test_unknown_type_raises() -> None:
    for t in (Q8_1, 4, 39, 40, 1000):
        with pytest.raises(ValueError):
            _C.dequantize(t, np.zeros(0, np.uint8), 0)


def test_set_isa_bogus_raises() -> None:
    before = _C.get_isa()
    with pytest.raises(ValueError, match="bogus"):
        _C.set_isa("bogus")
    assert _C.get_isa() == before


def test_set_isa_unavailable_raises() -> None:
    info = pyinfer.cpu_info()
    missing = [p for p in info["compiled"] if p not in info["available"]]
    if not missing:
        pytest.skip("every compiled ISA path runs on this CPU")
    before = _C.get_isa()
    with pytest.raises(RuntimeError, match="not available"):
        _C.set_isa(missing[0])
    assert _C.get_isa() == before


def import_with_isa(value: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYINFER_ISA=value)
    return subprocess.run(
        [sys.executable, "-c", "import pyinfer; print(pyinfer.cpu_info()['isa'])"],
        env=env, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent, check=False)


@pytest.mark.parametrize("name", ISAS)
def test_env_selects_path(name: str) -> None:
    r = import_with_isa(name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == name


def test_env_bogus_fails_import_clearly() -> None:
    r = import_with_isa("bogus")
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert "PYINFER_ISA" in r.stderr and "unknown ISA path 'bogus'" in r.stderr
    assert "scalar" in r.stderr  # the message lists the valid names


def test_env_unavailable_fails_import_clearly() -> None:
    info = pyinfer.cpu_info()
    missing = [p for p in info["compiled"] if p not in info["available"]]
    if not missing:
        pytest.skip("every compiled ISA path runs on this CPU")
    r = import_with_isa(missing[0])
    assert r.returncode != 0
    assert f"PYINFER_ISA={missing[0]}" in r.stderr and "does not support" in r.stderr
