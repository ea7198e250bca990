"""Byte-level GGUF builder for tests: writes whatever it is told, valid or not."""

from __future__ import annotations

import struct


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, v: int) -> bytes:
    return kv(key, 4, struct.pack("<I", v))


def kv_str(key: str, v: str) -> bytes:
    return kv(key, 8, s(v))


def tinfo(name: str | bytes, dims: list[int], ttype: int, offset: int) -> bytes:
    return s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ttype, offset)


def gguf(kvs: list[bytes] = (), tinfos: list[bytes] = (), data: bytes = b"", *, version: int = 3,
         n_tensors: int | None = None, n_kv: int | None = None, magic: bytes = b"GGUF",
         alignment: int = 32) -> bytes:
    head = magic + struct.pack("<IQQ", version, len(tinfos) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(tinfos)
    pad = (-len(head)) % alignment
    return head + b"\0" * pad + data
