"""The `contention` study: decode when the cores are shared. A Python service shares its
cores with the HTTP server, tokenization and whatever else runs there; a pool whose threads
wait on each other at every kernel call loses most of its speed as soon as one of them is
descheduled. Here one CPU-bound process, pinned to one of the cores pyinfer may use, competes
with decode at one thread and at the default thread count, alternated with runs on an idle
machine. The target: on the busy machine the default threads are never slower than one."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from pyinfer.bench.common import Progress, Settings, median, prompt_ids, table, timed_decode
from pyinfer.model import Model

Report = tuple[dict[str, Any], list[str]]

# A busy loop that never sleeps, pinned to one core: the competing process.
_SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


class Competitor:
    """A CPU-bound child process pinned to `cpu` while the block runs."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Competitor:
        self.proc = subprocess.Popen([sys.executable, "-c", _SPIN, str(self.cpu)])
        time.sleep(0.3)  # started and spinning before anything is timed
        if self.proc.poll() is not None:
            raise RuntimeError(f"contention: the competing process on CPU {self.cpu} exited "
                               f"with status {self.proc.returncode}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


def study_contention(s: Settings) -> Report:
    """Decode tokens/s at one thread and at the default threads, idle and with one core busy."""
    cpus = sorted(os.sched_getaffinity(0))
    nt = max(s.threads)
    if len(cpus) < 2 or nt < 2:
        why = f"needs 2 or more cores and threads (has {len(cpus)} cores, threads {s.threads})"
        return {"study": "contention", "skipped": why}, ["## Shared cores", "", f"Skipped: {why}.", ""]
    start, n_steps = (16, 16) if s.quick else (32, 48)
    m = Model.load(s.model, n_threads=nt)
    ctx = m.context(n_ctx=start + n_steps + 1, n_batch=start)
    ids = prompt_ids(m, start)
    if not np.isfinite(ctx.eval(ids)).all():
        raise RuntimeError("contention: the model gives non-finite logits")
    timed_decode(ctx, ids[0], 4)
    conditions = ("idle", "one core busy")
    thread_counts = (1, nt)
    repeats = s.repeats if s.quick else 5  # a noisy measurement by nature: more repeats
    prog = Progress("contention", repeats * len(conditions) * len(thread_counts))
    samples: dict[tuple[str, int], list[float]] = {(c, t): [] for c in conditions for t in thread_counts}
    for _ in range(repeats):
        for cond in conditions:
            with Competitor(cpus[-1]) if cond != "idle" else contextlib.nullcontext():
                for t in thread_counts:
                    m.n_threads = t
                    samples[(cond, t)].append(n_steps / timed_decode(ctx, ids[0], n_steps))
                    prog.step(f"{cond} {t}t")
    m.n_threads = nt
    by = {key: median(v) for key, v in samples.items()}
    rows = [{"condition": c, "threads": t, "tokens_per_s": by[(c, t)], "tokens_per_s_samples": samples[(c, t)]}
            for c in conditions for t in thread_counts]
    ratios = {c: by[(c, nt)] / by[(c, 1)] for c in conditions}
    md = ["## Shared cores", "",
          f"Decode from position {start}, {n_steps} steps, median of {repeats}, on an idle machine and with "
          f"one CPU-bound process pinned to CPU {cpus[-1]} (of {len(cpus)} available); the two conditions "
          "alternate within each repeat. Target: with a core busy, the default threads are never slower "
          "than one.", ""]
    md += table(["condition", "1 thread tok/s", f"{nt} threads tok/s", f"{nt} threads / 1 thread"],
                [[c, f"{by[(c, 1)]:.1f}", f"{by[(c, nt)]:.1f}", f"{ratios[c]:.2f}x"] for c in conditions])
    met = ratios["one core busy"] >= 1.0
    md += ["", f"Target ({nt} threads not slower than 1 with a core busy): {'met' if met else 'not met'}.", ""]
    return {"study": "contention", "competitor_cpu": cpus[-1], "rows": rows, "ratios": ratios,
            "target_met": met}, md
