"""What every study shares: the machine's description, a progress bar, timed decode steps,
the ceiling's measurement, and the files a study writes."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

import pyinfer
from pyinfer.bandwidth import measure_read_bandwidth
from pyinfer.model import Context, Model, default_threads

GB = 1e9


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of the highest cache level the kernel lists for CPU 0 (sysfs; an entry it
    cannot read is passed over), or None where it lists none. A virtual machine reports what
    its host tells it, which may be a whole socket's."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    best: tuple[int, int] | None = None
    for d in root.glob("index*"):
        try:
            level = int((d / "level").read_text())
            size = (d / "size").read_text().strip()
            n = int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)
        except (OSError, ValueError):
            continue
        if best is None or level > best[0]:
            best = (level, n)
    return best[1] if best is not None else None


def cache_note(rows: list[dict[str, Any]], llc_bytes: int | None) -> list[str]:
    """A line under a table whose shares of the memory's ceiling pass 100% (rows whose ceiling
    is arithmetic, ceiling_bound "int8", are not counted): steps that fit in the last-level
    cache found part of their bytes there, so they do not measure decode against the memory;
    for larger ones the read probe gave less than the memory does. A row's step reads its
    weights once (for all of a batch's sequences) and each sequence's KV cache. Empty where no
    share passes 100%."""
    over = [r for r in rows if r.get("pct_of_ceiling", 0) > 100 and r.get("ceiling_bound", "memory") == "memory"]
    if not over:
        return []
    steps = [(r["weight_bytes_per_token"] + r["kv_bytes_per_token"]) * r.get("batch", 1) for r in over]
    fit = [b for b in steps if llc_bytes is None or b <= llc_bytes]
    past = [b for b in steps if llc_bytes is not None and b > llc_bytes]
    out = []
    if fit:
        where = (f"this CPU reports a last-level cache of {llc_bytes / 1e6:.0f} MB" if llc_bytes
                 else "the CPU's caches hold part of them")
        out.append(f"Shares above 100%: those steps (up to {max(fit) / 1e6:.0f} MB read per step) found part of "
                   f"their bytes in a cache, not in memory ({where}); only a model well past the cache measures "
                   "decode against the memory's bandwidth.")
    if past:
        out.append(f"Steps past the last-level cache (from {min(past) / 1e6:.0f} MB) "
                   "above 100%: the read probe measured less than the memory gave them; compare them with care.")
    return [""] + out


def _version(dist: str) -> str | None:
    # From the installed metadata: importing torch just to ask its version costs seconds.
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The checkout's commit (with "-dirty" if it has changes), or None outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=here, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=here, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def environment() -> dict[str, Any]:
    """Machine, CPU features, active ISA path, versions and commit: the context of a result."""
    cpu = pyinfer.cpu_info()
    return {
        "machine": {"platform": platform.platform(), "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(),
                    "usable_cores": default_threads(), "python": platform.python_version(),
                    "last_level_cache_bytes": last_level_cache_bytes()},
        "cpu_features": cpu["features"],
        "isa": cpu["isa"],
        "isa_available": cpu["available"],
        "versions": {"pyinfer": pyinfer.__version__, "numpy": _version("numpy"),
                     "llama_cpp_python": _version("llama_cpp_python"), "transformers": _version("transformers"),
                     "torch": _version("torch"), "matplotlib": _version("matplotlib")},
        "commit": git_commit(),
    }


class Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal, printed every
    tenth of the way otherwise, so logs stay short)."""

    def __init__(self, title: str, total: int, out: IO[str] | None = None, width: int = 28) -> None:
        self.title, self.total, self.done, self.width = title, max(total, 1), 0, width
        self.out = out if out is not None else sys.stderr
        self.tty = self.out.isatty()
        self.started = time.perf_counter()
        self._printed = -1

    def step(self, label: str = "", n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        frac = self.done / self.total
        bar = "#" * int(frac * self.width) + "-" * (self.width - int(frac * self.width))
        line = f"{self.title:<12} [{bar}] {self.done}/{self.total} {time.perf_counter() - self.started:5.1f}s {label}"
        if self.tty:
            self.out.write("\r" + line[:120].ljust(120))
            if self.done == self.total:
                self.out.write("\n")
        elif int(frac * 10) > self._printed or self.done == self.total:
            self._printed = int(frac * 10)
            self.out.write(line + "\n")
        self.out.flush()


@dataclass
class Settings:
    """What `pyinfer bench` was asked for."""

    model: Path
    threads: list[int]
    quick: bool = False
    out: Path = Path("bench-results")
    llama_bench: list[str] | str | None = None  # llama-bench binaries, each PATH or NAME=PATH
    openvino_python: str | None = None  # an interpreter with openvino-genai (the peers study)
    peers: bool = True
    peer_python: str | None = None  # an interpreter with llama-cpp-python[server] (the serve study)
    peer_server: str | None = None  # a llama-server binary (the serve study)
    ray: bool = False  # the serve study: also through Ray Serve, at 1 and at `threads` replicas
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def repeats(self) -> int:
        return 2 if self.quick else 3

    @property
    def llc_bytes(self) -> int | None:
        """The last-level cache as the environment record has it (read from sysfs where a
        Settings was made without one)."""
        machine = self.env.get("machine", {})
        return machine["last_level_cache_bytes"] if "last_level_cache_bytes" in machine else last_level_cache_bytes()

    def bandwidth(self, n_threads: int, repeats: int | None = None) -> dict[str, Any]:
        """One read-bandwidth measurement: 128 MiB (4x a 32 MiB L3) when quick, else 512 MiB."""
        mib = 128 if self.quick else 512
        return measure_read_bandwidth(mib << 20, n_threads=n_threads, repeats=repeats or (3 if self.quick else 5))


def kv_bytes_per_position(model: Model) -> int:
    """Bytes of K and V one cached position holds, over all layers."""
    return model.kv_nbytes(1)


def mean_kv_read(model: Model, start: int, n_steps: int) -> float:
    """Mean KV bytes a decode step reads over steps at positions start..start+n_steps-1
    (the step at position p attends to p + 1 positions)."""
    return kv_bytes_per_position(model) * (start + (n_steps + 1) / 2)


def timed_decode(ctx: Context, first: int, n_steps: int) -> float:
    """Seconds for n_steps single-token evals from the context's position, each feeding the
    previous step's greedy token (as generation does), then the position is restored."""
    start = ctx.n_past
    tok = first
    t = time.perf_counter()
    for _ in range(n_steps):
        tok = int(ctx.eval([tok]).argmax())
    dt = time.perf_counter() - t
    ctx.truncate(start)
    return dt


def decode_row(model: Model, samples: list[float], /, *, start: int, n_steps: int, ceiling_gbps: float,
               **extra: Any) -> dict[str, Any]:
    """A decode measurement with its bytes per token, achieved GB/s and percent of ceiling."""
    tps = median(samples)
    w = model.weight_bytes_per_token
    kv = mean_kv_read(model, start, n_steps)
    achieved = tps * (w + kv) / GB
    return {**extra, "start_position": start, "n_steps": n_steps, "tokens_per_s": tps,
            "tokens_per_s_samples": samples, "weight_bytes_per_token": w, "kv_bytes_per_token": kv,
            "bytes_per_token": w + kv, "achieved_gbps": achieved, "ceiling_gbps": ceiling_gbps,
            "pct_of_ceiling": 100 * achieved / ceiling_gbps}


def prompt_ids(model: Model, n: int, seed: int = 0) -> list[int]:
    """n token ids spread over the vocabulary (what they are does not change the work)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lo = min(100, model.n_vocab // 4)
    return [int(t) for t in rng.integers(lo, model.n_vocab, n)]


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def write_study(settings: Settings, report: dict[str, Any], markdown: list[str],
                plot: Callable[[dict[str, Any], Path], bool] | None) -> list[Path]:
    """Write <study>.json (with the environment), <study>.md and, when matplotlib is
    importable, <study>.png, under settings.out."""
    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    name = report["study"]
    report = {"study": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": settings.quick,
              "model": str(settings.model), "threads": settings.threads, **settings.env, **report}
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(report, indent=1, default=str) + "\n")
    paths[1].write_text("\n".join(markdown) + "\n")
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return paths
        png = out / f"{name}.png"
        if plot(report, png):
            paths.append(png)
    return paths
