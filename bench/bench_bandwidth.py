"""Memory-read bandwidth of this machine at 1..N threads (the ceiling every decode figure is
compared with) and one core's cache-resident matmul throughput. A thin front to
`pyinfer bench ceiling`.

    python bench/bench_bandwidth.py [--threads 1 2] [--quick] [--out bench/results]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pyinfer.bench import run_bench

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    a = ap.parse_args()
    run_bench(["ceiling"], quick=a.quick, out=a.out, threads=a.threads)
