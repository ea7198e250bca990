"""Memory read bandwidth: the ceiling a bandwidth-bound decode step is measured against."""

from __future__ import annotations

import statistics
from typing import Any

from pyinfer import _C


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def measure_read_bandwidth(
    n_bytes: int = 512 << 20, n_threads: int = 1, repeats: int = 10
) -> dict[str, Any]:
    """Time ``repeats`` passes of ``n_threads`` threads reading an ``n_bytes`` array.

    Each thread reads its own contiguous slice with the active ISA path's widest loads
    (``pyinfer.cpu_info()["isa"]``). Threads are started, and the array filled, before the
    first pass; each pass is timed between two barriers. The default array (512 MiB) is far
    larger than any last-level cache, so the figure is DRAM bandwidth.

    Returns a dict with:

    - ``n_bytes``: bytes read per pass (``n_bytes`` rounded down to a multiple of
      4096 * n_threads), ``n_threads``, ``repeats``, ``isa``;
    - ``seconds`` and ``gbps``: per pass, in seconds and in GB/s (1 GB = 1e9 bytes);
    - ``best_gbps`` and ``median_gbps`` over the passes;
    - ``checksum``: the sum modulo 2**64 of the array's little-endian 64-bit words, where
      byte i of thread t's slice is ``(i * 131 + t) % 256``, so every byte was read.
    """
    n_bytes = _positive_int("n_bytes", n_bytes)
    n_threads = _positive_int("n_threads", n_threads)
    repeats = _positive_int("repeats", repeats)
    r = _C.read_bandwidth(n_bytes, n_threads, repeats)
    return _summary(r, repeats)


def measure_stream_bandwidth(
    kernel: str, n_bytes: int = 512 << 20, n_threads: int = 1, repeats: int = 10
) -> dict[str, Any]:
    """STREAM's ``copy`` (a = b) or ``triad`` (a = b + s*c) over float arrays of about
    ``n_bytes`` in all, each thread on its own slices, timed like the read probe.

    ``n_bytes`` in the result is STREAM's count of bytes moved per pass (read plus
    written, write-allocate traffic not counted); the other keys are as in
    ``measure_read_bandwidth`` (``checksum`` is 0).
    """
    if kernel not in ("copy", "triad"):
        raise ValueError(f"kernel must be 'copy' or 'triad', got {kernel!r}")
    n_bytes = _positive_int("n_bytes", n_bytes)
    n_threads = _positive_int("n_threads", n_threads)
    repeats = _positive_int("repeats", repeats)
    return _summary(_C.stream_bandwidth(kernel, n_bytes, n_threads, repeats), repeats)


def _summary(r: dict[str, Any], repeats: int) -> dict[str, Any]:
    seconds = [float(s) for s in r["seconds"]]
    gbps = [r["n_bytes"] / s / 1e9 if s > 0 else float("inf") for s in seconds]
    return {
        "n_bytes": int(r["n_bytes"]),
        "n_threads": int(r["n_threads"]),
        "repeats": repeats,
        "isa": _C.get_isa(),
        "seconds": seconds,
        "gbps": gbps,
        "best_gbps": max(gbps),
        "median_gbps": statistics.median(gbps),
        "checksum": int(r["checksum"]),
    }
