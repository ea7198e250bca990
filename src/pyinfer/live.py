"""The server's web page and its live feed: `/` and `/web/<file>` serve the static page in
pyinfer/web/ (chat and live view), `/live.json` a snapshot of the engine for the live view:
its gauges sampled over the last minutes and, for each recent request, where its time went.

A request's row is its timeline cut at the moments the engine records (RequestHandle's
started, admitted, prefilled; the Request's first token and end), so its segments always add
up to its end-to-end time (Timings.total_s, what /metrics' e2e histogram observes):

    tokenize      arrival .. the request is made (the body read, the chat template applied)
    queue         .. its context is reserved (Timings.queue_s: waiting for room or a slot)
    prefill       .. the forward pass holding the prompt's last token ends (the passes over
                  its chunks, and the steps it waited between them: Timings.prefill_s is
                  the passes alone)
    first_sample  .. the first token is sampled (the other rows of that pass sampled first,
                  then its own sampler: Timings.first_sample_s)
    decode        .. the last token (or now, while it runs)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import FileResponse, JSONResponse, Response

if TYPE_CHECKING:
    from pyinfer.engine import Engine, RequestHandle

WEB_DIR = Path(__file__).resolve().with_name("web")
# The page's files and their types: nothing else is served from WEB_DIR.
WEB_FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
             "app.css": "text/css; charset=utf-8", "icon.svg": "image/svg+xml"}
# Everything the page loads comes from this server: no CDN, nothing fetched from elsewhere.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SEGMENTS = ("tokenize", "queue", "prefill", "first_sample", "decode")


def is_public(path: str) -> bool:
    """The page's own files hold no data and are served without an API key (its calls to the
    API send the key the user types in)."""
    return path == "/" or path.startswith("/web/")


class History:
    """The engine's gauges sampled every `interval` seconds (by a daemon thread, until the
    engine closes), the last `keep` samples kept. Running and waiting are the most at once in
    the interval, as the engine counts them (Engine.peaks: raised when a request queues or is
    admitted), so a queue shorter than the interval still shows however late a sample comes.
    Aggregate tokens/s is the rate of the decode rows (pyinfer:decode_rows_total: one token
    each) between two samples."""

    def __init__(self, engine: Engine, interval: float = 0.5, keep: int = 600) -> None:
        self.engine = engine
        self.interval = interval
        self.samples: deque[dict[str, Any]] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._n = 0
        self._prev: tuple[float, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pyinfer-live", daemon=True)
        self._thread.start()

    def sample(self) -> None:
        st = self.engine.stats()
        running, waiting = self.engine.peaks()
        t = time.perf_counter()
        rate = 0.0
        if self._prev is not None and t > self._prev[0]:
            rate = (st.decode_rows - self._prev[1]) / (t - self._prev[0])
        self._prev = (t, st.decode_rows)
        with self._lock:
            self._n += 1
            self.samples.append({"n": self._n, "t": t, "running": running,
                                 "waiting": waiting, "batch_size": st.batch_size,
                                 "kv_in_use": st.context_bytes_in_use, "kv_idle": st.context_bytes_idle,
                                 "tokens_per_s": rate})

    def since(self, n: int, now: float) -> list[dict[str, Any]]:
        """Samples after the n-th, their time as seconds before now."""
        with self._lock:
            return [{**s, "t": round(s["t"] - now, 3)} for s in self.samples if s["n"] > n]

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self.engine.closed and not self._stop.wait(self.interval):
            self.sample()


def request_row(h: RequestHandle, now: float) -> dict[str, Any]:
    """One request's timeline as the live view draws it (durations in ms; start_ms: its
    arrival, before now)."""
    req = h.request
    tm = req.timings
    done = req.finish_reason is not None
    end = h.started + tm.total_s if done else now
    first = h.started + tm.ttft_s if tm.ttft_s is not None else None
    # Each phase ends where the next begins; one not reached yet ends at `end`.
    marks = [h.started, min(h.started + tm.tokenize_s, end), h.admitted, h.prefilled, first]
    segments: dict[str, float] = {}
    for i, name in enumerate(SEGMENTS):
        a = marks[i]
        if a is None:
            break
        b = next((m for m in marks[i + 1:] if m is not None), end)
        segments[name] = round(max(0.0, min(b, end) - a) * 1e3, 3)
    if done:
        state = "done"
    elif h.admitted is None:
        state = "queued"
    elif first is None:
        state = "prefill"
    else:
        state = "decode"
    return {
        "id": h.label or f"req-{id(h):x}",
        "state": state,
        "finish_reason": req.finish_reason,
        "start_ms": round((h.started - now) * 1e3, 3),
        "e2e_ms": round((end - h.started) * 1e3, 3),
        "segments": segments,
        "prompt_tokens": len(req.prompt_ids),
        "cached_tokens": tm.cached_tokens,
        "predicted_n": len(tm.token_intervals_s),
        "max_tokens": req.max_tokens,
        "prefill_compute_ms": round(tm.prefill_s * 1e3, 3),
        "ttft_ms": None if tm.ttft_s is None else round(tm.ttft_s * 1e3, 3),
    }


def snapshot(engine: Engine, history: History, model_name: str, since: int = 0, limit: int = 32) -> dict[str, Any]:
    now = time.perf_counter()
    st = engine.stats()
    rows = [request_row(h, now) for h in engine.recent()[-limit:]]
    return {
        "model": model_name,
        "n_ctx": engine.n_ctx,
        "max_batch": engine.max_batch,
        "interval_s": history.interval,
        "now": {"running": st.running, "waiting": st.waiting, "batch_size": st.batch_size,
                "kv_in_use": st.context_bytes_in_use, "kv_idle": st.context_bytes_idle,
                "kv_budget": st.context_budget_bytes, "decode_rows_total": st.decode_rows,
                "requests_finished": st.requests_finished, "prefix_hit_tokens_total": st.cached_tokens_total},
        "history": history.since(since, now),
        "requests": rows[::-1],  # the latest first
    }


def install(app: FastAPI, engine: Engine, model_name: str) -> History:
    """Add the page's routes to `app` and start sampling the engine's gauges."""
    from pyinfer.server import APIError  # the server's error shape (it imports this module first)

    history = History(engine)

    def page_file(name: str) -> Response:
        kind = WEB_FILES.get(name)
        if kind is None:
            return APIError(404, f"no page file {name!r}", type="not_found_error").response()
        return FileResponse(WEB_DIR / name, media_type=kind,
                            headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache",
                                     "X-Content-Type-Options": "nosniff"})

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return page_file("index.html")

    @app.get("/web/{name}", include_in_schema=False)
    async def web_file(name: str) -> Response:
        return page_file(name)

    @app.get("/live.json")
    async def live(request: HTTPRequest) -> JSONResponse:
        raw = request.query_params.get("since", "0")
        # ASCII digits, fewer than int() refuses: isdigit() takes "²" and other digits int() does not
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
            return APIError(400, f"since must be a sample number (>= 0), got {raw!r}", param="since").response()
        return JSONResponse(snapshot(engine, history, model_name, int(raw)), headers={"Cache-Control": "no-store"})

    return history

