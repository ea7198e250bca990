"""GGUF's type ids: metadata value types, tensor (ggml) types and their traits table, the
mirror of the C++ one in csrc/quant_blocks.h (tests/test_type_traits.py holds the two equal)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ValueType(IntEnum):
    """Metadata value types (gguf_type)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


class GGMLType(IntEnum):
    """Tensor types (ggml_type ids) whose block size pyinfer knows."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    BF16 = 30


@dataclass(frozen=True)
class TypeTraits:
    """What the code needs to know of a tensor type's encoding (fields as in C++'s TypeTraits)."""

    name: str
    block_elems: int  # elements per block (1 for the plain types)
    block_bytes: int  # bytes per block
    quant_bits: int  # bits per element as stored (plain types: the element's bits)
    qs_offset: int  # byte offset of the quants (their low bits, where split) in a block
    qs_bytes: int  # bytes of them
    d_offset: int  # byte offset of the block's (super-block) scale d
    m_offset: int  # byte offset of its min (the K-quants' dmin); -1 where it has none
    q_bias: int  # offset the stored quants carry: value = (q - q_bias) * scale (Q4_0: 8)
    n_scales: int  # scales per block (the K-quants' sub-block scales); 0 for plain types
    has_min: bool  # a min per (sub-)block added to q * scale
    qs_signed: bool  # stored as signed integers (the 8-bit types' quants; I8..I64)
    is_float: bool  # plain floating-point elements


def _plain(name: str, nbytes: int, is_float: bool) -> TypeTraits:
    return TypeTraits(name, 1, nbytes, 8 * nbytes, 0, nbytes, 0, -1, 0, 0, False, not is_float, is_float)


def _block(name: str, elems: int, nbytes: int, bits: int, qs: tuple[int, int], d_offset: int,
           m_offset: int, q_bias: int, n_scales: int, qs_signed: bool = False) -> TypeTraits:
    return TypeTraits(name, elems, nbytes, bits, qs[0], qs[1], d_offset, m_offset, q_bias, n_scales,
                      m_offset >= 0, qs_signed, False)


# By type; layouts as in quant_blocks.h's structs (qs: the quants' offset and size).
TYPE_TRAITS: dict[GGMLType, TypeTraits] = {
    GGMLType.F32: _plain("F32", 4, True),
    GGMLType.F16: _plain("F16", 2, True),
    GGMLType.BF16: _plain("BF16", 2, True),
    GGMLType.F64: _plain("F64", 8, True),
    GGMLType.I8: _plain("I8", 1, False),
    GGMLType.I16: _plain("I16", 2, False),
    GGMLType.I32: _plain("I32", 4, False),
    GGMLType.I64: _plain("I64", 8, False),
    # name, elements, bytes, bits, quants (offset, size), d's offset, min's offset, bias, scales
    GGMLType.Q4_0: _block("Q4_0", 32, 18, 4, (2, 16), 0, -1, 8, 1),
    GGMLType.Q4_1: _block("Q4_1", 32, 20, 4, (4, 16), 0, 2, 0, 1),
    GGMLType.Q5_0: _block("Q5_0", 32, 22, 5, (6, 16), 0, -1, 16, 1),
    GGMLType.Q5_1: _block("Q5_1", 32, 24, 5, (8, 16), 0, 2, 0, 1),
    GGMLType.Q8_0: _block("Q8_0", 32, 34, 8, (2, 32), 0, -1, 0, 1, qs_signed=True),
    GGMLType.Q8_1: _block("Q8_1", 32, 36, 8, (4, 32), 0, -1, 0, 1, qs_signed=True),
    GGMLType.Q2_K: _block("Q2_K", 256, 84, 2, (16, 64), 80, 82, 0, 16),
    GGMLType.Q3_K: _block("Q3_K", 256, 110, 3, (32, 64), 108, -1, 4, 16),
    GGMLType.Q4_K: _block("Q4_K", 256, 144, 4, (16, 128), 0, 2, 0, 8),
    GGMLType.Q5_K: _block("Q5_K", 256, 176, 5, (48, 128), 0, 2, 0, 8),
    GGMLType.Q6_K: _block("Q6_K", 256, 210, 6, (0, 128), 208, -1, 32, 16),
    GGMLType.Q8_K: _block("Q8_K", 256, 292, 8, (4, 256), 0, -1, 0, 1, qs_signed=True),
}

# (elements per block, bytes per block): a view of the table for the readers and writers.
BLOCK_SIZES: dict[GGMLType, tuple[int, int]] = {
    t: (tr.block_elems, tr.block_bytes) for t, tr in TYPE_TRAITS.items()
}
