"""Engines timed side by side on one model: pyinfer, llama.cpp through llama-cpp-python,
float32 transformers, any llama-bench binary, and OpenVINO GenAI through another interpreter.
pp: one prompt from an empty cache; tg: single-token steps from an empty cache (llama-bench's
definitions), in tokens/s. Start-up (pyinfer and llama-cpp-python): load time, resident
memory of a fresh process, and time to the first token of a streamed chat request."""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator, Sequence
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

    def ttft(self, messages: Sequence[dict[str, str]], max_tokens: int) -> float:
        """Seconds from a streamed greedy chat request (rendered with the engine's own chat
        template, from an empty cache) to its first chunk with text."""
        raise NotImplementedError


class PyinferEngine(Engine):
    def __init__(self, path: Path, n_threads: int, n_ctx: int, precision: str = "fast") -> None:
        self.name = "pyinfer" if precision == "fast" else f"pyinfer {precision}"
        self.model = Model.load(path, n_threads=n_threads, n_ctx=n_ctx, precision=precision)
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

    def ttft(self, messages: Sequence[dict[str, str]], max_tokens: int) -> float:
        # Model.chat starts every request on a reset context: no prefix is reused.
        t = time.perf_counter()
        chunks = self.model.chat(messages, stream=True, max_tokens=max_tokens, temperature=0)
        assert isinstance(chunks, Generator)  # stream=True; closing it ends the generation
        try:
            for c in chunks:
                if c.text:
                    return time.perf_counter() - t
        finally:
            chunks.close()
        raise RuntimeError(f"no text in the first {max_tokens} tokens of the reply")

    def generate_rate(self, n: int) -> tuple[float, int]:
        """Decode tokens/s through Model.generate (sampling, stop checks, streaming text), one
        token per pass as tg's steps (no prompt-lookup drafts: the speculative study times
        those), and the draft tokens it tried (0)."""
        ban = {t: float("-inf") for t in self.model.tokenizer.eot_ids}
        c = self.model.generate([1], max_tokens=n + 1, temperature=0, logit_bias=ban, draft=0)
        return c.timings.decode_tokens_per_s, c.timings.draft_tokens


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

    def ttft(self, messages: Sequence[dict[str, str]], max_tokens: int) -> float:
        # Llama.generate keeps the longest prefix the new prompt shares with the cached
        # tokens (every chat request repeats the system turn); reset() empties that record,
        # and no prompt cache (Llama.set_cache) is set, so each request evaluates it all.
        self.llm.reset()
        t = time.perf_counter()
        chunks = self.llm.create_chat_completion(list(messages), stream=True, max_tokens=max_tokens,
                                                 temperature=0)
        try:
            # The first chunk carries only the role, the content follows in later ones.
            for c in chunks:
                if c["choices"][0]["delta"].get("content"):
                    return time.perf_counter() - t
        finally:
            chunks.close()
        raise RuntimeError(f"no text in the first {max_tokens} tokens of the reply")


class TransformersEngine(Engine):
    def __init__(self, path: Path, n_threads: int, n_ctx: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.name = "transformers"
        self.torch = torch
        torch.set_num_threads(n_threads)
        t = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          torch_dtype=torch.float32).eval()
        # Loading dequantizes the file to float32: timed once here, as the one cheap measure
        # of its start-up (its chat and memory are not like for like with the GGUF engines).
        self.load_s = time.perf_counter() - t

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

    def __init__(self, binary: str, path: Path, n_threads: int, name: str = "llama-bench") -> None:
        self.name = name
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


class OpenVINOEngine(Engine):
    """OpenVINO GenAI's LLMPipeline on the same GGUF file, in a worker process of another
    interpreter (`python`, one with openvino-genai; see openvino_worker.py). Its pipeline caches
    a prompt's prefix between calls, so each pp call turns the prompt by one more token: every
    call sees a new prefix of the same tokens."""

    def __init__(self, python: str, path: Path, n_threads: int) -> None:
        self.name = "openvino"
        worker = Path(__file__).with_name("openvino_worker.py")
        cmd = [python, str(worker), str(path), str(n_threads)]
        # Its log goes to a file, not a pipe, so that it never blocks the worker.
        self.err = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by close())
        self.proc: subprocess.Popen[str] | None = None
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                         text=True)
            first = self._read()
            if "ready" not in first:
                raise RuntimeError(f"OpenVINO worker did not start: {first}")
        except BaseException:
            self.close()
            raise
        self.load_s = float(first["ready"])
        self.info = {"version": first.get("version"), "precision": first.get("precision")}
        self.calls = 0

    def _read(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=60)
            self.err.seek(0)
            err = self.err.read()
            raise RuntimeError(f"OpenVINO worker exited ({self.proc.returncode}): {err.strip()[-500:]}")
        return json.loads(line)

    def _ask(self, req: dict[str, Any]) -> float:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        got = self._read()
        if "error" in got:
            raise RuntimeError(f"OpenVINO worker: {got['error']}")
        return float(got["tok_s"])

    def pp(self, ids: list[int]) -> float:
        self.calls += 1
        k = self.calls % len(ids)
        return self._ask({"op": "pp", "ids": ids[k:] + ids[:k]})

    def tg(self, first: int, n: int) -> float:
        return self._ask({"op": "tg", "first": first, "n": n})

    def close(self) -> None:
        """Ends the worker and closes its pipes."""
        proc = getattr(self, "proc", None)
        if hasattr(self, "err"):
            self.err.close()
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()
        self.proc = None

    def __del__(self) -> None:
        self.close()


# -- start-up ------------------------------------------------------------------------------

# The engines whose start-up is measured, by the module each needs.
STARTUP_MODULES = {"pyinfer": "pyinfer", "llama.cpp": "llama_cpp"}


def load_seconds(engine: str, path: Path, n_threads: int, n_ctx: int) -> float:
    """Seconds to construct the engine's model from `path` (released again before returning):
    Model.load for pyinfer, Llama() for llama-cpp-python, each with its usual arguments."""
    if engine == "pyinfer":
        t = time.perf_counter()
        m = Model.load(path, n_threads=n_threads, n_ctx=n_ctx)
        dt = time.perf_counter() - t
        del m
    elif engine == "llama.cpp":
        import llama_cpp

        t = time.perf_counter()
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                              verbose=False)
        dt = time.perf_counter() - t
        llm.close()
    else:
        raise ValueError(f"no start-up measurement for {engine!r}")
    gc.collect()
    return dt


# Run by a fresh interpreter for resident_memory(). It imports nothing but the engine it
# measures (pyinfer stays out of a peer's process), reading its memory at each stage: Linux's
# VmRSS (with its anonymous and file-backed parts) and VmHWM, or elsewhere the peak RSS
# getrusage reports (bytes on macOS, KiB on the rest).
_RSS_PROBE = r"""
import json, sys

def rss():
    try:
        with open("/proc/self/status") as f:
            return {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(":") for line in f)
                    if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}
    except OSError:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return {"VmRSS": peak, "VmHWM": peak}

engine, path, n_threads, n_ctx, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
marks, out = {"start": rss()}, {}
if engine == "pyinfer":
    from pyinfer.model import Model
    marks["import"] = rss()
    m = Model.load(path, n_threads=n_threads, n_ctx=n_ctx)
    marks["load"] = rss()
    ids = m.tokenize(prompt)
    m.context().eval(ids)
    out["repacked_bytes"] = m.repacked_bytes
else:
    import llama_cpp
    marks["import"] = rss()
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                          verbose=False)
    marks["load"] = rss()
    ids = llm.tokenize(prompt.encode())
    llm.eval(ids)
marks["eval"] = rss()
print(json.dumps({"marks": marks, "prompt_tokens": len(ids), **out}))
"""


def resident_memory(engine: str, path: Path, n_threads: int, n_ctx: int, prompt: str) -> dict[str, Any]:
    """The RSS a fresh process gains importing the engine, loading the model and evaluating
    `prompt`, in MB (1e6 bytes): rss_mb in all, import_mb, load_mb and eval_mb by stage,
    anon_mb and file_mb (Linux: weights mapped from the file and touched count as file),
    peak_mb over the start, and repacked_mb for pyinfer."""
    if engine not in STARTUP_MODULES:
        raise ValueError(f"no start-up measurement for {engine!r}")
    r = subprocess.run([sys.executable, "-c", _RSS_PROBE, STARTUP_MODULES[engine], str(path), str(n_threads),
                        str(n_ctx), prompt], capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"memory probe failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    mk = got["marks"]

    def mb(a: str, b: str, key: str = "VmRSS") -> float:
        return (mk[b][key] - mk[a][key]) / 1e6

    out: dict[str, Any] = {"rss_mb": mb("start", "eval"), "import_mb": mb("start", "import"),
                           "load_mb": mb("import", "load"), "eval_mb": mb("load", "eval"),
                           "peak_mb": (mk["eval"]["VmHWM"] - mk["start"]["VmRSS"]) / 1e6,
                           "prompt_tokens": got["prompt_tokens"], "rss_marks": mk}
    if "RssAnon" in mk["start"]:
        out["anon_mb"], out["file_mb"] = mb("start", "eval", "RssAnon"), mb("start", "eval", "RssFile")
    if "repacked_bytes" in got:
        out["repacked_mb"] = got["repacked_bytes"] / 1e6
    return out


def llama_bench_peers(specs: list[str] | str | None) -> list[tuple[str, str]]:
    """(name, binary) of each llama-bench given as PATH or NAME=PATH: "llama-bench NAME" in the
    report (telling builds of llama.cpp and its forks apart), or "llama-bench" unnamed."""
    if not specs:
        return []
    out: list[tuple[str, str]] = []
    for spec in [specs] if isinstance(specs, str) else specs:
        label, sep, binary = spec.partition("=")
        if sep and label.strip() and not Path(spec).exists():
            name = f"llama-bench {label.strip()}"
        else:
            name, binary = "llama-bench", spec
        if any(name == n for n, _ in out):
            raise ValueError(f"two llama-bench peers would be named {name!r}: give each NAME=PATH")
        out.append((name, binary))
    return out


# What a peer run in this process must survive, tried first in a child: llama-cpp-python's
# native library (built on the user's machine, for its CPU) loading the model and evaluating a
# short prompt and then a token, as LlamaCppEngine sets it up. Some builds fault on some CPUs
# (0.3.36 with GGML_NATIVE=ON on an Intel Xeon with AMX: a general protection fault at
# ldtilecfg), and a fault in the bench's own process would end every study after it.
_LLAMA_CPP_TRIAL = r"""
import sys
from llama_cpp import Llama
nt = int(sys.argv[2])
m = Llama(model_path=sys.argv[1], n_ctx=128, n_batch=512, n_ubatch=512, n_threads=nt, n_threads_batch=nt,
          verbose=False)
ids = m.tokenize(b"The quick brown fox jumps over the lazy dog. " * 16)[:64]
m.eval(ids)  # a prompt, as pp512 and the chat's prefill take it
m.eval(ids[:1])  # then one token, as tg128 and the streamed reply
"""


def trial_in_child(code: str, args: Sequence[str], timeout: float = 300.0) -> str | None:
    """Runs `code` in a child Python with `args`: None if it exits with status 0, else why not
    (the signal that ended it, its status and the tail of its stderr, or the timeout)."""
    try:
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, errors="replace",
                           timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"a trial load and evaluation in a child process did not finish in {timeout:.0f} s"
    if r.returncode == 0:
        return None
    if r.returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-r.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-r.returncode}"
    else:
        how = f"exited with status {r.returncode}"
    tail = r.stderr.strip().splitlines()[-1:]
    return f"a trial load and evaluation in a child process {how}" + (f": {tail[0][:200]}" if tail else "")


def peer_makers(llama_bench: list[str] | str | None, openvino_python: str | None = None,
                model: Path | None = None, n_threads: int = 1
                ) -> tuple[list[tuple[str, Callable[..., Engine]]], dict[str, str]]:
    """(name, constructor) of each peer available here, and why the others are skipped. With
    the model given, llama-cpp-python is first tried on it in a child process on n_threads
    (_LLAMA_CPP_TRIAL) and skipped, with the reason, if that fails."""
    makers: list[tuple[str, Callable[..., Engine]]] = []
    skipped: dict[str, str] = {}
    # Each in-process peer: its module, its name, its engine and the trial it must pass first.
    for mod, name, maker, trial in [("llama_cpp", "llama.cpp", LlamaCppEngine, _LLAMA_CPP_TRIAL),
                                    ("transformers", "transformers", TransformersEngine, None)]:
        try:
            __import__(mod)
        except ImportError as e:
            skipped[name] = f"not importable: {e}"
            continue
        why = trial_in_child(trial, [str(model), str(n_threads)]) if trial is not None and model is not None else None
        if why is not None:
            skipped[name] = why
            continue
        makers.append((name, maker))
    for name, binary in llama_bench_peers(llama_bench):
        makers.append((name, lambda path, nt, n_ctx, b=binary, n=name: LlamaBenchEngine(b, path, nt, n)))
    if openvino_python:
        makers.append(("openvino", lambda path, nt, n_ctx: OpenVINOEngine(openvino_python, path, nt)))
    return makers, skipped
