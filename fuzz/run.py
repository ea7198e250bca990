"""Runs the fuzz harnesses, each for a bounded time on a fresh seed corpus (seeds.py), and
prints each one's executions; exits 1 if any found a crash, a failed invariant, a hang or a
leak, leaving the input under --artifacts (turn it into a regression test).

    python fuzz/run.py                      # every harness, 45 s each (CI)
    python fuzz/run.py gguf --seconds 600   # one, longer
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import seeds

HERE = Path(__file__).resolve().parent
HARNESSES = {"gguf": "fuzz_gguf.py", "tokenizer": "fuzz_tokenizer.py", "chat": "fuzz_chat.py",
             "kernels": "fuzz_kernels.py"}


def run(name: str, seconds: int, artifacts: Path, max_len: int) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix=f"pyinfer-fuzz-{name}-") as d:
        corpus = Path(d) / "corpus"
        n_seeds = seeds.write(name, corpus)
        cmd = [sys.executable, str(HERE / HARNESSES[name]), str(corpus), f"-max_total_time={seconds}",
               "-timeout=20", "-rss_limit_mb=3072", f"-max_len={max_len}", "-print_final_stats=1",
               f"-artifact_prefix={artifacts}/{name}-"]
        # The limit past the fuzzing time: start-up (loading a tokenizer) and the final stats.
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, check=False)
    log = r.stdout + r.stderr
    runs = re.search(r"stat::number_of_executed_units: (\d+)", log)
    cov = re.findall(r"cov: (\d+) ft: (\d+)", log)
    summary = (f"{name}: {int(runs.group(1)) if runs else 0:,} executions in {seconds} s from {n_seeds} seeds"
               + (f", coverage {cov[-1][0]} edges / {cov[-1][1]} features" if cov else ""))
    if r.returncode != 0:
        return False, summary + f" -- FAILED (exit {r.returncode})\n" + "\n".join(log.splitlines()[-60:])
    return True, summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("harness", nargs="*", help=f"some of {', '.join(HARNESSES)} (default: all)")
    p.add_argument("--seconds", type=int, default=45, help="fuzzing time per harness (default: %(default)s)")
    p.add_argument("--artifacts", default="fuzz-artifacts", help="where crashing inputs go (default: %(default)s)")
    p.add_argument("--max-len", type=int, default=1 << 17, help="largest input in bytes (default: %(default)s)")
    args = p.parse_args()
    unknown = [h for h in args.harness if h not in HARNESSES]
    if unknown:
        p.error(f"unknown harness {unknown[0]!r}: choose from {', '.join(HARNESSES)}")
    artifacts = Path(args.artifacts).resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    ok = True
    for name in args.harness or list(HARNESSES):
        good, summary = run(name, args.seconds, artifacts, args.max_len)
        print(summary, flush=True)
        ok &= good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
