"""The per-type traits table: the C++ one (quant_blocks.h, through _C.type_traits) and its
Python mirror (gguf_types.TYPE_TRAITS) are the same, and both agree with the kernels."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pyinfer import _C, quants
from pyinfer.gguf_types import BLOCK_SIZES, TYPE_TRAITS, GGMLType


def test_cpp_table_equals_python_mirror():
    cpp = _C.type_traits()
    py = {int(t): dataclasses.asdict(tr) for t, tr in TYPE_TRAITS.items()}
    assert sorted(cpp) == sorted(py)
    for t in py:
        assert cpp[t] == py[t], GGMLType(t).name


def test_every_ggml_type_has_traits_named_after_it():
    assert set(TYPE_TRAITS) == set(GGMLType)
    for t, tr in TYPE_TRAITS.items():
        assert tr.name == t.name
        assert BLOCK_SIZES[t] == (tr.block_elems, tr.block_bytes)


def test_traits_describe_the_blocks():
    for t, tr in TYPE_TRAITS.items():
        if tr.block_elems == 1:  # plain types: one element per "block"
            assert tr.n_scales == 0 and not tr.has_min and tr.qs_bytes == tr.block_bytes
            continue
        assert tr.qs_offset + tr.qs_bytes <= tr.block_bytes, t.name
        assert tr.block_bytes * 8 >= tr.block_elems * tr.quant_bits, t.name
        assert tr.has_min == (tr.m_offset >= 0), t.name
        # d (and the min) are fp16, except Q8_K's float32 d, and lie outside the quants.
        for off, size in [(tr.d_offset, 4 if t == GGMLType.Q8_K else 2)] + ([(tr.m_offset, 2)] if tr.has_min else []):
            assert off + size <= tr.block_bytes and (off + size <= tr.qs_offset or off >= tr.qs_offset + tr.qs_bytes)


def test_the_same_types_dequantize_in_cpp_and_numpy():
    """The NumPy spec (quants.dequantize) and the C++ kernels cover the same types (the kernels'
    values are checked against the spec in test_dequant_kernels)."""
    with_kernel = set()
    for t, tr in TYPE_TRAITS.items():
        raw = np.zeros(4 * tr.block_bytes, np.uint8)
        try:
            want = quants.dequantize(raw, t)
        except NotImplementedError:
            with pytest.raises(ValueError, match="no dequantization kernel"):
                _C.dequantize(int(t), raw, 4 * tr.block_elems)
            continue
        with_kernel.add(t.name)
        np.testing.assert_array_equal(_C.dequantize(int(t), raw, 4 * tr.block_elems), want)
    assert with_kernel == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}
