"""`pyinfer quantize`: rewrite a GGUF model with every weight matrix in one format."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from pyinfer.gguf import GGUFReader, GGUFWriter
from pyinfer.gguf_types import BLOCK_SIZES, GGMLType, ValueType

# The formats the writer can produce from float32, by their command-line names.
TARGET_TYPES: dict[str, GGMLType] = {
    "f32": GGMLType.F32,
    "f16": GGMLType.F16,
    "bf16": GGMLType.BF16,
    "q8_0": GGMLType.Q8_0,
    "q4_0": GGMLType.Q4_0,
    "q4_1": GGMLType.Q4_1,
}

# llama.cpp's llama_ftype for a file whose matrices are all of one type: readers show it
# as the file's "quantization" and some tools pick defaults from it.
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "bf16": 32}


def _keeps_f32(name: str, shape: tuple[int, ...]) -> bool:
    """Norm weights and other vectors stay float32, as llama.cpp's quantizer keeps them."""
    return len(shape) == 1 or name.endswith("norm.weight")


def quantize_model(src: str | os.PathLike[str], dst: str | os.PathLike[str], type_name: str) -> dict[str, Any]:
    """Write `dst`: `src` with every weight matrix dequantized to float32 and re-quantized to
    `type_name` (one of TARGET_TYPES), the embedding and output head included; vectors
    (norms) stay F32. Metadata is copied with its value types; general.file_type is set.

    A matrix whose rows are not a whole number of the target's blocks falls back to F16
    (the block formats need rows that are multiples of 32). Returns a summary: the tensor
    count per written type and the output's size.
    """
    key = type_name.lower()
    if key not in TARGET_TYPES:
        raise ValueError(f"type must be one of {', '.join(TARGET_TYPES)}, got {type_name!r}")
    target = TARGET_TYPES[key]
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ValueError("the output must not be the input file")
    counts: dict[str, int] = {}
    with GGUFReader(src) as r:
        alignment = int(r.metadata.get("general.alignment", 32))
        w = GGUFWriter(dst, alignment=alignment)
        for k, value in r.metadata.items():
            if k in ("general.alignment", "general.file_type"):
                continue
            types = r.metadata_types[k]
            w.add(k, value, types[0], types[1] if len(types) > 1 else None)
        w.add("general.file_type", _FILE_TYPE[key], ValueType.UINT32)
        for name, t in r.tensors.items():
            values = r.dequantize(name)
            out = target
            if _keeps_f32(name, t.shape):
                out = GGMLType.F32
            elif t.shape[0] % BLOCK_SIZES[target][0]:
                out = GGMLType.F16
            w.add_tensor(name, values, out)
            counts[out.name] = counts.get(out.name, 0) + 1
            del values
        w.write()
    return {"path": str(dst), "type": key, "tensor_types": counts, "file_size": dst.stat().st_size}


def derived_path(src: str | os.PathLike[str], type_name: str) -> Path:
    """Where the cache keeps `src` converted to `type_name`: keyed by the source's name, size
    and modification time, so an edited source is converted again."""
    from pyinfer.registry import cache_dir

    src = Path(src).resolve()
    st = src.stat()
    tag = hashlib.sha256(f"{src}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:10]
    return cache_dir() / "derived" / f"{src.stem}-{tag}.{type_name.lower()}.gguf"


def ensure_derived(src: str | os.PathLike[str], type_name: str) -> Path:
    """`src` in `type_name`, converted once and kept in the cache."""
    dst = derived_path(src, type_name)
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        quantize_model(src, dst, type_name)
    return dst
