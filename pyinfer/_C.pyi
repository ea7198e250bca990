"""Type stub for pyinfer._C, the C++ kernels (tests check it names exactly what the module has)."""

from typing import Any

import numpy as np
import numpy.typing as npt

def cpu_info() -> dict[str, Any]:
    """Detected CPU features, compiled and available ISA paths, the active one."""

def get_isa() -> str:
    """The active ISA path: 'scalar', 'avx2' or 'avx512'."""

def set_isa(name: str) -> None:
    """Switch the active ISA path; RuntimeError if this CPU lacks it, ValueError if unknown."""

def dequantize(type: int, raw: npt.NDArray[np.uint8], n: int) -> npt.NDArray[np.float32]:
    """Dequantize n elements of raw GGUF blocks of the given type id to float32."""

def read_bandwidth(n_bytes: int = ..., n_threads: int = 1, repeats: int = 10) -> dict[str, Any]:
    """Time `repeats` passes reading an n_bytes array with n_threads threads."""
