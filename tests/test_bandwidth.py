"""The read-bandwidth probe: sane figures, and proof that every byte was read on every path."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

import pyinfer
from pyinfer.bandwidth import measure_read_bandwidth

SMALL = 64 << 20  # past the 32 MiB L3, yet quick


def expected_checksum(n_bytes: int, n_threads: int) -> int:
    """Sum mod 2**64 of the probe's array as little-endian uint64 words, computed apart from it:
    byte i of thread t's slice is (i * 131 + t) % 256, which repeats every 256 bytes."""
    slice_bytes = n_bytes // n_threads
    assert slice_bytes % 256 == 0
    total = 0
    for t in range(n_threads):
        period = ((np.arange(256, dtype=np.int64) * 131 + t) % 256).astype(np.uint8)
        words = period.view("<u8").astype(object)
        total += int(sum(words)) * (slice_bytes // 256)
    return total % (1 << 64)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_figures_are_positive_and_finite(isa: str, n_threads: int) -> None:
    r = measure_read_bandwidth(SMALL, n_threads=n_threads, repeats=2)
    assert r["n_bytes"] == SMALL and r["n_threads"] == n_threads and r["repeats"] == 2
    assert r["isa"] == isa
    assert len(r["seconds"]) == len(r["gbps"]) == 2
    for s, g in zip(r["seconds"], r["gbps"]):
        assert s > 0 and math.isfinite(s)
        assert g > 0 and math.isfinite(g)
        assert g == pytest.approx(SMALL / s / 1e9, rel=1e-12)
    assert r["best_gbps"] == max(r["gbps"])
    assert min(r["gbps"]) <= r["median_gbps"] <= r["best_gbps"]


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_checksum_covers_every_byte(isa: str, n_threads: int) -> None:
    r = measure_read_bandwidth(8 << 20, n_threads=n_threads, repeats=2)
    assert r["checksum"] == expected_checksum(r["n_bytes"], n_threads)


def test_size_rounds_down_to_whole_pages_per_thread() -> None:
    r = measure_read_bandwidth(3 * 4096 * 3 + 100, n_threads=3, repeats=1)
    assert r["n_bytes"] == 3 * 4096 * 3
    assert r["checksum"] == expected_checksum(r["n_bytes"], 3)


def test_defaults() -> None:
    params = inspect.signature(measure_read_bandwidth).parameters
    assert params["n_bytes"].default == 512 << 20
    assert params["n_threads"].default == 1
    assert params["repeats"].default == 10
    assert "measure_read_bandwidth" in pyinfer.__all__


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_threads": 0},
        {"repeats": 0},
        {"n_bytes": 0},
        {"n_bytes": -1},
        {"n_bytes": 100},  # smaller than one page
        {"n_bytes": 4096, "n_threads": 2},  # not a page per thread
        {"n_threads": True},
        {"repeats": 1.5},
    ],
)
def test_bad_arguments_raise(kwargs: dict) -> None:
    args = {"n_bytes": 1 << 20, "n_threads": 1, "repeats": 1, **kwargs}
    with pytest.raises(ValueError):
        measure_read_bandwidth(**args)


@pytest.mark.parametrize("kernel,n_arrays", [("copy", 2), ("triad", 3)])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_stream_kernels(kernel: str, n_arrays: int, n_threads: int) -> None:
    from pyinfer.bandwidth import measure_stream_bandwidth

    r = measure_stream_bandwidth(kernel, SMALL, n_threads=n_threads, repeats=2)
    # STREAM's count: every array once per pass, each a whole number of 4 KiB pages per thread.
    assert r["n_bytes"] % (n_arrays * 4096 * n_threads) == 0
    assert SMALL - n_arrays * 4096 * n_threads < r["n_bytes"] <= SMALL
    assert len(r["gbps"]) == 2 and all(math.isfinite(g) and g > 0 for g in r["gbps"])
    assert r["checksum"] == 0


def test_stream_bad_arguments() -> None:
    from pyinfer.bandwidth import measure_stream_bandwidth

    with pytest.raises(ValueError, match="copy' or 'triad"):
        measure_stream_bandwidth("scale")
    with pytest.raises(ValueError, match="n_threads"):
        measure_stream_bandwidth("copy", n_threads=0)
