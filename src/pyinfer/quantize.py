"""`pyinfer quantize`: rewrite a GGUF model with every weight matrix in one format, or in the
Q4_K_M mix of Q4_K and Q6_K."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from pyinfer.gguf import GGUFReader, GGUFWriter, check_output_path
from pyinfer.gguf_types import BLOCK_SIZES, GGMLType, ValueType

# The formats the writer can produce from float32, by their command-line names.
TARGET_TYPES: dict[str, GGMLType] = {
    "f32": GGMLType.F32,
    "f16": GGMLType.F16,
    "bf16": GGMLType.BF16,
    "q8_0": GGMLType.Q8_0,
    "q4_0": GGMLType.Q4_0,
    "q4_1": GGMLType.Q4_1,
    "q5_0": GGMLType.Q5_0,
    "q5_1": GGMLType.Q5_1,
    "q4_k": GGMLType.Q4_K,
    "q5_k": GGMLType.Q5_K,
    "q6_k": GGMLType.Q6_K,
    "q4_k_m": GGMLType.Q4_K,  # the mix: see _mix_type
}

# llama.cpp's llama_ftype for the file's format: readers show it as the file's
# "quantization" and some tools pick defaults from it (q4_k and q5_k: its _S variants).
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q4_k": 14,
              "q4_k_m": 15, "q5_k": 16, "q6_k": 18, "bf16": 32}

# A K-quant matrix whose rows are not whole 256-element super-blocks takes the 32-element type
# of about as many bits, as llama.cpp's quantizer does.
_K_FALLBACK = {GGMLType.Q4_K: GGMLType.Q5_0, GGMLType.Q5_K: GGMLType.Q5_1, GGMLType.Q6_K: GGMLType.Q8_0}


def _more_bits(layer: int, n_layer: int) -> bool:
    """The layers whose attn_v and ffn_down a Q4_K_M file keeps in Q6_K: the first and last
    eighth, and every third one between (llama.cpp's choice)."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def _mix_type(name: str, n_layer: int, tied: bool) -> GGMLType:
    """Q4_K_M: Q6_K for the output head (the embedding when it doubles as the head) and for
    attn_v and ffn_down on _more_bits layers; Q4_K for every other matrix."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return GGMLType.Q6_K
    m = re.match(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight$", name)
    if m and _more_bits(int(m.group(1)), n_layer):
        return GGMLType.Q6_K
    return GGMLType.Q4_K


def matrix_type(type_name: str, name: str, n_layer: int, tied: bool, row_length: int) -> GGMLType:
    """The type weight matrix `name` (rows of `row_length`) takes in a file of `type_name`
    (a TARGET_TYPES key; "q4_k_m": _mix_type's choice). A matrix whose rows are not a whole
    number of that type's blocks falls back: a K-quant to Q5_0, Q5_1 or Q8_0 (rows of
    256-element super-blocks are rarer than rows of 32), anything else to F16."""
    out = _mix_type(name, n_layer, tied) if type_name == "q4_k_m" else TARGET_TYPES[type_name]
    if row_length % BLOCK_SIZES[out][0]:
        out = _K_FALLBACK.get(out, out)
    if row_length % BLOCK_SIZES[out][0]:
        out = GGMLType.F16
    return out


def _keeps_f32(name: str, shape: tuple[int, ...]) -> bool:
    """Norm weights and other vectors stay float32, as llama.cpp's quantizer keeps them."""
    return len(shape) == 1 or name.endswith("norm.weight")


def quantize_model(src: str | os.PathLike[str], dst: str | os.PathLike[str], type_name: str) -> dict[str, Any]:
    """Write `dst`: `src` with every weight matrix dequantized to float32 and re-quantized to
    `type_name` (one of TARGET_TYPES; "q4_k_m" the Q4_K/Q6_K mix of _mix_type), the embedding
    and output head included (each matrix's type, fallbacks included: matrix_type); vectors
    (norms) stay F32. Metadata is copied with its value types; general.file_type is set.
    Returns a summary: the tensor count per written type and the output's size.
    """
    key = type_name.lower()
    if key not in TARGET_TYPES:
        raise ValueError(f"type must be one of {', '.join(TARGET_TYPES)}, got {type_name!r}")
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ValueError("the output must not be the input file")
    check_output_path(dst)  # before the work, not after it
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
        n_layer = 1 + max((int(m.group(1)) for m in map(re.compile(r"blk\.(\d+)\.").match, r.tensors) if m),
                          default=-1)
        tied = "output.weight" not in r.tensors
        for name, t in r.tensors.items():
            values = r.dequantize(name)
            out = GGMLType.F32 if _keeps_f32(name, t.shape) else matrix_type(key, name, n_layer, tied, t.shape[0])
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
