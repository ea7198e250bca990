"""Memory-read bandwidth of this machine: the ceiling every decode figure is compared with.

Runs the probe (a 512 MiB array, far past the last-level cache) with 1..N threads, several
passes each, and writes every pass to JSON plus a Markdown summary of medians and bests.

    python bench/bench_bandwidth.py [--threads 1 2] [--repeats 10] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import pyinfer


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--mib", type=int, default=512, help="array size in MiB")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()

    runs = []
    for n in dict.fromkeys(args.threads):
        r = pyinfer.measure_read_bandwidth(args.mib << 20, n_threads=n, repeats=args.repeats)
        runs.append(r)
        print(f"{n} thread(s): median {r['median_gbps']:.1f} GB/s, best {r['best_gbps']:.1f} GB/s "
              f"({r['repeats']} passes over {r['n_bytes'] / 2**20:.0f} MiB, {r['isa']})")

    report = {
        "study": "read_bandwidth",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count()},
        "cpu": pyinfer.cpu_info(),
        "pyinfer": pyinfer.__version__,
        "commit": _commit(),
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"bandwidth-{stamp}.json").write_text(json.dumps(report, indent=1))
    md = ["| threads | median GB/s | best GB/s | passes | ISA |", "| --- | --- | --- | --- | --- |"]
    md += [f"| {r['n_threads']} | {r['median_gbps']:.1f} | {r['best_gbps']:.1f} | {r['repeats']} | {r['isa']} |"
           for r in runs]
    (args.out / f"bandwidth-{stamp}.md").write_text("\n".join(md) + "\n")
    print(f"wrote {args.out}/bandwidth-{stamp}.json and .md")


if __name__ == "__main__":
    main()
