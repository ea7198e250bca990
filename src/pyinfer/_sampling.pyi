"""Type stub for the Cython module pyinfer._sampling (see _sampling.pyx)."""

import numpy as np

def exp_sum(x: np.ndarray, m: float, inv_t: float, scratch: np.ndarray) -> float: ...
def top_ids(x: np.ndarray, k: int, out: np.ndarray) -> int: ...
def apply_penalties(
    x: np.ndarray,
    window: list[int],
    counts: np.ndarray,
    repeat: float,
    presence: float,
    frequency: float,
) -> None: ...
def apply_bias(x: np.ndarray, ids: np.ndarray, bias: np.ndarray) -> None: ...
def filter_candidates(
    x: np.ndarray,
    m: float,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    idx: np.ndarray,
    w: np.ndarray,
    scratch: np.ndarray,
) -> int: ...
def draw(w: np.ndarray, c: int, u: float) -> int: ...
