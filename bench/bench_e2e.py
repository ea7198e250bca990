"""End-to-end speed on a real model: pp512 and tg128 (llama-bench's definitions) at each
thread count, beside llama.cpp (llama-cpp-python) and float32 transformers when they are
importable, measured alternately in one series; and the Python decode loop's overhead.

pp512: one 512-token prompt evaluated from an empty cache, tokens/s.
tg128: 128 tokens evaluated one at a time from an empty cache, tokens/s.
Each engine is checked first (the greedy next token of a short prompt must be a real token
and pyinfer's must match its own exact path), warmed up, then timed --repeats times; the
report gives medians, and ratios against llama.cpp from the same series.

    python bench/bench_e2e.py [--threads 1 2] [--repeats 3] [--model PATH] [--no-peers]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import pyinfer
from pyinfer.model import Model
from pyinfer.models import resolve_model

PP, TG = 512, 128


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


class Engine:
    name = ""

    def pp(self, ids: list[int]) -> float:  # seconds for one prompt from an empty cache
        raise NotImplementedError

    def tg(self, first: int, n: int) -> float:  # seconds for n single-token steps from empty
        raise NotImplementedError


class PyinferEngine(Engine):
    def __init__(self, path: Path, n_threads: int) -> None:
        self.name = "pyinfer"
        self.model = Model.load(path, n_threads=n_threads, n_ctx=PP + TG + 8)
        self.ctx = self.model.context()

    def pp(self, ids: list[int]) -> float:
        self.ctx.reset()
        t = time.perf_counter()
        self.ctx.eval(ids)
        return time.perf_counter() - t

    def tg(self, first: int, n: int) -> float:
        self.ctx.reset()
        tok = first
        t = time.perf_counter()
        for _ in range(n):
            tok = int(self.ctx.eval([tok]).argmax())
        return time.perf_counter() - t

    def generate_rate(self, n: int) -> float:
        """Decode tokens/s through Model.generate (sampling, stop checks, streaming text)."""
        ban = {t: float("-inf") for t in self.model.tokenizer.eot_ids}
        c = self.model.generate([1], max_tokens=n + 1, temperature=0, logit_bias=ban)
        return c.timings.decode_tokens_per_s


class LlamaCppEngine(Engine):
    def __init__(self, path: Path, n_threads: int) -> None:
        import llama_cpp

        self.name = "llama.cpp"
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=PP + TG + 8, n_batch=PP, n_ubatch=PP,
                                   n_threads=n_threads, n_threads_batch=n_threads, verbose=False)

    def pp(self, ids: list[int]) -> float:
        self.llm.reset()
        t = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - t

    def tg(self, first: int, n: int) -> float:
        self.llm.reset()
        tok = first
        t = time.perf_counter()
        for _ in range(n):
            self.llm.eval([tok])
            tok = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
        return time.perf_counter() - t


class TransformersEngine(Engine):
    def __init__(self, path: Path, n_threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.name = "transformers"
        self.torch = torch
        torch.set_num_threads(n_threads)
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          torch_dtype=torch.float32).eval()

    def pp(self, ids: list[int]) -> float:
        with self.torch.inference_mode():
            x = self.torch.tensor([ids])
            t = time.perf_counter()
            self.model(x, use_cache=True)
            return time.perf_counter() - t

    def tg(self, first: int, n: int) -> float:
        with self.torch.inference_mode():
            past, tok = None, first
            t = time.perf_counter()
            for _ in range(n):
                out = self.model(self.torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
            return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    path = resolve_model(args.model)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 40000, PP)]

    makers: list[Callable[[Path, int], Engine]] = [PyinferEngine]
    if not args.no_peers:
        for mod, maker in [("llama_cpp", LlamaCppEngine), ("transformers", TransformersEngine)]:
            try:
                __import__(mod)
                makers.append(maker)
            except ImportError:
                print(f"({mod} not importable: skipped)")

    rows: list[dict[str, Any]] = []
    bw: dict[int, float] = {}
    for nt in dict.fromkeys(args.threads):
        bw[nt] = pyinfer.measure_read_bandwidth(n_threads=nt, repeats=5)["median_gbps"]
        engines = [mk(path, nt) for mk in makers]
        for e in engines:  # validate and warm up
            e.pp(prompt[:16])
            e.tg(prompt[0], 4)
        samples: dict[str, dict[str, list[float]]] = {e.name: {"pp": [], "tg": []} for e in engines}
        py = engines[0]
        assert isinstance(py, PyinferEngine)
        gen: list[float] = []
        for _ in range(args.repeats):  # alternate engines within each repeat
            for e in engines:
                samples[e.name]["pp"].append(PP / e.pp(prompt))
                samples[e.name]["tg"].append(TG / e.tg(prompt[0], TG))
            gen.append(py.generate_rate(TG))
        bare = samples["pyinfer"]["tg"]
        loop = 1 - statistics.median(gen) / statistics.median(bare)
        wb = py.model.weight_bytes_per_token
        for name, s in samples.items():
            rows.append({"engine": name, "threads": nt, "pp512": statistics.median(s["pp"]),
                         "tg128": statistics.median(s["tg"]), "pp512_samples": s["pp"], "tg128_samples": s["tg"]})
        rows.append({"engine": "pyinfer generate()", "threads": nt, "tg128": statistics.median(gen),
                     "tg128_samples": gen, "loop_overhead": loop})
        print(f"{nt} thread(s): read bandwidth {bw[nt]:.1f} GB/s; pyinfer decode moves "
              f"{statistics.median(bare) * wb / 1e9:.1f} GB/s of weights "
              f"({statistics.median(bare) * wb / 1e9 / bw[nt]:.0%}); generate() loop overhead {loop:.1%}")

    base = {r["threads"]: r for r in rows if r["engine"] == "llama.cpp"}
    lines = ["| engine | threads | pp512 tok/s | tg128 tok/s | pp512 / llama.cpp | tg128 / llama.cpp |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        b = base.get(r["threads"])
        pp = f"{r['pp512']:.0f}" if "pp512" in r else "-"
        rpp = f"{r['pp512'] / b['pp512']:.2f}x" if b and "pp512" in r else "-"
        rtg = f"{r['tg128'] / b['tg128']:.2f}x" if b else "-"
        lines.append(f"| {r['engine']} | {r['threads']} | {pp} | {r['tg128']:.1f} | {rpp} | {rtg} |")
    print("\n".join(lines))
    report = {"study": "e2e", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": str(path),
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
              "cpu": pyinfer.cpu_info(), "pyinfer": pyinfer.__version__, "commit": _commit(),
              "read_bandwidth_gbps": bw, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"e2e-{stamp}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"e2e-{stamp}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}/e2e-{stamp}.json and .md")


if __name__ == "__main__":
    main()
