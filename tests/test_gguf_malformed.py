"""Every class of malformed GGUF gets a GGUFError naming the field and byte offset, before
anything it would size is allocated: never a crash, hang, MemoryError or another exception.
These are the classes behind llama.cpp's GGUF CVEs (out-of-bounds counts and lengths,
overflowing sizes, bad types, overlapping or outside data)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf_craft import gguf, kv, kv_str, kv_u32, s, tinfo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyinfer import GGUFError
from pyinfer.gguf import GGMLType, GGUFReader, GGUFWriter

F32 = 0


def load(tmp_path: Path, data: bytes) -> GGUFReader:
    p = tmp_path / "crafted.gguf"
    p.write_bytes(data)
    return GGUFReader(p)


def expect(tmp_path: Path, data: bytes, *patterns: str) -> str:
    with pytest.raises(GGUFError) as ei:
        load(tmp_path, data)
    msg = str(ei.value)
    for pat in patterns:
        assert re.search(pat, msg), f"{pat!r} not in {msg!r}"
    return msg


def one_tensor(**kw) -> bytes:
    return gguf([kv_str("general.architecture", "llama")], [tinfo("w", [8], F32, 0)], b"\0" * 32, **kw)


def test_valid_crafted_file_loads(tmp_path):
    r = load(tmp_path, one_tensor())
    assert r.metadata == {"general.architecture": "llama"}
    assert r.tensors["w"].shape == (8,) and r.tensor("w").tolist() == [0.0] * 8


def test_bad_magic(tmp_path):
    expect(tmp_path, one_tensor(magic=b"GGML"), r"magic at byte 0", "not a GGUF")


@pytest.mark.parametrize("version,pat", [(1, "version 1 is not supported"), (0, "unknown GGUF version 0"),
                                         (4, "unknown GGUF version 4"), (3 << 24, "big-endian")])
def test_bad_version(tmp_path, version, pat):
    expect(tmp_path, one_tensor(version=version), "version at byte 4", pat)


def test_version_2_loads(tmp_path):
    assert load(tmp_path, one_tensor(version=2)).version == 2


def test_empty_and_tiny_files(tmp_path):
    expect(tmp_path, b"", "too short")
    expect(tmp_path, b"GGUF\x03\0\0\0", "too short")


@pytest.mark.parametrize("n", [1 << 20, 1 << 40, (1 << 64) - 1])
def test_tensor_count_beyond_file(tmp_path, n):
    expect(tmp_path, one_tensor(n_tensors=n), r"tensor_count at byte 8", "cannot fit")


@pytest.mark.parametrize("n", [1 << 40, (1 << 64) - 1])
def test_kv_count_beyond_file(tmp_path, n):
    expect(tmp_path, one_tensor(n_kv=n), r"metadata_kv_count at byte 16", "cannot fit")


def test_kv_count_larger_than_present(tmp_path):
    # Plausible count, but the records run out: the tensor info is read as a key and fails.
    data = gguf([kv_str("a", "b")], [], b"", n_kv=3)
    with pytest.raises(GGUFError):
        load(tmp_path, data)


@pytest.mark.parametrize("etype,size", [(4, 4), (10, 8), (0, 1)])
def test_numeric_array_count_beyond_file(tmp_path, etype, size):
    payload = struct.pack("<IQ", etype, 1 << 60) + b"\0" * 16
    expect(tmp_path, gguf([kv("arr", 9, payload)]), r"arr at byte 43", "cannot fit")


def test_string_array_count_beyond_file(tmp_path):
    payload = struct.pack("<IQ", 8, (1 << 64) - 1) + s("x")
    expect(tmp_path, gguf([kv("toks", 9, payload)]), r"toks at byte \d+", "strings cannot fit")


def test_string_in_array_past_end(tmp_path):
    payload = struct.pack("<IQ", 8, 2) + s("ok") + struct.pack("<Q", 1 << 50) + b"abc"
    expect(tmp_path, gguf([kv("toks", 9, payload)]), r"toks\[1\]", "runs past the end")


def test_key_length_past_end(tmp_path):
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 62) + b"k" * 20
    expect(tmp_path, data, r"metadata key #0", "byte 24", "runs past the end")


def test_string_value_past_end(tmp_path):
    data = gguf([kv("name", 8, struct.pack("<Q", 10_000) + b"short")])
    expect(tmp_path, data, r"name: string of 10000 bytes at byte \d+ runs past the end")


def test_tensor_name_length_past_end(tmp_path):
    data = gguf([], [struct.pack("<Q", (1 << 64) - 1) + b"w" * 40])
    expect(tmp_path, data, r"tensor #0 name", "runs past the end")


@pytest.mark.parametrize("vtype", [13, 99, 0xFFFFFFFF])
def test_unknown_value_type(tmp_path, vtype):
    expect(tmp_path, gguf([kv("k", vtype, b"\0" * 8)]), rf"k at byte 33: unknown value type {vtype}")


def test_unknown_array_element_type(tmp_path):
    expect(tmp_path, gguf([kv("k", 9, struct.pack("<IQ", 17, 1) + b"\0" * 8)]), "unknown value type 17")


def test_nested_array(tmp_path):
    inner = struct.pack("<IQ", 4, 1) + b"\0" * 4
    expect(tmp_path, gguf([kv("k", 9, struct.pack("<IQ", 9, 1) + inner)]), "k at byte 37: nested arrays")


def test_empty_key(tmp_path):
    expect(tmp_path, gguf([kv_str("", "v")]), "metadata key #0 at byte 24: empty key")


def test_duplicate_key(tmp_path):
    expect(tmp_path, gguf([kv_str("a", "1"), kv_str("a", "2")]), "'a' at byte 46: duplicate key")


def test_invalid_utf8_key(tmp_path):
    expect(tmp_path, gguf([kv(b"\xff\xfe", 4, b"\0" * 4)]), "invalid UTF-8", "byte 24")


def test_bool_not_0_or_1(tmp_path):
    expect(tmp_path, gguf([kv("flag", 7, b"\x02")]), "flag at byte 40: bool value 2")


def test_empty_tensor_name(tmp_path):
    expect(tmp_path, gguf([], [tinfo("", [8], F32, 0)], b"\0" * 32), "tensor #0 at byte 24: empty name")


def test_duplicate_tensor_name(tmp_path):
    data = gguf([], [tinfo("w", [8], F32, 0), tinfo("w", [8], F32, 32)], b"\0" * 64)
    expect(tmp_path, data, r"tensor 'w' at byte \d+: duplicate tensor name")


@pytest.mark.parametrize("n_dims", [0, 5, 1 << 31])
def test_n_dims_out_of_range(tmp_path, n_dims):
    info = s("w") + struct.pack("<I", n_dims) + b"\0" * 64
    expect(tmp_path, gguf([], [info]), r"tensor 'w' n_dims at byte 33", "outside 1..4")


def test_zero_dimension(tmp_path):
    expect(tmp_path, gguf([], [tinfo("w", [8, 0], F32, 0)], b"\0" * 32), "tensor 'w' dim 1 at byte 45: zero-sized")


def test_dimension_product_overflows(tmp_path):
    data = gguf([], [tinfo("w", [1 << 32, 1 << 32], F32, 0)], b"\0" * 32)
    expect(tmp_path, data, "tensor 'w' dim 1", "overflows 64 bits")


def test_byte_size_overflows(tmp_path):
    # 2^62 elements is a valid count, but 2^62 float32 values is 2^64 bytes.
    data = gguf([], [tinfo("w", [1 << 31, 1 << 31], F32, 0)], b"\0" * 32)
    expect(tmp_path, data, "tensor 'w' at byte 24: byte size overflows 64 bits")


@pytest.mark.parametrize("ttype", [4, 5, 16, 39, 1000])
def test_unknown_tensor_type(tmp_path, ttype):
    expect(tmp_path, gguf([], [tinfo("w", [32], ttype, 0)], b"\0" * 64), rf"tensor 'w' type at byte \d+: unknown tensor type {ttype}")


def test_row_not_multiple_of_block(tmp_path):
    expect(tmp_path, gguf([], [tinfo("w", [33, 2], 2, 0)], b"\0" * 128), "row length 33", "Q4_0 block size 32")


@pytest.mark.parametrize("a", [0, 3, 48])
def test_alignment_not_power_of_two(tmp_path, a):
    expect(tmp_path, gguf([kv_u32("general.alignment", a)]), f"general.alignment: {a} is not a power of two")


@pytest.mark.parametrize("payload,vtype,name", [(struct.pack("<Q", 32), 10, "UINT64"), (s("32"), 8, "STRING")])
def test_alignment_wrong_type(tmp_path, payload, vtype, name):
    expect(tmp_path, gguf([kv("general.alignment", vtype, payload)]), f"general.alignment: must be a UINT32, found {name}")


def test_custom_alignment_respected(tmp_path):
    data = gguf([kv_u32("general.alignment", 64)], [tinfo("w", [8], F32, 0)], b"\0" * 32, alignment=64)
    r = load(tmp_path, data)
    assert r.alignment == 64 and r.tensors["w"].offset % 64 == 0


def test_offset_not_aligned(tmp_path):
    expect(tmp_path, gguf([], [tinfo("w", [8], F32, 4)], b"\0" * 64), "offset at byte 49: 4 is not a multiple of the alignment 32")


@pytest.mark.parametrize("offset", [32, 1 << 40, (1 << 64) - 32])
def test_tensor_data_outside_file(tmp_path, offset):
    expect(tmp_path, gguf([], [tinfo("w", [8], F32, offset)], b"\0" * 32), r"tensor 'w' \(info at byte 24\): data \[", "outside the file")


def test_overlapping_tensors(tmp_path):
    data = gguf([], [tinfo("a", [16], F32, 0), tinfo("b", [8], F32, 32)], b"\0" * 96)
    expect(tmp_path, data, "tensor 'b': data at byte 128 overlaps tensor 'a' \\[96, 160\\)")


def _valid_file(tmp_path: Path) -> bytes:
    w = GGUFWriter(tmp_path / "valid.gguf")
    w.add("general.architecture", "llama")
    w.add("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add("scores", np.array([0.5, 1.5], np.float32))
    w.add_tensor("x", np.arange(64, dtype=np.float32).reshape(2, 32), GGMLType.Q8_0)
    w.add_tensor("y", np.ones(8, np.float32))
    w.write()
    return (tmp_path / "valid.gguf").read_bytes()


def test_every_truncation_is_a_gguf_error(tmp_path):
    data = _valid_file(tmp_path)
    load(tmp_path, data)  # the whole file is fine
    for cut in range(len(data)):
        with pytest.raises(GGUFError):
            load(tmp_path, data[:cut])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_corrupted_bytes_load_or_raise_gguf_error(tmp_path, data):
    """Random byte overwrites anywhere in the header: the file loads or raises GGUFError."""
    raw = bytearray(_valid_file(tmp_path))
    header_end = GGUFReader(tmp_path / "valid.gguf").data_offset
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, header_end - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    try:
        load(tmp_path, bytes(raw))
    except GGUFError:
        pass


def test_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    import os
    import threading

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    result: list[BaseException] = []
    t = threading.Thread(target=lambda: result.append(pytest.raises(GGUFError, GGUFReader, fifo).value))
    t.start()
    t.join(10)
    assert not t.is_alive(), "opening a FIFO blocked"
    assert "it is a FIFO" in str(result[0]) and str(fifo) in str(result[0])
    with pytest.raises(GGUFError, match="it is a directory"):
        GGUFReader(tmp_path)
    with pytest.raises(GGUFError, match="it is a device"):
        GGUFReader("/dev/null")


def test_messages_name_the_file_and_the_format(tmp_path: Path) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (10**15).to_bytes(8, "little") + bytes(8))
    with pytest.raises(GGUFError) as e:
        GGUFReader(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: malformed GGUF file: tensor_count at byte 8"), msg
