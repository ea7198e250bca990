"""GGUF files: a strict, memory-mapped reader, NumPy dequantization, and a writer.

The reader validates every count, length, type and offset against the size of the file
before it uses or allocates anything it would size, and raises `GGUFError` naming the
field and its byte offset. Tensor data are zero-copy NumPy views of the mapped file.

A tensor whose data would extend past the end of the file is refused when the file is
opened. After that the mapping is only as sound as the file under it: `check_unchanged()`
(called by the model before every forward pass) turns a file truncated, grown or written in
place since it was opened into a GGUFError instead of a SIGBUS or silently changed weights.
What it cannot cover: a truncation between that check and the reads of the pass it guards
still raises SIGBUS (the repacked copies of the quantized matrices and the copies of the float
ones are in memory; the rest is read through the mapping). A file replaced by rename is safe:
the old data stay mapped.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import stat
import struct
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from pyinfer._gguf_scan import read_string_array
from pyinfer.errors import GGUFError
from pyinfer.gguf_types import BLOCK_SIZES, GGMLType, ValueType
from pyinfer.quants import dequantize, quantize

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
_I64_MAX = (1 << 63) - 1


# Fixed-size value types: struct format and NumPy dtype (little-endian).
_SCALAR: dict[ValueType, tuple[str, np.dtype]] = {
    ValueType.UINT8: ("<B", np.dtype("<u1")),
    ValueType.INT8: ("<b", np.dtype("<i1")),
    ValueType.UINT16: ("<H", np.dtype("<u2")),
    ValueType.INT16: ("<h", np.dtype("<i2")),
    ValueType.UINT32: ("<I", np.dtype("<u4")),
    ValueType.INT32: ("<i", np.dtype("<i4")),
    ValueType.FLOAT32: ("<f", np.dtype("<f4")),
    ValueType.BOOL: ("<B", np.dtype("<u1")),
    ValueType.UINT64: ("<Q", np.dtype("<u8")),
    ValueType.INT64: ("<q", np.dtype("<i8")),
    ValueType.FLOAT64: ("<d", np.dtype("<f8")),
}


# Plain element types: a tensor of one of these is viewed with this dtype.
_PLAIN_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.F32: np.dtype("<f4"),
    GGMLType.F16: np.dtype("<f2"),
    GGMLType.BF16: np.dtype("<u2"),
    GGMLType.I8: np.dtype("<i1"),
    GGMLType.I16: np.dtype("<i2"),
    GGMLType.I32: np.dtype("<i4"),
    GGMLType.I64: np.dtype("<i8"),
    GGMLType.F64: np.dtype("<f8"),
}

# Smallest possible records, used to bound counts by what the file could hold.
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, 1-byte key, value type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, name, n_dims, 1 dim, type, offset


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one state of a file from another: device, inode, size, modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def tensor_nbytes(shape: Iterable[int], ggml_type: int) -> int:
    """Bytes of a tensor with GGML shape `shape` (ne[0] first) of the given type."""
    block_elems, block_bytes = BLOCK_SIZES[GGMLType(ggml_type)]
    shape = list(shape)
    n = 1
    for d in shape:
        n *= d
    if shape[0] % block_elems:
        raise ValueError(f"row length {shape[0]} is not a multiple of the block size {block_elems}")
    return n // block_elems * block_bytes


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lives in the file and what it holds.

    `shape` is GGML order (ne[0], the contiguous row length, first); `np_shape` is the
    reverse, the shape of the NumPy array it dequantizes to.
    """

    name: str
    shape: tuple[int, ...]
    type: GGMLType
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def np_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class _Cursor:
    """Reads little-endian values from a buffer, checking every read against its end."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)

    def need(self, n: int, field: str) -> None:
        if n > self.end - self.pos:
            raise GGUFError(
                f"{field}: needs {n} bytes at byte {self.pos} but the file ends at byte {self.end} "
                "(truncated or corrupt file)"
            )

    def scalar(self, fmt: str, size: int, field: str) -> Any:
        self.need(size, field)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, field: str) -> int:
        return self.scalar("<I", 4, field)

    def u64(self, field: str) -> int:
        return self.scalar("<Q", 8, field)

    def string(self, field: str) -> str:
        start = self.pos
        n = self.u64(f"{field} (string length)")
        if n > self.end - self.pos:
            raise GGUFError(
                f"{field}: string of {n} bytes at byte {start} runs past the end of the file "
                f"(byte {self.end})"
            )
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{field}: invalid UTF-8 in string at byte {start}: {e.reason}") from None


class GGUFReader:
    """A GGUF file (version 2 or 3, little-endian), memory-mapped and validated.

    >>> r = GGUFReader("model.gguf")
    >>> r.metadata["general.architecture"]
    'llama'
    >>> r.tensors["token_embd.weight"].shape   # GGML order, ne[0] first
    (576, 49152)
    >>> r.dequantize("blk.0.attn_q.weight").shape  # NumPy order
    (576, 576)
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # Non-blocking, so a FIFO (which would wait for a writer) is seen and refused at once.
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        # The descriptor stays open for the reader's life: fstat on it sees the very file that
        # is mapped (check_unchanged), whatever is renamed over its path since.
        self._fd_closer = weakref.finalize(self, os.close, fd)
        self._fd = fd
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                        else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a file")
                raise GGUFError(f"{self.path}: not a GGUF file: it is {kind}, not a regular file")
            self.file_size = st.st_size
            if self.file_size < 4 + 4 + 8 + 8:
                raise GGUFError(
                    f"{self.path}: GGUF header: file is {self.file_size} bytes, too short for a GGUF "
                    "header (24 bytes)"
                )
            self._identity = _identity(st)
            self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            self._fd_closer()
            raise
        self._buf = memoryview(self._mmap)
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, tuple[ValueType, ...]] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._tensor_names: set[str] = set()
        try:
            self._parse()
        except GGUFError as e:  # every message: the file, that it is a GGUF problem, then the field
            self.close()
            raise GGUFError(f"{self.path}: malformed GGUF file: {e}") from None
        try:
            self.check_unchanged()  # written to while it was parsed: what was read may be torn
        except GGUFError:
            self.close()
            raise

    # -- the file under the mapping ----------------------------------------------------------

    def check_unchanged(self) -> None:
        """GGUFError if the mapped file changed since it was opened: truncated (reading the
        mapping past its new end would kill the process with SIGBUS), grown, or written in
        place (the mapped weights would change under the model). A file replaced by rename
        (as GGUFWriter and most downloaders write) is not a change: the mapping keeps the
        old file's data. One fstat: cheap enough to call before every forward pass."""
        if not self._fd_closer.alive:
            raise GGUFError(f"{self.path}: the GGUF reader is closed")
        now = _identity(os.fstat(self._fd))
        if now == self._identity:
            return
        size0, size1 = self._identity[2], now[2]
        if size1 < size0:
            what = (f"truncated from {size0} to {size1} bytes (the weights past the new end are gone; "
                    "reading them would crash the process)")
        elif size1 > size0:
            what = f"grown from {size0} to {size1} bytes"
        else:
            what = "modified in place (its modification time changed): the mapped weights may have changed"
        raise GGUFError(f"{self.path}: the GGUF file changed after it was loaded: {what}; load it again")

    # -- parsing -----------------------------------------------------------------------------

    def _parse(self) -> None:
        c = _Cursor(self._buf)
        magic = bytes(self._buf[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"magic at byte 0: expected b'GGUF', found {magic!r} (not a GGUF file)")
        c.pos = 4
        version = c.u32("version")
        if version not in SUPPORTED_VERSIONS:
            if version in (2 << 24, 3 << 24):
                raise GGUFError("version at byte 4: big-endian GGUF files are not supported")
            if version == 1:
                raise GGUFError("version at byte 4: GGUF version 1 is not supported (only 2 and 3)")
            raise GGUFError(f"version at byte 4: unknown GGUF version {version} (supported: 2, 3)")
        self.version = version

        at = c.pos
        n_tensors = c.u64("tensor_count")
        n_kv_at = c.pos
        n_kv = c.u64("metadata_kv_count")
        room = c.end - c.pos
        if n_tensors > room // _MIN_TENSOR_INFO_BYTES:
            raise GGUFError(
                f"tensor_count at byte {at}: {n_tensors} tensors cannot fit in the "
                f"{room} bytes left in the file"
            )
        if n_kv > room // _MIN_KV_BYTES or n_tensors * _MIN_TENSOR_INFO_BYTES + n_kv * _MIN_KV_BYTES > room:
            raise GGUFError(
                f"metadata_kv_count at byte {n_kv_at}: {n_kv} key-value pairs (with {n_tensors} "
                f"tensors) cannot fit in the {room} bytes left in the file"
            )

        for i in range(n_kv):
            key_at = c.pos
            key = c.string(f"metadata key #{i}")
            if not key:
                raise GGUFError(f"metadata key #{i} at byte {key_at}: empty key")
            if key in self.metadata:
                raise GGUFError(f"metadata key {key!r} at byte {key_at}: duplicate key")
            type_at = c.pos
            vtype = self._value_type(c.u32(f"{key} (value type)"), key, type_at)
            if vtype == ValueType.ARRAY:
                etype_at = c.pos
                etype = self._value_type(c.u32(f"{key} (array element type)"), key, etype_at)
                if etype == ValueType.ARRAY:
                    raise GGUFError(f"{key} at byte {etype_at}: nested arrays are not allowed")
                self.metadata[key] = self._read_array(c, etype, key)
                self.metadata_types[key] = (vtype, etype)
            else:
                self.metadata[key] = self._read_value(c, vtype, key)
                self.metadata_types[key] = (vtype,)

        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.metadata:
            a = self.metadata["general.alignment"]
            if self.metadata_types["general.alignment"] != (ValueType.UINT32,):
                raise GGUFError(
                    f"general.alignment: must be a UINT32, found "
                    f"{'/'.join(t.name for t in self.metadata_types['general.alignment'])}"
                )
            if a == 0 or a & (a - 1):
                raise GGUFError(f"general.alignment: {a} is not a power of two")
            self.alignment = a

        infos = []
        for i in range(n_tensors):
            infos.append(self._read_tensor_info(c, i))

        self.data_offset = -(-c.pos // self.alignment) * self.alignment
        if n_tensors and self.data_offset > self.file_size:
            raise GGUFError(
                f"tensor data: the data section would start at byte {self.data_offset}, "
                f"past the end of the file (byte {self.file_size})"
            )
        for name, shape, ttype, rel, nbytes, info_at in infos:
            start = self.data_offset + rel
            if nbytes > self.file_size - start or start > self.file_size:
                raise GGUFError(
                    f"tensor {name!r} (info at byte {info_at}): data [{start}, {start + nbytes}) "
                    f"lies outside the file ({self.file_size} bytes; truncated file?)"
                )
            self.tensors[name] = TensorInfo(name, shape, ttype, start, nbytes)
        ordered = sorted(self.tensors.values(), key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):
            if b.offset < a.offset + a.nbytes:
                raise GGUFError(
                    f"tensor {b.name!r}: data at byte {b.offset} overlaps tensor {a.name!r} "
                    f"[{a.offset}, {a.offset + a.nbytes})"
                )

    @staticmethod
    def _value_type(v: int, key: str, at: int) -> ValueType:
        try:
            return ValueType(v)
        except ValueError:
            raise GGUFError(f"{key} at byte {at}: unknown value type {v}") from None

    def _read_value(self, c: _Cursor, vtype: ValueType, key: str) -> Any:
        if vtype == ValueType.STRING:
            return c.string(key)
        fmt, dt = _SCALAR[vtype]
        at = c.pos
        v = c.scalar(fmt, dt.itemsize, key)
        if vtype == ValueType.BOOL:
            if v > 1:
                raise GGUFError(f"{key} at byte {at}: bool value {v} is neither 0 nor 1")
            return bool(v)
        return v

    def _read_array(self, c: _Cursor, etype: ValueType, key: str) -> Any:
        count_at = c.pos
        count = c.u64(f"{key} (array length)")
        room = c.end - c.pos
        if etype == ValueType.STRING:
            if count > room // 8:
                raise GGUFError(
                    f"{key} at byte {count_at}: {count} strings cannot fit in the {room} bytes left"
                )
            values, c.pos = read_string_array(self._buf, c.pos, count, key)
            return values
        _, dt = _SCALAR[etype]
        if count > room // dt.itemsize:
            raise GGUFError(
                f"{key} at byte {count_at}: {count} {etype.name} elements cannot fit in the "
                f"{room} bytes left"
            )
        arr = np.frombuffer(self._buf, dtype=dt, count=count, offset=c.pos).copy()
        if etype == ValueType.BOOL:
            if count and arr.max() > 1:
                raise GGUFError(f"{key} at byte {c.pos}: bool array holds a value other than 0 or 1")
            arr = arr.astype(bool)
        c.pos += count * dt.itemsize
        return arr

    def _read_tensor_info(self, c: _Cursor, i: int) -> tuple:
        info_at = c.pos
        name = c.string(f"tensor #{i} name")
        if not name:
            raise GGUFError(f"tensor #{i} at byte {info_at}: empty name")
        if name in self._tensor_names:
            raise GGUFError(f"tensor {name!r} at byte {info_at}: duplicate tensor name")
        nd_at = c.pos
        n_dims = c.u32(f"tensor {name!r} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"tensor {name!r} n_dims at byte {nd_at}: {n_dims} is outside 1..{MAX_DIMS}")
        shape = []
        n_elems = 1
        for d in range(n_dims):
            dim_at = c.pos
            ne = c.u64(f"tensor {name!r} dim {d}")
            if ne == 0:
                raise GGUFError(f"tensor {name!r} dim {d} at byte {dim_at}: zero-sized dimension")
            n_elems *= ne
            if n_elems > _I64_MAX:
                raise GGUFError(
                    f"tensor {name!r} dim {d} at byte {dim_at}: element count overflows 64 bits"
                )
            shape.append(ne)
        type_at = c.pos
        tval = c.u32(f"tensor {name!r} type")
        try:
            ttype = GGMLType(tval)
        except ValueError:
            raise GGUFError(f"tensor {name!r} type at byte {type_at}: unknown tensor type {tval}") from None
        block_elems, block_bytes = BLOCK_SIZES[ttype]
        if shape[0] % block_elems:
            raise GGUFError(
                f"tensor {name!r} dim 0 at byte {nd_at + 4}: row length {shape[0]} is not a "
                f"multiple of the {ttype.name} block size {block_elems}"
            )
        nbytes = n_elems // block_elems * block_bytes
        if nbytes > _I64_MAX:
            raise GGUFError(f"tensor {name!r} at byte {info_at}: byte size overflows 64 bits")
        off_at = c.pos
        rel = c.u64(f"tensor {name!r} offset")
        if rel % self.alignment:
            raise GGUFError(
                f"tensor {name!r} offset at byte {off_at}: {rel} is not a multiple of the "
                f"alignment {self.alignment}"
            )
        self._tensor_names.add(name)
        return (name, tuple(shape), ttype, rel, nbytes, info_at)

    # -- access --------------------------------------------------------------------------------

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapped file (no copy)."""
        t = self._info(name)
        return np.frombuffer(self._buf, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor as stored, without a copy: plain types with their dtype in NumPy order
        (BF16 as uint16 bits); block types as uint8 of shape (..., bytes per row)."""
        t = self._info(name)
        raw = self.raw(name)
        if t.type in _PLAIN_DTYPES:
            return raw.view(_PLAIN_DTYPES[t.type]).reshape(t.np_shape)
        block_elems, block_bytes = BLOCK_SIZES[t.type]
        row_bytes = t.shape[0] // block_elems * block_bytes
        return raw.reshape(*t.np_shape[:-1], row_bytes)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array in NumPy order."""
        t = self._info(name)
        return dequantize(self.raw(name), t.type).reshape(t.np_shape)

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self.path}") from None

    def close(self) -> None:
        """Unmap the file. Views handed out keep the mapping alive until they are gone."""
        try:
            self._buf.release()
            self._mmap.close()
        except BufferError:
            # Arrays still view the file; the mapping goes when the last one is freed, and the
            # descriptor (for check_unchanged on their behalf) with the reader.
            return
        self._fd_closer()

    def __enter__(self) -> GGUFReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- writer ------------------------------------------------------------------------------------


def _infer_value_type(value: Any) -> tuple[ValueType, ValueType | None]:
    """(value type, array element type) for a Python or NumPy value."""
    if isinstance(value, (bool, np.bool_)):
        return ValueType.BOOL, None
    if isinstance(value, (int, np.integer)):
        return (ValueType.INT32 if -(1 << 31) <= value < (1 << 31) else ValueType.INT64), None
    if isinstance(value, (float, np.floating)):
        return ValueType.FLOAT32, None
    if isinstance(value, str):
        return ValueType.STRING, None
    if isinstance(value, np.ndarray):
        for vt, (_, dt) in _SCALAR.items():
            if vt != ValueType.BOOL and value.dtype == dt.newbyteorder("="):
                return ValueType.ARRAY, vt
        if value.dtype == np.bool_:
            return ValueType.ARRAY, ValueType.BOOL
        raise ValueError(f"no GGUF array type for dtype {value.dtype}")
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("cannot infer the element type of an empty list: pass etype=")
        etype, _ = _infer_value_type(value[0])
        if any(_infer_value_type(v)[0] != etype for v in value):
            raise ValueError("array elements must all have the same type")
        return ValueType.ARRAY, etype
    raise ValueError(f"no GGUF value type for {type(value).__name__}")


def check_output_path(path: str | os.PathLike[str]) -> None:
    """ValueError unless a file can be written at path: its folder exists, and it is not a
    folder itself."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"the output {p} is a directory: give a file name")
    if not p.parent.is_dir():
        raise ValueError(f"the output's folder {p.parent} does not exist")


class GGUFWriter:
    """Writes a GGUF file (version 3 by default): metadata, then tensors.

    >>> w = GGUFWriter("tiny.gguf")
    >>> w.add("general.architecture", "llama")
    >>> w.add("llama.block_count", 2, ValueType.UINT32)
    >>> w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    >>> w.add_tensor("token_embd.weight", np.zeros((100, 64), np.float32), GGMLType.Q8_0)
    >>> w.write()

    A float array is quantized to the requested type (F32, F16, BF16, Q8_0, Q4_0, Q4_1);
    raw blocks of any type are written as given with `add_raw_tensor`. The file appears
    only when complete (written to a temporary name, then renamed).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, alignment: int = DEFAULT_ALIGNMENT, version: int = 3
    ) -> None:
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"version must be one of {SUPPORTED_VERSIONS}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a power of two")
        self.path = Path(path)
        self.version = version
        self.alignment = alignment
        self._kv: dict[str, tuple[ValueType, ValueType | None, Any]] = {}
        self._tensors: dict[str, tuple[tuple[int, ...], GGMLType, np.ndarray]] = {}
        if alignment != DEFAULT_ALIGNMENT:
            self.add("general.alignment", alignment, ValueType.UINT32)

    def add(
        self, key: str, value: Any, vtype: ValueType | None = None, etype: ValueType | None = None
    ) -> None:
        """Add a metadata key. Types are inferred unless given (int -> INT32 or INT64,
        float -> FLOAT32, list -> ARRAY of its first element's type)."""
        if not key:
            raise ValueError("metadata key must not be empty")
        if key in self._kv:
            raise ValueError(f"duplicate metadata key {key!r}")
        if vtype is None:
            vtype, inferred = _infer_value_type(value)
            etype = etype or inferred
        elif vtype == ValueType.ARRAY and etype is None:
            etype = _infer_value_type(value)[1]
        if vtype == ValueType.ARRAY and etype in (None, ValueType.ARRAY):
            raise ValueError(f"{key}: arrays need a non-array element type")
        self._kv[key] = (ValueType(vtype), etype, value)

    def add_tensor(self, name: str, data: np.ndarray, ggml_type: int = GGMLType.F32) -> None:
        """Add a tensor from float values in NumPy order, quantized to `ggml_type`."""
        data = np.asarray(data, dtype=np.float32)
        shape = tuple(reversed(data.shape))
        self.add_raw_tensor(name, quantize(data, ggml_type), shape, ggml_type)

    def add_raw_tensor(self, name: str, raw: np.ndarray, shape: tuple[int, ...], ggml_type: int) -> None:
        """Add a tensor from its raw bytes; `shape` is GGML order (ne[0] first)."""
        if not name:
            raise ValueError("tensor name must not be empty")
        if name in self._tensors:
            raise ValueError(f"duplicate tensor name {name!r}")
        t = GGMLType(ggml_type)
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= MAX_DIMS or min(shape) <= 0:
            raise ValueError(f"{name}: shape {shape} needs 1..{MAX_DIMS} positive dimensions")
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        if raw.size != tensor_nbytes(shape, t):
            raise ValueError(f"{name}: {raw.size} bytes given, {tensor_nbytes(shape, t)} expected")
        self._tensors[name] = (shape, t, raw)

    # -- encoding --

    @staticmethod
    def _string(s: str) -> bytes:
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _value(self, vtype: ValueType, value: Any) -> bytes:
        if vtype == ValueType.STRING:
            return self._string(value)
        fmt, _ = _SCALAR[vtype]
        return struct.pack(fmt, int(bool(value)) if vtype == ValueType.BOOL else value)

    def _encode_kv(self, key: str, vtype: ValueType, etype: ValueType | None, value: Any) -> bytes:
        out = [self._string(key), struct.pack("<I", vtype)]
        if vtype != ValueType.ARRAY:
            out.append(self._value(vtype, value))
            return b"".join(out)
        assert etype is not None
        out.append(struct.pack("<IQ", etype, len(value)))
        if etype == ValueType.STRING:
            out.extend(self._string(v) for v in value)
        else:
            dt = _SCALAR[etype][1]
            out.append(np.asarray(value).astype(dt).tobytes())
        return b"".join(out)

    def write(self) -> None:
        header = [GGUF_MAGIC, struct.pack("<IQQ", self.version, len(self._tensors), len(self._kv))]
        header += [self._encode_kv(k, vt, et, v) for k, (vt, et, v) in self._kv.items()]
        offset = 0
        offsets = []
        for name, (shape, t, raw) in self._tensors.items():
            offsets.append(offset)
            header.append(self._string(name))
            header.append(struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape))
            header.append(struct.pack("<IQ", t, offset))
            offset += -(-raw.size // self.alignment) * self.alignment
        head = b"".join(header)
        check_output_path(self.path)
        # Written beside it under a name of its own, then renamed over it: a reader of the path
        # sees the old file or the whole new one, and a failed write leaves nothing behind.
        # (Made as open() makes a file, the umask applied; O_EXCL: no other writer's name.)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                self._write_body(f, head, offsets)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _write_body(self, f: BinaryIO, head: bytes, offsets: list[int]) -> None:
        f.write(head)
        data_start = -(-len(head) // self.alignment) * self.alignment
        f.write(b"\0" * (data_start - len(head)))
        for (_, _, raw), off in zip(self._tensors.values(), offsets):
            f.write(b"\0" * (data_start + off - f.tell()))
            f.write(raw.tobytes())
