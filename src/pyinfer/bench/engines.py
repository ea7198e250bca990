"""Engines timed side by side on one model: pyinfer, llama.cpp through llama-cpp-python,
float32 transformers, and any llama-bench binary. pp: one prompt from an empty cache;
tg: single-token steps from an empty cache (llama-bench's definitions), in tokens/s."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pyinfer.model import Model


class Engine:
    name = ""

    def pp(self, ids: list[int]) -> float:
        """Tokens/s evaluating ids from an empty cache."""
        raise NotImplementedError

    def tg(self, first: int, n: int) -> float:
        """Tokens/s of n single-token steps from an empty cache, each on the last's argmax."""
        raise NotImplementedError


class PyinferEngine(Engine):
    def __init__(self, path: Path, n_threads: int, n_ctx: int) -> None:
        self.name = "pyinfer"
        self.model = Model.load(path, n_threads=n_threads, n_ctx=n_ctx)
        self.ctx = self.model.context()

    def pp(self, ids: list[int]) -> float:
        self.ctx.reset()
        t = time.perf_counter()
        self.ctx.eval(ids)
        return len(ids) / (time.perf_counter() - t)

    def tg(self, first: int, n: int) -> float:
        self.ctx.reset()
        tok = first
        t = time.perf_counter()
        for _ in range(n):
            tok = int(self.ctx.eval([tok]).argmax())
        return n / (time.perf_counter() - t)

    def generate_rate(self, n: int) -> float:
        """Decode tokens/s through Model.generate (sampling, stop checks, streaming text)."""
        ban = {t: float("-inf") for t in self.model.tokenizer.eot_ids}
        c = self.model.generate([1], max_tokens=n + 1, temperature=0, logit_bias=ban)
        return c.timings.decode_tokens_per_s


class LlamaCppEngine(Engine):
    def __init__(self, path: Path, n_threads: int, n_ctx: int) -> None:
        import llama_cpp

        self.name = "llama.cpp"
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                                   n_threads=n_threads, n_threads_batch=n_threads, verbose=False)

    def pp(self, ids: list[int]) -> float:
        self.llm.reset()
        t = time.perf_counter()
        self.llm.eval(ids)
        return len(ids) / (time.perf_counter() - t)

    def tg(self, first: int, n: int) -> float:
        self.llm.reset()
        tok = first
        t = time.perf_counter()
        for _ in range(n):
            self.llm.eval([tok])
            tok = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
        return n / (time.perf_counter() - t)


class TransformersEngine(Engine):
    def __init__(self, path: Path, n_threads: int, n_ctx: int) -> None:
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
            return len(ids) / (time.perf_counter() - t)

    def tg(self, first: int, n: int) -> float:
        with self.torch.inference_mode():
            past, tok = None, first
            t = time.perf_counter()
            for _ in range(n):
                out = self.model(self.torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
            return n / (time.perf_counter() - t)


def parse_llama_bench(text: str) -> list[dict[str, Any]]:
    """llama-bench's `-o json` output: one record per test, with n_prompt, n_gen, n_threads,
    avg_ts and samples_ts (tokens/s of each repetition)."""
    records = json.loads(text)
    if not isinstance(records, list):
        raise ValueError("llama-bench JSON output is not a list of tests")
    return [{"n_prompt": int(r.get("n_prompt", 0)), "n_gen": int(r.get("n_gen", 0)),
             "n_threads": int(r.get("n_threads", 0)), "avg_ts": float(r["avg_ts"]),
             "samples_ts": [float(x) for x in r.get("samples_ts", [r["avg_ts"]])],
             "build_commit": r.get("build_commit"), "cpu_info": r.get("cpu_info")} for r in records]


class LlamaBenchEngine(Engine):
    """A llama-bench binary, one repetition per call (its own process: loading is not timed,
    its reported tokens/s is taken as is)."""

    def __init__(self, binary: str, path: Path, n_threads: int) -> None:
        self.name = "llama-bench"
        self.binary, self.path, self.n_threads = binary, path, n_threads
        self.info: dict[str, Any] = {}

    def _run(self, n_prompt: int, n_gen: int) -> float:
        cmd = [self.binary, "-m", str(self.path), "-p", str(n_prompt), "-n", str(n_gen),
               "-t", str(self.n_threads), "-r", "1", "-o", "json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"llama-bench failed ({r.returncode}): {r.stderr.strip()[-500:]}")
        rec = parse_llama_bench(r.stdout)[0]
        self.info = {"build_commit": rec["build_commit"], "cpu_info": rec["cpu_info"]}
        return rec["avg_ts"]

    def pp(self, ids: list[int]) -> float:
        return self._run(len(ids), 0)

    def tg(self, first: int, n: int) -> float:
        return self._run(0, n)


def peer_makers(llama_bench: str | None) -> tuple[list[tuple[str, Callable[..., Engine]]], dict[str, str]]:
    """(name, constructor) of each peer available here, and why the others are skipped."""
    makers: list[tuple[str, Callable[..., Engine]]] = []
    skipped: dict[str, str] = {}
    for mod, name, maker in [("llama_cpp", "llama.cpp", LlamaCppEngine),
                             ("transformers", "transformers", TransformersEngine)]:
        try:
            __import__(mod)
            makers.append((name, maker))
        except ImportError as e:
            skipped[name] = f"not importable: {e}"
    if llama_bench:
        makers.append(("llama-bench", lambda path, nt, n_ctx: LlamaBenchEngine(llama_bench, path, nt)))
    return makers, skipped
