"""The `serve` study: `pyinfer serve` and peer OpenAI-compatible servers (llama-cpp-python's
`llama_cpp.server`, a `llama-server` binary) started as subprocesses on loopback, driven by
streaming chat clients at concurrency 1, 4, 16 and 32 with one fixed prompt set, and reported
in vLLM's benchmark names (request throughput, output tokens/s, TTFT, TPOT, ITL and E2E
latency as mean / median / p99, goodput under an SLO), peers as ratios to pyinfer."""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from pyinfer.bench.common import Progress, Settings, table
from pyinfer.chat import ChatTemplate
from pyinfer.gguf import GGUFReader
from pyinfer.tokenizer import Tokenizer

Report = tuple[dict[str, Any], list[str]]

# -- the prompt set ---------------------------------------------------------------------------
# Three kinds of request, taken in turn: a short chat turn; a long document to summarize (its
# paragraphs rotated per request, so no two documents share a prefix); a short question after
# one long system prompt that every such request repeats word for word.

SHORT_QUESTIONS = [
    "What is the boiling point of water at sea level?",
    "Give me two tips for keeping houseplants alive.",
    "Why is the sky blue? One sentence, please.",
    "Suggest a name for a grey cat.",
    "How many minutes are there in a day?",
    "What does a thermostat do?",
    "Write a haiku about a train station.",
    "What is the difference between weather and climate?",
    "Recommend a simple breakfast that keeps me full.",
    "Explain what a spreadsheet is to a child.",
    "Name a fruit that is high in vitamin C.",
    "How do I convert Celsius to Fahrenheit?",
]

DOCUMENT = [
    "The Harrow Valley water board met on the first Tuesday of the month to review the state of "
    "the reservoir, which had fallen to sixty-two percent of its capacity after a dry spring. The "
    "chief engineer reported that the eastern intake was clear, that the western intake had been "
    "partly blocked by silt, and that a contractor would dredge it before the autumn rains.",
    "Members then discussed the pumping station on Mill Road. Its two older pumps draw more power "
    "than the newer one for the same flow, and the board heard a proposal to replace them over two "
    "years. The treasurer warned that the replacement would use most of the reserve fund and asked "
    "for a second quotation before any decision was taken.",
    "A resident of Lower Harrow spoke about low pressure in the evenings, when gardens are watered "
    "and the demand on the network peaks. The engineer explained that the main serving that part "
    "of the valley is narrower than the others and was laid before the new houses were built; a "
    "study of a parallel main would be ready by the end of the year.",
    "The board reviewed the quality reports from the laboratory. All samples taken in the quarter "
    "met the standards for bacteria, nitrates and hardness. Two samples from the old town showed "
    "traces of lead just under the limit, which the engineer traced to service pipes on private "
    "property; owners will be written to with advice and an offer of testing.",
    "Under other business, the board agreed to open the reservoir path to walkers on weekends from "
    "May to September, to fund a school visit programme about where tap water comes from, and to "
    "publish its meeting notes on the village notice boards as well as online. The next meeting "
    "will be held in the library because the usual hall is being repainted.",
    "Finally, the chair thanked the volunteers who had cleared fallen branches from the spillway "
    "after the storm in March, and reminded members that the annual report must be sent to the "
    "regional authority by the end of June, with the new figures for leakage, which fell by nine "
    "percent after the repairs on the ridge.",
]
DOCUMENT_TASK = "Summarize the meeting notes below in three sentences.\n\n"

SYSTEM_PROMPT = (
    "You are the help desk assistant of Brindle & Sons, a hardware shop with three branches. "
    "Answer customers politely and briefly, in plain language, and never invent prices or stock "
    "levels: when asked about them, say that a colleague will check and reply by email. The shop "
    "opens from eight in the morning to six in the evening on weekdays and from nine to four on "
    "Saturdays; it is closed on Sundays and public holidays. Deliveries within ten miles are free "
    "for orders over fifty pounds, otherwise they cost five pounds, and they arrive within two "
    "working days. Goods can be returned within thirty days with a receipt, unless they were cut "
    "to size, mixed to order (paint) or used. The shop rents out ladders, carpet cleaners, tile "
    "cutters and cement mixers by the day; a deposit is taken and given back when the tool is "
    "returned clean. Key cutting and knife sharpening are done while the customer waits. For "
    "electrical or gas work, always advise the customer to use a registered professional. If a "
    "question is not about the shop, its goods or home repairs, say kindly that you can only help "
    "with those."
)
SYSTEM_QUESTIONS = [
    "Are you open on Sunday?",
    "Can I return a tin of paint you mixed for me?",
    "How much is delivery for a forty pound order?",
    "Do you rent tile cutters?",
    "Can you sharpen my kitchen knives today?",
    "Should I rewire my own kitchen?",
    "How long does delivery take?",
    "What time do you close on Saturday?",
    "Is there a deposit on a cement mixer?",
    "Can you tell me a joke?",
    "Do you cut keys?",
    "Can I return a ladder I bought two weeks ago?",
]

KINDS = ("short_chat", "long_document", "shared_system")


def request_messages(i: int, *, quick: bool = False) -> tuple[str, list[dict[str, str]]]:
    """The i-th request of the prompt set: (kind, chat messages). The kinds come in turn;
    each kind's variants in turn within it. Quick runs use a two-paragraph document (so it
    fits the context of a byte-level test model)."""
    kind = KINDS[i % len(KINDS)]
    j = i // len(KINDS)
    if kind == "short_chat":
        return kind, [{"role": "user", "content": SHORT_QUESTIONS[j % len(SHORT_QUESTIONS)]}]
    if kind == "long_document":
        n = len(DOCUMENT)
        paras = [DOCUMENT[(j + k) % n] for k in range(n)]
        return kind, [{"role": "user", "content": DOCUMENT_TASK + "\n\n".join(paras[:2] if quick else paras)}]
    return kind, [{"role": "system", "content": SYSTEM_PROMPT},
                  {"role": "user", "content": SYSTEM_QUESTIONS[j % len(SYSTEM_QUESTIONS)]}]


# -- the plan of a run ---------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one run of the study sends: concurrency levels, requests per level, tokens per
    reply, the SLO goodput counts against, and bounds on time."""

    levels: tuple[int, ...]
    max_tokens: int
    min_requests: int = 8  # per level: at least this many, else twice the concurrency
    ttft_slo_s: float = 1.0
    tpot_slo_s: float = 0.1
    level_timeout_s: float = 90.0  # no new request starts later than this into a level
    drain_timeout_s: float = 30.0  # then the requests still running are cut off
    request_timeout_s: float = 120.0  # a request's socket: no read waits longer
    n_ctx: int = 2048  # tokens per sequence, every engine
    # Also run `pyinfer serve --no-prefix-cache`: what the prefix cache does to TTFT.
    prefix_cache_baseline: bool = False
    # Rounds of each level, the engines taking turns in each; a row is the round with the
    # median output tokens/s (the machine's other load varies from one minute to the next).
    rounds: int = 1
    # After a level, a server must use under 5% of a core for a second (it may still be
    # computing requests cut off) before the next engine's turn; at most this long.
    idle_timeout_s: float = 300.0

    def n_requests(self, concurrency: int) -> int:
        return max(self.min_requests, 2 * concurrency)


FULL_PLAN = Plan(levels=(1, 4, 16, 32), max_tokens=64, prefix_cache_baseline=True, rounds=3)
QUICK_PLAN = Plan(levels=(1, 4), max_tokens=16, min_requests=4, level_timeout_s=60.0, drain_timeout_s=30.0,
                  request_timeout_s=60.0)


def plan_for(s: Settings) -> Plan:
    return QUICK_PLAN if s.quick else FULL_PLAN


# -- servers -------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback port free now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerSpec:
    """How to start one engine's server: its name, the command (the port is filled in), and
    how many sequences it runs at once."""

    name: str
    argv: list[str]
    slots: int
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 180.0


NO_PREFIX_CACHE = "pyinfer, no prefix cache"


def pyinfer_spec(model: Path, n_threads: int, plan: Plan, *, prefix_cache: bool = True) -> ServerSpec:
    slots = max(plan.levels)
    return ServerSpec("pyinfer" if prefix_cache else NO_PREFIX_CACHE,
                      [sys.executable, "-m", "pyinfer", "serve", "--model", str(model),
                       "--host", "127.0.0.1", "--port", "{port}", "--threads", str(n_threads),
                       "--ctx", str(plan.n_ctx), "--max-batch", str(slots),
                       "--max-queue", str(4 * slots), "--log-level", "warning",
                       *([] if prefix_cache else ["--no-prefix-cache"])], slots)


def ray_spec(model: Path, n_threads: int, replicas: int, plan: Plan) -> ServerSpec:
    """`pyinfer serve --ray` on a cluster of its own (`--ray-address local`): `replicas`
    replicas sharing `n_threads` threads, each with the whole batch."""
    slots = max(plan.levels)
    return ServerSpec(f"pyinfer, Ray Serve, {replicas} x {n_threads // replicas} threads",
                      [sys.executable, "-m", "pyinfer", "serve", "--ray", "--ray-address", "local",
                       "--replicas", str(replicas), "--model", str(model), "--host", "127.0.0.1", "--port", "{port}",
                       "--threads", str(n_threads // replicas), "--ctx", str(plan.n_ctx), "--max-batch", str(slots),
                       "--max-queue", str(4 * slots), "--log-level", "warning"], slots,
                      ready_timeout_s=600.0)


def llama_cpp_python_spec(python: str, model: Path, n_threads: int, plan: Plan) -> ServerSpec:
    # One Llama behind a lock: it serves one request at a time whatever the concurrency.
    # interrupt_requests False: by default a running stream is cut off when the next request
    # arrives, which would end most streams of a concurrent run early.
    return ServerSpec("llama-cpp-python", [python, "-m", "llama_cpp.server", "--model", str(model),
                                           "--host", "127.0.0.1", "--port", "{port}",
                                           "--n_threads", str(n_threads), "--n_threads_batch", str(n_threads),
                                           "--n_ctx", str(plan.n_ctx), "--n_batch", "512",
                                           "--interrupt_requests", "False", "--verbose", "False"], 1)


def llama_server_spec(binary: str, model: Path, n_threads: int, plan: Plan) -> ServerSpec:
    # One slot per client at the top concurrency; -c is the whole KV cache, split among them.
    slots = max(plan.levels)
    return ServerSpec("llama-server", [binary, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}",
                                       "-t", str(n_threads), "-tb", str(n_threads), "-np", str(slots),
                                       "-c", str(plan.n_ctx * slots), "-cb"], slots)


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class Server:
    """A server subprocess on a free loopback port, its output in a log file; ready once
    GET /v1/models answers 200. Stopped by its process id (SIGTERM, then SIGKILL)."""

    def __init__(self, spec: ServerSpec, log_dir: Path, ready_timeout_s: float = 180.0) -> None:
        self.spec, self.name = spec, spec.name
        self.port = free_port()
        self.log_path = log_dir / f"{spec.name}.log"
        argv = [a.replace("{port}", str(self.port)) for a in spec.argv]
        self.argv = argv
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        t = time.perf_counter()
        try:
            self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **spec.env})
        except OSError as e:
            self._log.close()
            raise RuntimeError(f"{spec.name}: cannot start {argv[0]}: {e}") from None
        try:
            self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - t

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before it was ready: "
                                   f"{_tail(self.log_path)}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/v1/models")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready on port {self.port} after {timeout_s:.0f} s: "
                           f"{_tail(self.log_path)}")

    def cpu_seconds(self) -> float | None:
        """CPU time the server process (all its threads) has used, from /proc; None elsewhere."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def wait_idle(self, timeout_s: float, window_s: float = 1.0, busy_cores: float = 0.05) -> float | None:
        """Seconds until the server used under busy_cores of a core over window_s (a server
        that does not cancel requests its clients gave up on keeps computing them); None if its
        CPU time cannot be read, timeout_s if it never settled."""
        t0 = time.perf_counter()
        last = self.cpu_seconds()
        if last is None:
            return None
        while time.perf_counter() - t0 < timeout_s and self.proc.poll() is None:
            time.sleep(window_s)
            now = self.cpu_seconds()
            if now is None or now - last < busy_cores * window_s:
                break
            last = now
        return time.perf_counter() - t0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


# -- one streamed request ------------------------------------------------------------------


@dataclass
class Result:
    """What a client saw of one streamed request: times in seconds from the level's start."""

    index: int
    kind: str
    sent: float
    first: float | None = None  # the first chunk with text
    end: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # each chunk with text
    output_tokens: int = 0
    tokens_from: str = "chunks"  # "usage" when the server reported completion_tokens
    prompt_tokens: int | None = None
    prompt_tokens_from: str = "usage"  # "template": counted here, the server gave no usage
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.first is not None and self.end is not None

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.sent

    @property
    def e2e(self) -> float:
        assert self.end is not None
        return self.end - self.sent

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1): vLLM's time per output token after the first."""
        if self.output_tokens < 2 or self.first is None or self.end is None:
            return None
        return (self.end - self.first) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


def sse_events(lines: Iterator[bytes]) -> Iterator[Any]:
    """The JSON payloads of a server-sent-event stream (`data: {...}` lines) up to
    `data: [DONE]`; comments, blank lines and other fields are skipped."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


class Cutoff:
    """The open connections of a level, shut down together when its time is up (the readers
    then see their streams end and report them as cut off)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # The sockets themselves: http.client hands a response that ends with the connection
        # its socket and drops its own reference.
        self.socks: set[socket.socket] = set()
        self.cut = False

    def add(self, sock: socket.socket) -> bool:
        with self.lock:
            if not self.cut:
                self.socks.add(sock)
            return not self.cut

    def discard(self, sock: socket.socket | None) -> None:
        with self.lock:
            self.socks.discard(sock)

    def cut_all(self) -> None:
        with self.lock:
            self.cut = True
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


CUT_OFF = "cut off at the level's time limit"


def stream_chat(port: int, body: dict[str, Any], res: Result, t0: float, timeout_s: float,
                cutoff: Cutoff | None = None) -> None:
    """POST a streamed chat request and fill `res` as its chunks arrive; a stream that ends
    before `data: [DONE]` is an error."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    sock: socket.socket | None = None
    try:
        res.sent = time.perf_counter() - t0
        conn.connect()
        sock = conn.sock
        if cutoff is not None and not cutoff.add(sock):
            res.error = CUT_OFF
            return
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            return
        n_chunks, done = 0, [False]

        def lines() -> Iterator[bytes]:
            for line in iter(resp.readline, b""):
                if line.strip() == b"data: [DONE]" or line.strip() == b"data:[DONE]":
                    done[0] = True
                yield line

        for ev in sse_events(lines()):
            if "error" in ev:
                res.error = f"stream error: {json.dumps(ev['error'])[:300]}"
                return
            for ch in ev.get("choices") or []:
                if (ch.get("delta") or {}).get("content"):
                    now = time.perf_counter() - t0
                    if res.first is None:
                        res.first = now
                    res.chunk_times.append(now)
                    n_chunks += 1
            usage = ev.get("usage")
            if usage:
                res.output_tokens, res.tokens_from = int(usage["completion_tokens"]), "usage"
                res.prompt_tokens = int(usage["prompt_tokens"])
        res.end = time.perf_counter() - t0
        if res.tokens_from != "usage":
            res.output_tokens = n_chunks
        if not done[0]:
            res.error = CUT_OFF if cutoff is not None and cutoff.cut else "the stream ended before data: [DONE]"
        elif res.first is None:
            res.error = "the stream ended without text"
    except (OSError, http.client.HTTPException, ValueError) as e:
        if cutoff is not None and cutoff.cut:
            res.end, res.error = time.perf_counter() - t0, CUT_OFF
        else:
            res.error = f"{type(e).__name__}: {e}"[:300]
    finally:
        if cutoff is not None:
            cutoff.discard(sock)
        conn.close()


def request_body(i: int, plan: Plan, banned: Sequence[int], *, quick: bool) -> tuple[str, dict[str, Any]]:
    kind, messages = request_messages(i, quick=quick)
    # Greedy, with every end-of-turn token banned: each reply runs to max_tokens on every
    # engine (vLLM's ignore_eos), so all do the same work per request.
    return kind, {"model": "bench", "messages": messages, "max_tokens": plan.max_tokens, "temperature": 0,
                  "stream": True, "stream_options": {"include_usage": True},
                  "logit_bias": {str(t): -100 for t in sorted(banned)}}


def run_level(port: int, concurrency: int, n_requests: int, plan: Plan, banned: Sequence[int], *,
              quick: bool, first_index: int = 0) -> tuple[list[Result], float, int]:
    """n_requests streamed chat requests from `concurrency` client threads, each sending its
    next request as soon as its last one ends; none starts after plan.level_timeout_s, and
    those still running plan.drain_timeout_s later are cut off (failed). Returns (results,
    wall seconds from the first send to the last end or cut-off, requests not sent)."""
    lock = threading.Lock()
    todo = list(range(first_index, first_index + n_requests))
    results: list[Result] = []
    cutoff = Cutoff()
    t0 = time.perf_counter()

    def client() -> None:
        while True:
            with lock:
                if not todo or time.perf_counter() - t0 > plan.level_timeout_s:
                    return
                i = todo.pop(0)
            kind, body = request_body(i, plan, banned, quick=quick)
            res = Result(index=i, kind=kind, sent=0.0)
            stream_chat(port, body, res, t0, plan.request_timeout_s, cutoff)
            with lock:
                results.append(res)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for th in threads:
        th.start()
    hard = t0 + plan.level_timeout_s + plan.drain_timeout_s
    for th in threads:
        th.join(max(0.0, hard - time.perf_counter()))
    if any(th.is_alive() for th in threads):
        cutoff.cut_all()
        for th in threads:
            th.join()
    results.sort(key=lambda r: r.index)
    ends = [r.end for r in results if r.end is not None]
    wall = (max(ends) - min(r.sent for r in results)) if ends else 0.0
    return results, wall, len(todo)


# -- summaries -----------------------------------------------------------------------------


def _dist(xs: list[float], name: str) -> dict[str, float | None]:
    """vLLM's mean_ / median_ / p99_ <name>_ms of samples in seconds (None when empty)."""
    if not xs:
        return {f"mean_{name}_ms": None, f"median_{name}_ms": None, f"p99_{name}_ms": None}
    a = np.asarray(xs, dtype=np.float64) * 1e3
    return {f"mean_{name}_ms": float(a.mean()), f"median_{name}_ms": float(np.percentile(a, 50)),
            f"p99_{name}_ms": float(np.percentile(a, 99))}


def summarize(results: list[Result], wall_s: float, plan: Plan) -> dict[str, Any]:
    """One level's figures, in vLLM's benchmark_serving names."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    tpots = [t for r in ok if (t := r.tpot) is not None]
    good = [r for r in ok if r.ttft < plan.ttft_slo_s and (r.tpot is None or r.tpot < plan.tpot_slo_s)]
    per = wall_s if wall_s > 0 else float("nan")
    out: dict[str, Any] = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": wall_s,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / per, "output_throughput": out_tokens / per,
        "total_token_throughput": (in_tokens + out_tokens) / per,
        "request_goodput": len(good) / per, "good_requests": len(good),
        **_dist([r.ttft for r in ok], "ttft"), **_dist(tpots, "tpot"),
        **_dist([x for r in ok for x in r.itls], "itl"), **_dist([r.e2e for r in ok], "e2el"),
        "median_ttft_ms_by_kind": {k: float(np.percentile([r.ttft * 1e3 for r in ok if r.kind == k], 50))
                                   for k in KINDS if any(r.kind == k for r in ok)},
        "tokens_from": sorted({r.tokens_from for r in ok}),
    }
    return out


def _record(r: Result) -> dict[str, Any]:
    return {"index": r.index, "kind": r.kind, "sent_s": r.sent, "ttft_s": r.ttft if r.ok else None,
            "e2e_s": r.e2e if r.ok else None, "tpot_s": r.tpot, "output_tokens": r.output_tokens,
            "prompt_tokens": r.prompt_tokens, "prompt_tokens_from": r.prompt_tokens_from,
            "tokens_from": r.tokens_from, "chunk_times_s": r.chunk_times,
            "error": r.error}


# -- the study -----------------------------------------------------------------------------


def peer_specs(s: Settings, nt: int, plan: Plan) -> tuple[list[ServerSpec], dict[str, str]]:
    """The peers' servers available here, and why the others are skipped."""
    specs: list[ServerSpec] = []
    skipped: dict[str, str] = {}
    if not s.peers:
        return specs, {"all": "disabled"}
    python = s.peer_python
    if python is None and importlib.util.find_spec("llama_cpp") is not None:
        python = sys.executable
    if python is None:
        skipped["llama-cpp-python"] = "llama_cpp is not importable here and no --peer-python was given"
    else:
        try:
            r = subprocess.run([python, "-c", "import llama_cpp.server.app"], capture_output=True, text=True,
                               timeout=120, check=False)
            if r.returncode == 0:
                specs.append(llama_cpp_python_spec(python, s.model, nt, plan))
            else:
                skipped["llama-cpp-python"] = (f"{python} cannot import llama_cpp.server (pip install "
                                               f"'llama-cpp-python[server]'): {r.stderr.strip()[-300:]}")
        except (OSError, subprocess.SubprocessError) as e:
            skipped["llama-cpp-python"] = f"{python}: {e}"[:300]
    if s.peer_server:
        specs.append(llama_server_spec(s.peer_server, s.model, nt, plan))
    return specs, skipped


class PromptTokens:
    """The model's end-of-turn ids (what a reply would stop at) and the prompt length of each
    request through its own chat template: the count for a server that reports no usage in
    its stream (the peers load the same file and template)."""

    def __init__(self, model: Path, quick: bool) -> None:
        with GGUFReader(model) as reader:
            self.tokenizer = Tokenizer(reader.metadata)
            self.template = ChatTemplate.from_metadata(reader.metadata)
        self.banned = sorted(self.tokenizer.eot_ids)
        self.quick = quick
        self._n: dict[int, int] = {}

    def __call__(self, i: int) -> int:
        if i not in self._n:
            _, messages = request_messages(i, quick=self.quick)
            self._n[i] = len(self.template.encode(self.tokenizer, messages, add_generation_prompt=True))
        return self._n[i]


def _drain(srv: Server, plan: Plan, banned: Sequence[int], quick: bool, index: int) -> float:
    """Seconds until a one-token request goes through after a level: a server that queues
    requests (or still finishes ones cut off) is idle again before the next engine's turn."""
    body = {**request_body(0, plan, banned, quick=quick)[1], "max_tokens": 1}
    res = Result(index=index, kind=KINDS[0], sent=0.0)
    t = time.perf_counter()
    stream_chat(srv.port, body, res, t, max(plan.request_timeout_s, 300.0))
    return time.perf_counter() - t


def _median_round(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median output tokens/s (the lower middle one of an even count),
    with every round's figure beside it."""
    ranked = sorted(runs, key=lambda r: r["output_throughput"])
    row = dict(ranked[(len(ranked) - 1) // 2])
    row["rounds"] = len(runs)
    row["output_throughput_rounds"] = [r["output_throughput"] for r in runs]
    row["median_ttft_ms_rounds"] = [r["median_ttft_ms"] for r in runs]
    return row


def _load_average() -> float | None:
    """The 1-minute load average: on a shared machine, how busy the cores were around a level."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or a != a or b != b:
        return None
    return a / b


RATIO_KEYS = ("output_throughput", "request_throughput", "request_goodput", "median_ttft_ms", "p99_ttft_ms",
              "median_tpot_ms", "median_itl_ms", "median_e2el_ms")


def study_serve(s: Settings) -> Report:
    """Streaming clients at each concurrency level against `pyinfer serve` and each peer's
    server, started side by side and idle but for the one being measured; the engines take
    turns at each level, so drift reaches all alike."""
    for mod in ("fastapi", "uvicorn", "prometheus_client"):
        if importlib.util.find_spec(mod) is None:
            raise RuntimeError(f"the serve study needs {mod}: pip install 'pyinfer[server]'")
    plan = plan_for(s)
    nt = max(s.threads)
    counts = PromptTokens(s.model, s.quick)
    banned = counts.banned
    peers, skipped = peer_specs(s, nt, plan)
    specs = [pyinfer_spec(s.model, nt, plan), *peers]
    if plan.prefix_cache_baseline:
        specs.append(pyinfer_spec(s.model, nt, plan, prefix_cache=False))
    if s.ray:
        if importlib.util.find_spec("ray") is None:
            raise RuntimeError("the serve study's --ray needs ray[serve]: pip install 'pyinfer[ray]'")
        specs += [ray_spec(s.model, nt, r, plan) for r in sorted({1, nt})]
    n_total = sum(plan.n_requests(c) for c in plan.levels)
    prog = Progress("serve", len(specs) * (1 + plan.rounds * len(plan.levels)))
    rows: list[dict[str, Any]] = []
    servers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pyinfer-serve-") as tmp, contextlib.ExitStack() as stack:
        live: list[Server] = []
        for spec in specs:
            try:
                srv = Server(spec, Path(tmp), spec.ready_timeout_s)
            except RuntimeError as e:
                if spec.name == "pyinfer":
                    raise
                skipped[spec.name] = str(e)[:600]
                prog.step(f"{spec.name} failed")
                continue
            stack.callback(srv.stop)
            # Warm up: one request of each kind, untimed; a peer that cannot serve the prompt
            # set is reported and left out.
            res, _, _ = run_level(srv.port, 1, len(KINDS), plan, banned, quick=s.quick, first_index=n_total)
            bad = [r.error for r in res if not r.ok]
            if bad:
                if spec.name == "pyinfer":
                    raise RuntimeError(f"pyinfer serve failed the warm-up requests: {bad[0]}")
                skipped[spec.name] = f"warm-up failed: {bad[0]}"
                srv.stop()
            else:
                live.append(srv)
                servers.append({"engine": spec.name, "argv": srv.argv, "slots": spec.slots, "start_s": srv.start_s})
            prog.step(f"start {spec.name}")
        for c in plan.levels:
            n = plan.n_requests(c)
            done: dict[str, list[dict[str, Any]]] = {srv.name: [] for srv in live}
            for rnd in range(plan.rounds):
                for srv in live:
                    load = _load_average()
                    res, wall, not_sent = run_level(srv.port, c, n, plan, banned, quick=s.quick)
                    drain_s = _drain(srv, plan, banned, s.quick, n_total)
                    idle_s = srv.wait_idle(plan.idle_timeout_s)
                    for one_res in res:
                        if one_res.prompt_tokens is None:
                            one_res.prompt_tokens, one_res.prompt_tokens_from = counts(one_res.index), "template"
                    done[srv.name].append(
                        {"engine": srv.name, "concurrency": c, "requests": n, "round": rnd, "not_sent": not_sent,
                         "load_average_before": load, "load_average_after": _load_average(), "drain_s": drain_s,
                         "idle_wait_s": idle_s, **summarize(res, wall, plan),
                         "errors": sorted({r.error for r in res if r.error})[:5],
                         "samples": [_record(r) for r in res]})
                    prog.step(f"{srv.name} at {c}" + (f", round {rnd + 1}" if plan.rounds > 1 else ""))
                    if srv.proc.poll() is not None:
                        raise RuntimeError(f"{srv.name} exited ({srv.proc.returncode}) at concurrency {c}: "
                                           f"{_tail(srv.log_path)}")
            rows += [_median_round(runs) for runs in done.values()]
    # Scaling: each engine's output tokens/s over its own at concurrency 1.
    for r in rows:
        one = next((x for x in rows if x["engine"] == r["engine"] and x["concurrency"] == min(plan.levels)), None)
        r["output_throughput_vs_lowest"] = _ratio(r["output_throughput"], one["output_throughput"] if one else None)
    ratios = []
    for r in rows:
        if r["engine"] == "pyinfer":
            continue
        base = next(x for x in rows if x["engine"] == "pyinfer" and x["concurrency"] == r["concurrency"])
        ratios.append({"peer": r["engine"], "concurrency": r["concurrency"], "peer_completed": r["completed"],
                       "peer_requests": r["requests"], "pyinfer_completed": base["completed"],
                       **{k: _ratio(base[k], r[k]) for k in RATIO_KEYS}})
    # The prefix cache: the shared-system-prompt requests' median TTFT without it over with it.
    prefix = []
    for c in plan.levels:
        with_, without = (next((x["median_ttft_ms_by_kind"].get("shared_system") for x in rows
                                if x["engine"] == e and x["concurrency"] == c), None)
                          for e in ("pyinfer", NO_PREFIX_CACHE))
        if without is not None:
            prefix.append({"concurrency": c, "shared_system_median_ttft_ms": with_,
                           "no_prefix_cache_ms": without, "speedup": _ratio(without, with_)})
    md = _markdown(s, plan, nt, rows, ratios, skipped, prefix)
    return {"study": "serve", "plan": {**plan.__dict__, "levels": list(plan.levels),
                                       "requests": {c: plan.n_requests(c) for c in plan.levels}},
            "slo": {"ttft_ms": plan.ttft_slo_s * 1e3, "tpot_ms": plan.tpot_slo_s * 1e3},
            "server_threads": nt, "banned_tokens": banned, "servers": servers, "rows": rows, "ratios": ratios,
            "prefix_cache": prefix, "skipped": skipped,
            "prompt_set": {"kinds": list(KINDS), "example": [request_messages(i, quick=s.quick) for i in range(3)]},
            }, md


def _markdown(s: Settings, plan: Plan, nt: int, rows: list[dict[str, Any]], ratios: list[dict[str, Any]],
              skipped: dict[str, str], prefix: list[dict[str, Any]]) -> list[str]:
    md = ["## Serving", "",
          f"Streaming chat clients on loopback, each sending its next request when its last ends, at "
          f"concurrency {', '.join(map(str, plan.levels))} (max(2 x concurrency, {plan.min_requests}) requests "
          f"per level): short chat turns, a long document to summarize and a question after a shared system "
          f"prompt, in turn; {plan.max_tokens} tokens per reply (greedy, end-of-turn tokens banned, so every "
          f"engine generates them all); servers at {nt} thread(s), engines taking turns at each level"
          + (f" in each of {plan.rounds} rounds (each row: the round with the median output tokens/s)"
             if plan.rounds > 1 else "")
          + f"; after its turn a server is left to go idle (under 5% of a core for a second, at most "
          f"{plan.idle_timeout_s:.0f} s) before the next; no request "
          f"starts after {plan.level_timeout_s:.0f} s of a level, and those still running "
          f"{plan.drain_timeout_s:.0f} s later are cut off (failed). "
          f"TTFT: send to first text; TPOT: (E2E - TTFT) / (tokens - 1); ITL: between text chunks; goodput: "
          f"requests/s with TTFT < {plan.ttft_slo_s * 1e3:.0f} ms and TPOT < {plan.tpot_slo_s * 1e3:.0f} ms. "
          "Latencies in ms, mean / p50 / p99.", ""]

    def mpp(r: dict[str, Any], name: str) -> str:
        return " / ".join(_ms(r[f"{k}_{name}_ms"]) for k in ("mean", "median", "p99"))

    md += table(["engine", "conc.", "done", "req/s", "out tok/s", "x conc. 1", "goodput req/s", "TTFT", "TPOT",
                 "ITL", "E2E"],
                [[r["engine"], r["concurrency"], f"{r['completed']}/{r['requests']}",
                  f"{r['request_throughput']:.2f}", f"{r['output_throughput']:.1f}",
                  "-" if r["output_throughput_vs_lowest"] is None else f"{r['output_throughput_vs_lowest']:.2f}x",
                  f"{r['request_goodput']:.2f}", mpp(r, "ttft"), mpp(r, "tpot"), mpp(r, "itl"), mpp(r, "e2el")]
                 for r in sorted(rows, key=lambda r: (r["concurrency"], r["engine"] != "pyinfer"))])
    if plan.rounds > 1:
        md += ["", "Output tokens/s in each round (the row above is the median one):", ""]
        md += table(["engine", "conc.", "rounds"],
                    [[r["engine"], r["concurrency"], " / ".join(f"{v:.1f}" for v in r["output_throughput_rounds"])]
                     for r in sorted(rows, key=lambda r: (r["concurrency"], r["engine"] != "pyinfer"))])
    md += ["", "Median TTFT (ms) by kind of request:", ""]
    md += table(["engine", "conc."] + list(KINDS),
                [[r["engine"], r["concurrency"]] + [_ms(r["median_ttft_ms_by_kind"].get(k)) for k in KINDS]
                 for r in sorted(rows, key=lambda r: (r["concurrency"], r["engine"] != "pyinfer"))])
    if ratios:
        def cell(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}x"

        md += ["", "pyinfer's figure over the peer's at the same concurrency, measured in the same run (tokens/s "
               "and goodput: above 1, pyinfer is ahead; latencies: below 1, pyinfer is ahead). Latencies count "
               "completed requests only, as vLLM's do: where a peer completed few of its requests, its latencies "
               "are those of the few that finished, and its throughput is what it delivered in the time allowed.",
               ""]
        md += table(["peer", "conc.", "peer done", "out tok/s", "req/s", "goodput", "p50 TTFT", "p99 TTFT",
                     "p50 TPOT", "p50 ITL", "p50 E2E"],
                    [[x["peer"], x["concurrency"], f"{x['peer_completed']}/{x['peer_requests']}"]
                     + [cell(x[k]) for k in RATIO_KEYS] for x in ratios])
    if prefix:
        md += ["", "The prefix cache: median TTFT (ms) of the requests after the shared system prompt, with it and "
               "without it (`pyinfer serve --no-prefix-cache`), and the speed-up:", ""]
        md += table(["conc.", "with", "without", "speed-up"],
                    [[x["concurrency"], _ms(x["shared_system_median_ttft_ms"]), _ms(x["no_prefix_cache_ms"]),
                      "-" if x["speedup"] is None else f"{x['speedup']:.2f}x"] for x in prefix])
    errs = [f"- {r['engine']} at {r['concurrency']}: {r['failed']} failed ({'; '.join(r['errors'])[:300]})"
            for r in rows if r["failed"]]
    errs += [f"- {r['engine']} at {r['concurrency']}: {r['not_sent']} not sent (level time limit)"
             for r in rows if r["not_sent"]]
    if errs:
        md += [""] + errs
    if skipped:
        md += [""] + [f"- {k} skipped: {v}" for k, v in skipped.items()]
    return md
