"""Type stub for the Cython module pyinfer._gguf_scan (see _gguf_scan.pyx)."""

import numpy as np

def read_string_array(
    buf: np.ndarray | bytes | bytearray | memoryview, pos: int, count: int, field: str
) -> tuple[list[str], int]: ...
