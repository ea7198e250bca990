"""End-to-end speed beside peers: pp512 and tg128 through pyinfer, llama-cpp-python and
float32 transformers (when importable) and a llama-bench binary, alternating in one series,
plus the generate() loop's overhead. A thin front to `pyinfer bench peers`.

    python bench/bench_e2e.py [--threads 1 2] [--model PATH] [--llama-bench PATH] [--no-peers] [--quick]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pyinfer.bench import run_bench

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--llama-bench", default=None)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    a = ap.parse_args()
    run_bench(["peers"], model=a.model, quick=a.quick, out=a.out, threads=a.threads,
              llama_bench=a.llama_bench, peers=not a.no_peers)
