"""The bench suite behind `pyinfer bench`: decode measured against the machine's memory
bandwidth, swept over weight format, threads, context, batch and model size, with prefill,
peers and serving; JSON (every raw sample), Markdown and PNG plots per study."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

from pyinfer.bench.common import Settings, environment, write_study
from pyinfer.bench.plots import PLOTS
from pyinfer.bench.studies import STUDIES
from pyinfer.model import default_threads
from pyinfer.registry import ModelArg, resolve_model

# The order studies run in when none is named: the ceiling first, so everything after it
# can be read against it.
DEFAULT_STUDIES = list(STUDIES)
# What the serve study needs beyond the [bench] extra: without it, a run of every study
# leaves serve out (naming it asks for it, and its error says what to install).
SERVER_MODULES = ("fastapi", "uvicorn", "prometheus_client")


def default_studies() -> list[str]:
    if all(importlib.util.find_spec(m) is not None for m in SERVER_MODULES):
        return list(DEFAULT_STUDIES)
    print("serve study left out: it needs the [server] extra (pip install 'pyinfer[server]')", file=sys.stderr)
    return [n for n in DEFAULT_STUDIES if n != "serve"]


def default_thread_counts() -> list[int]:
    """1, 2, 4, ... up to the usable cores, and the core count itself."""
    n = default_threads()
    out, t = [], 1
    while t < n:
        out.append(t)
        t *= 2
    return out + [n]


def run_bench(studies: list[str] | None = None, *, model: ModelArg = None, quick: bool = False,
              out: str | Path = "bench-results", threads: list[int] | None = None,
              llama_bench: list[str] | str | None = None, peers: bool = True, peer_python: str | None = None,
              peer_server: str | None = None, ray: bool = False, openvino_python: str | None = None
              ) -> dict[str, Any]:
    """Run the named studies (all by default) and write their files under `out`, plus
    summary.md gathering every study's Markdown. Returns {study: report}."""
    names = studies or default_studies()
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        raise ValueError(f"unknown study {', '.join(unknown)} (known: {', '.join(STUDIES)})")
    if threads and min(threads) < 1:
        raise ValueError("thread counts must be positive")
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"the output folder {out} is a file: give a folder (it is created if missing)")
    s = Settings(model=resolve_model(model), threads=sorted(set(threads or default_thread_counts())),
                 quick=quick, out=Path(out), llama_bench=llama_bench, openvino_python=openvino_python,
                 peers=peers, peer_python=peer_python,
                 peer_server=peer_server, ray=ray, env=environment())
    started = time.perf_counter()
    reports: dict[str, Any] = {}
    summary = [f"# pyinfer bench: {s.model.name}", "",
               f"{time.strftime('%Y-%m-%d %H:%M')}, {s.env['machine']['cpu_model']}, ISA path {s.env['isa']}, "
               f"commit {s.env['commit']}, threads {s.threads}{', quick' if quick else ''}.", ""]
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}", file=sys.stderr)
        t = time.perf_counter()
        report, md = STUDIES[name](s)
        report["elapsed_s"] = time.perf_counter() - t
        write_study(s, report, md, PLOTS.get(name))
        reports[name] = report
        summary += md + [""]
    summary.append(f"Total {time.perf_counter() - started:.0f} s.")
    s.out.mkdir(parents=True, exist_ok=True)
    (s.out / "summary.md").write_text("\n".join(summary) + "\n")
    print(f"wrote {s.out}/ ({', '.join(names)}: JSON, Markdown, PNG) and summary.md", file=sys.stderr)
    return reports
