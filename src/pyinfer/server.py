"""`pyinfer serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn, the `[server]` extra)
over one Engine: /v1/completions and /v1/chat/completions (whole, or streamed as server-sent
events; structured output and tool calls), /v1/embeddings, /v1/models, /health, /metrics
(Prometheus), /tokenize and /detokenize; a web page at / (chat, and a live view of the
engine fed by /live.json: pyinfer.live).

Every completion carries `timings` (llama.cpp's field names plus queue, tokenize and TTFT
times). Errors have the OpenAI shape {"error": {"message", "type", "param", "code"}}: 400
for a bad parameter (param names it) or a prompt longer than the context (the message gives
both counts), 401 for a missing or wrong API key, 413 for a body over the size limit, 503
with Retry-After when the engine's queue is full. A client that disconnects from a stream
cancels its sequence, which frees its context memory within one scheduler step.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from fastapi import Depends, FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from pyinfer import live, openai_types
from pyinfer.constraint import ConstraintError
from pyinfer.engine import TOKEN_BUDGET, Engine, RequestHandle
from pyinfer.errors import ChatTemplateError, ContextOverflowError, OverloadedError
from pyinfer.request import BannedError, Completion, CompletionChunk, Request, stop_strings
from pyinfer.sampling import SamplingParams
from pyinfer.tools import ToolError, parse_tool_call, parse_tools, tool_call_schema, tools_message

DEFAULT_MAX_BODY_BYTES = 4 << 20
MAX_LOGPROBS = 20  # alternatives per token a request may ask for
MAX_EMBED_INPUTS = 256  # texts per embeddings request
# The sampling fields a request may set, all checked by SamplingParams.
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                   "frequency_penalty", "repeat_last_n", "seed")


class APIError(Exception):
    """An error answered in the OpenAI shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def event(self) -> str:
        """The error as a stream's last server-sent event (once the status has gone out)."""
        return _sse(self.body())


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


# ---- reading a request body


async def read_body(request: HTTPRequest, limit: int) -> bytes:
    """The request's body, refused (413) past `limit` bytes without reading further."""
    too_big = APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise too_big
    return bytes(body)


async def _json_body(request: HTTPRequest, limit: int) -> dict[str, Any]:
    body = await read_body(request, limit)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise APIError(400, "the request body is not valid JSON: it is nested too deeply") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(data).__name__}")
    return data


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_bool(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(name, f"{name} must be a boolean, not {type(v).__name__}")
    return v


def _opt_int(body: Mapping[str, Any], name: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v):
        raise _bad(name, f"{name} must be an integer, not {type(v).__name__}")
    if v < lo or (hi is not None and v > hi):
        bounds = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise _bad(name, f"{name} must be {bounds}, got {v}")
    return int(v)


_TOKEN_KEY = re.compile(r"-?[0-9]{1,20}", re.ASCII)


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling keywords of a request, each checked alone so that an error names it."""
    out: dict[str, Any] = {}
    for name in SAMPLING_FIELDS:
        v = body.get(name)
        if v is None:
            continue
        try:
            SamplingParams(**{name: v})
        except (TypeError, ValueError) as e:
            raise _bad(name, str(e)) from None
        out[name] = v
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise _bad("logit_bias", f"logit_bias must be an object of token id -> bias, not {type(bias).__name__}")
        # A key is a token id in ASCII digits, as JSON writes an int: int() alone would also
        # take " 5 ", "1_0" and other scripts' digits.
        bad = next((k for k in bias if not _TOKEN_KEY.fullmatch(k)), None)
        if bad is not None:
            raise _bad("logit_bias", f"logit_bias keys must be token ids (integers), not {bad[:40]!r}")
        parsed = {int(k): v for k, v in bias.items()}
        try:
            SamplingParams(logit_bias=parsed)
        except (TypeError, ValueError) as e:
            raise _bad("logit_bias", str(e)) from None
        out["logit_bias"] = parsed
    return out


# Request fields that constrain the output -> Engine.submit's keyword: OpenAI's
# response_format, llama.cpp server's grammar / json_schema, vLLM's guided_* fields.
CONSTRAINT_FIELDS = {
    "response_format": "response_format", "grammar": "grammar", "json_schema": "json_schema",
    "guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
}


def _constraint(body: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The constraint keyword of a request and the field it came from (at most one)."""
    given = [f for f in CONSTRAINT_FIELDS if body.get(f) is not None]
    if body.get("response_format") == {"type": "text"}:
        given.remove("response_format")
    if len(given) > 1:
        raise _bad(given[1], f"give one of {', '.join(given)}, not several")
    if not given:
        return {}, None
    f = given[0]
    v = body[f]
    kinds: dict[str, tuple[type, ...]] = {"response_format": (dict,), "guided_choice": (list,),
                                          "json_schema": (dict, str), "guided_json": (dict, str)}
    ok = kinds.get(f, (str,))
    if not isinstance(v, ok):
        names: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}
        want = " or ".join(names[t] for t in ok)
        raise _bad(f, f"{f} must be {want}, not {type(v).__name__}")
    return {CONSTRAINT_FIELDS[f]: v}, f


def _stop(body: Mapping[str, Any]) -> list[str]:
    v = body.get("stop")
    if v is not None and not isinstance(v, (str, list)):
        raise _bad("stop", "stop must be a string or a list of strings")
    try:
        return stop_strings(v)
    except ValueError as e:  # ParameterTypeError included
        raise _bad("stop", str(e)) from None


def _refuse(body: Mapping[str, Any], name: str, ok: Callable[[Any], bool], what: str) -> None:
    if name in body and body[name] is not None and not ok(body[name]):
        raise _bad(name, f"{name}={body[name]!r} is not supported: {what}")


def _common(body: Mapping[str, Any]) -> None:
    _refuse(body, "n", lambda v: v == 1, "one choice per request")
    _refuse(body, "best_of", lambda v: v == 1, "one choice per request")
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise _bad("model", f"model must be a string, not {type(m).__name__}")


def _include_usage(body: Mapping[str, Any]) -> bool:
    so = body.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict):
        raise _bad("stream_options", "stream_options must be an object")
    v = so.get("include_usage")
    if v is not None and not isinstance(v, bool):
        raise _bad("stream_options", f"stream_options.include_usage must be a boolean, not {type(v).__name__}")
    return bool(v)


def _prompt(body: Mapping[str, Any]) -> str | list[int]:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        if not p:
            raise _bad("prompt", "prompt is empty: at least one token is needed to predict the next")
        return p
    if isinstance(p, list) and p and all(_is_int(i) for i in p):
        return [int(i) for i in p]
    if p is None:
        raise _bad("prompt", "prompt is required")
    raise _bad("prompt", "prompt must be a string or a list of token ids (batches of prompts are not supported)")


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad("messages", f"messages[{i}] must be an object with a string role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise _bad("messages", f"messages[{i}].content: only text parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is not None and not isinstance(content, str):
            raise _bad("messages", f"messages[{i}].content must be a string or a list of text parts")
        out.append({**m, "content": content if content is not None else ""})
    return out


# ---- metrics


class _EngineCounters(Collector):
    """The engine's own counters, read at each scrape."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterable[Metric]:
        st = self.engine.stats()
        yield CounterMetricFamily("pyinfer:scheduler_steps", "Scheduler steps run", value=st.steps)
        yield CounterMetricFamily("pyinfer:decode_rows", "Sequence rows evaluated by decode steps",
                                  value=st.decode_rows)
        yield CounterMetricFamily("pyinfer:prefix_cache_hit_tokens", "Prompt tokens taken from the prefix cache",
                                  value=st.cached_tokens_total)
        yield CounterMetricFamily("pyinfer:prefix_cache_hits", "Requests admitted with a cached prefix",
                                  value=st.prefix_hits)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own. llama.cpp's names where it
    has one (the colon is legal in Prometheus names), `pyinfer:` for the rest."""

    def __init__(self, engine: Engine) -> None:
        self.registry = r = CollectorRegistry()
        self.prompt_tokens = Counter("llamacpp:prompt_tokens", "Prompt tokens evaluated", registry=r)
        self.predicted = Counter("llamacpp:tokens_predicted", "Tokens sampled", registry=r)
        self.requests = Counter("pyinfer:requests", "Requests finished", ["finish_reason"], registry=r)
        Gauge("llamacpp:requests_processing", "Sequences running (prefill or decode)",
              registry=r).set_function(lambda: engine.stats().running)
        Gauge("llamacpp:requests_deferred", "Requests waiting for admission",
              registry=r).set_function(lambda: engine.stats().waiting)
        # A context is counted whole: its KV cache and its forward-pass scratch, the memory
        # the engine's budget bounds (the llama.cpp name is kept for the ratio).
        Gauge("llamacpp:kv_cache_usage_ratio",
              "Context bytes (KV cache + scratch) reserved by running sequences / budget",
              registry=r).set_function(lambda: engine.stats().context_bytes_in_use / engine.kv_budget_bytes)
        Gauge("pyinfer:context_bytes_in_use", "Context bytes (KV cache + scratch) reserved by running sequences",
              registry=r).set_function(lambda: engine.stats().context_bytes_in_use)
        Gauge("pyinfer:context_bytes_idle", "Context bytes (KV cache + scratch) kept idle for reuse",
              registry=r).set_function(lambda: engine.stats().context_bytes_idle)
        Gauge("pyinfer:context_budget_bytes", "Budget for running and idle contexts (KV cache + scratch)",
              registry=r).set(engine.kv_budget_bytes)
        Gauge("pyinfer:batch_occupancy", "Sequences running / max_batch",
              registry=r).set_function(lambda: engine.stats().running / engine.max_batch)
        Gauge("pyinfer:batch_size", "Sequences in the last decode step",
              registry=r).set_function(lambda: engine.stats().batch_size)
        r.register(_EngineCounters(engine))
        latency = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
        self.queue = Histogram("pyinfer:request_queue_time_seconds", "Waiting before prefill",
                               buckets=latency, registry=r)
        self.ttft = Histogram("pyinfer:time_to_first_token_seconds", "Arrival to first token",
                              buckets=latency, registry=r)
        self.itl = Histogram("pyinfer:inter_token_latency_seconds", "Between consecutive tokens",
                             buckets=(0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5), registry=r)
        self.e2e = Histogram("pyinfer:e2e_request_latency_seconds", "Arrival to last token",
                             buckets=latency, registry=r)

    def observe(self, req: Request) -> None:
        """Called by the engine's thread as each request finishes."""
        t = req.timings
        self.prompt_tokens.inc(t.prompt_tokens if t.prefill_s > 0 else 0)
        self.predicted.inc(t.sampled_tokens)
        self.requests.labels(req.finish_reason or "none").inc()
        self.queue.observe(t.queue_s)
        if t.ttft_s is not None:
            self.ttft.observe(t.ttft_s)
        for dt in t.token_intervals_s[1:]:
            self.itl.observe(dt)
        self.e2e.observe(t.total_s)


# ---- the app


def _finish(reason: str | None) -> str:
    return "stop" if reason == "stop" else "length"


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


def _usage_chunk(cid: str, obj: str, created: int, model: str, req: Request, n_out: int) -> dict[str, Any]:
    """The stream's last chunk when stream_options.include_usage: no choices, the token counts."""
    return {"id": cid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": openai_types.usage(len(req.prompt_ids), n_out, req.timings.cached_tokens)}


def check_api_key(expected: bytes | None, request: HTTPRequest) -> None:
    """Raise a 401 unless the request carries `Authorization: Bearer <expected>` (or no key is
    set, or the route is public: /health and the web page's files)."""
    if expected is None or request.url.path == "/health" or live.is_public(request.url.path):
        return
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise APIError(401, "invalid or missing API key (send Authorization: Bearer <key>)",
                       type="authentication_error", code="invalid_api_key")


def install_error_handlers(app: FastAPI) -> None:
    """Every error `app` answers in the OpenAI shape: APIError, 404s, validation, the rest."""

    @app.exception_handler(APIError)
    async def _api_error(request: HTTPRequest, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: HTTPRequest, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), type=kind).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        return APIError(400, str(exc)).response()

    @app.exception_handler(Exception)
    async def _server_error(request: HTTPRequest, exc: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {exc!r}", type="server_error").response()


def create_app(engine: Engine, *, model_name: str, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The HTTP app over `engine` (which it closes on shutdown). api_key: when given, every
    route but /health needs `Authorization: Bearer <api_key>`, and the API's docs (/docs,
    /redoc, /openapi.json) are not served."""
    model = engine.model
    tokenizer = model.tokenizer
    metrics = Metrics(engine)
    engine.on_finish = metrics.observe
    expected = api_key.encode() if api_key else None

    async def check_key(request: HTTPRequest) -> None:
        check_api_key(expected, request)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(engine.close, 30)

    # FastAPI serves /docs, /redoc and /openapi.json outside the routes' dependencies, so the
    # key would not guard them: with a key they are off.
    docs: dict[str, Any] = {} if expected is None else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="pyinfer", dependencies=[Depends(check_key)], lifespan=lifespan, **docs)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.live_history = live.install(app, engine, model_name)

    install_error_handlers(app)

    async def submit(prompt: str | list[int], kwargs: dict[str, Any], started: float,
                     prompt_param: str, body: Mapping[str, Any],
                     constraint_param: str | None = None) -> tuple[RequestHandle, str | None]:
        """The request's handle, and the field its constraint came from (None: no constraint;
        constraint_param: the field to name instead, for a constraint the server made of it)."""
        constraint, constraint_field = _constraint(body)
        if constraint_field is not None and constraint_param is not None:
            constraint_field = constraint_param
        kwargs = {**kwargs, **constraint}
        try:
            handle = await run_in_threadpool(lambda: engine.submit(prompt, started=started, **kwargs))
            return handle, constraint_field
        except ConstraintError as e:
            raise APIError(400, str(e), param=constraint_field) from None
        except ContextOverflowError as e:
            # The engine's advice names Python arguments; a client has the prompt to change.
            raise APIError(400, f"the prompt has {e.n_tokens} tokens, more than the context holds (n_ctx = "
                           f"{e.n_ctx}): shorten it, or serve with a larger context (pyinfer serve --ctx)",
                           param=prompt_param, code="context_length_exceeded") from None
        except OverloadedError as e:
            raise APIError(503, str(e), type="server_error", code="overloaded",
                           headers={"Retry-After": str(max(1, round(e.retry_after)))}) from None
        except (TypeError, ValueError) as e:
            field = next((f for f in kwargs if str(e).startswith(f)), None)
            if field is None and ("prompt" in str(e) or isinstance(e, UnicodeEncodeError)):
                field = prompt_param  # the prompt's own checks (empty, ids out of range, a lone surrogate)
            raise APIError(400, str(e), param=field) from None
        except RuntimeError as e:  # closed
            raise APIError(503, str(e), type="server_error") from None

    async def result(handle: RequestHandle, request: HTTPRequest, constraint_field: str | None) -> Completion:
        """The whole completion; a client that disconnects before it is done cancels it. A
        constraint that fails on the way (a regex the matcher cannot grow its automaton for)
        is the request's fault: 400, naming the field it came from; so is a logit_bias that
        bans every token the constraint allows."""
        task = asyncio.ensure_future(handle.aresult())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    try:
                        return task.result()
                    except ConstraintError as e:
                        raise APIError(400, str(e), param=constraint_field) from None
                    except BannedError as e:
                        raise APIError(400, str(e), param="logit_bias") from None
                if await request.is_disconnected():
                    handle.cancel()
        finally:
            if not task.done():  # the handler itself was cancelled
                handle.cancel()
                task.cancel()

    async def embedded(ids: list[list[int]], request: HTTPRequest) -> list[Any] | None:
        """The embeddings of ids, in engine jobs of about one forward pass each (n_batch
        tokens, or one longer text), so that the running sequences' steps go on between them;
        a client that disconnects cancels the jobs not yet run (None)."""
        for i, t in enumerate(ids):  # checked here: each job numbers its own texts from 0
            if not t:
                raise ValueError(f"input[{i}] has no tokens")
            if len(t) > model.n_ctx:
                raise ContextOverflowError(f"input[{i}] has {len(t)} tokens, more than n_ctx = {model.n_ctx}", len(t),
                                           model.n_ctx)
        groups: list[list[list[int]]] = []
        n = 0
        for t in ids:
            if not groups or n + len(t) > model.n_batch:
                groups.append([])
                n = 0
            groups[-1].append(t)
            n += len(t)
        futs = [engine.embed(g) for g in groups]
        every = asyncio.gather(*map(asyncio.wrap_future, futs))
        every.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen, whatever the outcome
        try:
            while True:
                done, _ = await asyncio.wait({every}, timeout=0.25)
                if done:
                    return [v for vecs in every.result() for v in vecs]
                if await request.is_disconnected():
                    return None
        finally:
            every.cancel()  # done: nothing; else the client has gone, and the jobs not run are dropped
            for f in futs:
                f.cancel()

    def logprobs_of(ids: Sequence[int], lps: Any, offset: int, prefix: bytes = b"") -> openai_types.CompletionLogprobs:
        return openai_types.completion_logprobs(tokenizer, ids, list(lps or []), offset, prefix)

    def chat_logprobs_of(ids: Sequence[int], lps: Any) -> openai_types.ChatLogprobs:
        return openai_types.chat_token_logprobs(tokenizer, ids, list(lps or []))

    async def stream(handle: RequestHandle, events: Callable[[CompletionChunk], list[Any]],
                     final: Callable[[], list[Any]], constraint_field: str | None) -> AsyncIterator[str]:
        try:
            async for chunk in handle:
                for ev in events(chunk):
                    yield _sse(ev)
            for ev in final():
                yield _sse(ev)
            yield "data: [DONE]\n\n"
        except ConstraintError as e:  # as in result(), after the status went out: the last event
            yield APIError(400, str(e), param=constraint_field).event()
        except BannedError as e:
            yield APIError(400, str(e), param="logit_bias").event()
        except Exception as e:  # the status has gone out: the error becomes the last event
            yield APIError(500, f"internal error: {e!r}", type="server_error").event()
        finally:
            if not handle.finished:  # the client went away (or the stream failed): stop its sequence
                handle.cancel()

    def sse_response(body: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # -- routes

    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.closed:
            return JSONResponse({"status": "error", "message": "the engine is closed"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def get_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "pyinfer",
                "meta": {"n_ctx": engine.n_ctx, "n_vocab": model.n_vocab}}

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def model_info(model_id: str) -> JSONResponse:
        if model_id != model_name:
            raise APIError(404, f"the model {model_id!r} does not exist: this server serves {model_name!r}",
                           type="invalid_request_error", param="model", code="model_not_found")
        return JSONResponse(model_card())

    @app.post("/tokenize")
    async def tokenize(request: HTTPRequest) -> JSONResponse:
        body = await _json_body(request, max_body_bytes)
        content = body.get("content")
        if not isinstance(content, str):
            raise _bad("content", "content must be a string")
        add_bos = _opt_bool(body, "add_special")
        with_pieces = _opt_bool(body, "with_pieces")

        def run() -> JSONResponse:
            ids: list[Any] = tokenizer.tokenize(content, add_bos=add_bos, special=True)
            if with_pieces:
                ids = [{"id": i, "piece": tokenizer.detokenize([i]).decode("utf-8", errors="replace")} for i in ids]
            return JSONResponse({"tokens": ids})

        try:
            # Off the event loop (the reply's JSON too), as the other routes tokenize: a long
            # text takes seconds, which every other request (streams, /health) would wait for.
            return await run_in_threadpool(run)
        except ValueError as e:  # a lone surrogate
            raise _bad("content", str(e)) from None

    @app.post("/v1/embeddings")
    async def embeddings(request: HTTPRequest) -> Response:
        body = await _json_body(request, max_body_bytes)
        _common(body)
        inp = body.get("input")
        items = [inp] if isinstance(inp, str) or (isinstance(inp, list) and inp and _is_int(inp[0])) else inp
        if not isinstance(items, list) or not items or len(items) > MAX_EMBED_INPUTS or not all(
                isinstance(t, str) or (isinstance(t, list) and t and all(_is_int(i) for i in t)) for t in items):
            raise _bad("input", f"input must be a string, a list of 1 to {MAX_EMBED_INPUTS} strings, or token ids")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise _bad("encoding_format", "encoding_format must be 'float' or 'base64'")
        _refuse(body, "dimensions", lambda v: v == model.config.n_embd, f"the model's width is {model.config.n_embd}")
        for t in items:
            if isinstance(t, list) and not all(0 <= i < model.n_vocab for i in t):
                raise _bad("input", f"a token id is outside the vocabulary [0, {model.n_vocab})")
        try:
            # Tokenized once here (a lone surrogate is a ValueError too): the engine embeds the
            # ids, and usage counts them.
            ids = await run_in_threadpool(lambda: [t if isinstance(t, list) else tokenizer.tokenize(t) for t in items])
            vecs = await embedded(ids, request)
        except ContextOverflowError as e:
            raise APIError(400, str(e), param="input", code="context_length_exceeded") from None
        except ValueError as e:
            raise _bad("input", str(e)) from None
        if vecs is None:  # the client has gone
            return Response(status_code=499)
        n = sum(map(len, ids))
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()}
                for i, v in enumerate(vecs)]
        return JSONResponse({"object": "list", "model": model_name, "data": data,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    @app.post("/detokenize")
    async def detokenize(request: HTTPRequest) -> JSONResponse:
        body = await _json_body(request, max_body_bytes)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
            raise _bad("tokens", "tokens must be a list of token ids")
        bad = next((i for i in ids if not 0 <= i < model.n_vocab), None)
        if bad is not None:
            raise _bad("tokens", f"token id {bad} is outside the vocabulary [0, {model.n_vocab})")
        text = await run_in_threadpool(lambda: tokenizer.detokenize(ids).decode("utf-8", errors="replace"))
        return JSONResponse({"content": text})

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest) -> Response:
        started = time.perf_counter()
        body = await _json_body(request, max_body_bytes)
        _common(body)
        _refuse(body, "echo", lambda v: v is False, "the prompt is not echoed")
        _refuse(body, "suffix", lambda v: v == "", "no fill-in-the-middle")
        prompt = _prompt(body)
        max_tokens = _opt_int(body, "max_tokens", 0)
        n_lp = _opt_int(body, "logprobs", 0, MAX_LOGPROBS)
        streamed = _opt_bool(body, "stream")
        include_usage = _include_usage(body)
        kwargs = {**_sampling(body), "stop": _stop(body), "logprobs": n_lp,
                  "max_tokens": 16 if "max_tokens" not in body else max_tokens}
        handle, constraint_field = await submit(prompt, kwargs, started, "prompt", body)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        handle.label = cid  # the live view's name for it
        prompt_text = prompt if isinstance(prompt, str) else ""

        def shape(text: str, lp: Any, finish: str | None) -> openai_types.TextCompletion:
            return openai_types.text_completion(cid, created, model_name, text, lp, finish)

        if not streamed:
            c = await result(handle, request, constraint_field)
            lp = logprobs_of(c.token_ids, c.logprobs, len(prompt_text)) if n_lp is not None else None
            out = shape(c.text, lp, _finish(c.finish_reason))
            out["usage"] = openai_types.usage(c.prompt_tokens, len(c.token_ids), c.timings.cached_tokens)
            out["timings"] = openai_types.server_timings(c.timings)
            return JSONResponse(out)

        # The bytes of the tokens streamed so far: text_offset counts their text, as in a whole
        # completion (a chunk's text lags its tokens while a possible stop string is held back).
        done = [b""]
        n_out = [0]

        def events(ch: CompletionChunk) -> list[Any]:
            evs: list[Any] = []
            lp = None
            if n_lp is not None and ch.token_ids:
                lp = logprobs_of(ch.token_ids, ch.logprobs, len(prompt_text), done[0])
                done[0] += tokenizer.detokenize(ch.token_ids, special=False)
            n_out[0] += len(ch.token_ids)
            if ch.text:
                evs.append(shape(ch.text, lp, None))
                lp = None
            if ch.finish_reason is not None:
                last = shape("", lp, _finish(ch.finish_reason))
                assert ch.timings is not None
                last["timings"] = openai_types.server_timings(ch.timings)
                evs.append(last)
            return evs

        def final() -> list[Any]:
            if not include_usage:
                return []
            return [_usage_chunk(cid, "text_completion", created, model_name, handle.request, n_out[0])]

        return sse_response(stream(handle, events, final, constraint_field))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest) -> Response:
        started = time.perf_counter()
        body = await _json_body(request, max_body_bytes)
        _common(body)
        messages = _messages(body)
        try:
            spec = parse_tools(body.get("tools"), body.get("tool_choice"))
        except ToolError as e:
            raise _bad(e.field, str(e)) from None
        if spec is not None and spec.forced is not None:
            if _constraint(body)[1] is not None:
                raise _bad("tool_choice", "a required tool call cannot be combined with another constraint")
            body = {**body, "json_schema": tool_call_schema(spec)}  # the call, constrained
        max_tokens = _opt_int(body, "max_completion_tokens", 0)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", 0)
        want_lp = _opt_bool(body, "logprobs")
        top = _opt_int(body, "top_logprobs", 0, MAX_LOGPROBS)
        if top is not None and not want_lp:
            raise _bad("top_logprobs", "top_logprobs needs logprobs=true")
        n_lp = (top or 0) if want_lp else None
        streamed = _opt_bool(body, "stream")
        include_usage = _include_usage(body)
        template_kw: dict[str, Any] = {}
        if spec is not None:
            if "tools" in model.chat_template.source:
                template_kw["tools"] = body["tools"]
            else:
                messages = [tools_message(spec), *messages]
        try:
            ids = await run_in_threadpool(lambda: model.chat_template.encode(
                tokenizer, messages, add_generation_prompt=True, **template_kw))
        except (ValueError, ChatTemplateError) as e:
            raise _bad("messages", str(e)) from None
        kwargs = {**_sampling(body), "stop": _stop(body), "logprobs": n_lp, "max_tokens": max_tokens}
        # A required call's schema is made of the tools: its errors name them.
        forced = "tools" if spec is not None and spec.forced is not None else None
        handle, constraint_field = await submit(ids, kwargs, started, "messages", body, forced)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        handle.label = cid

        if not streamed:
            c: Completion = await result(handle, request, constraint_field)
            lp = chat_logprobs_of(c.token_ids, c.logprobs) if n_lp is not None else None
            call = parse_tool_call(c.text, spec) if spec is not None else None
            message: openai_types.ChatMessage = {"role": "assistant", "content": c.text}
            finish = _finish(c.finish_reason)
            if call is not None:
                message, finish = {"role": "assistant", "content": None, "tool_calls": [call.as_openai()]}, "tool_calls"
            out: openai_types.ChatCompletion = {
                "id": cid, "object": "chat.completion", "created": created, "model": model_name,
                "choices": [{"index": 0, "message": message, "logprobs": lp, "finish_reason": finish}],
                "usage": openai_types.usage(c.prompt_tokens, len(c.token_ids), c.timings.cached_tokens),
                "timings": openai_types.server_timings(c.timings),
            }
            return JSONResponse(out)

        first = [True]
        n_out = [0]
        # With tools, text that may be a call is held back until it is known to be one or not.
        held: list[str] | None = [] if spec is not None else None
        held_ids: list[int] = []  # the tokens of the held text, and their logprobs
        held_lps: list[Any] = []

        def events(ch: CompletionChunk) -> list[Any]:
            nonlocal held
            evs: list[Any] = []
            if first[0]:
                first[0] = False
                evs.append(openai_types.chat_chunk(cid, model_name, created, {"role": "assistant", "content": ""},
                                                   None, None))
            n_out[0] += len(ch.token_ids)
            text = ch.text
            ids, lps = ch.token_ids, list(ch.logprobs or [])  # the tokens the next delta covers
            finish = _finish(ch.finish_reason) if ch.finish_reason is not None else None
            if held is not None:
                held.append(text)
                held_ids.extend(ids)
                held_lps.extend(lps)
                ids, lps = held_ids, held_lps  # released with the held text, or the call
                so_far = "".join(held).lstrip()
                maybe_call = spec is not None and (spec.forced is not None or not so_far or so_far.startswith("{"))
                if maybe_call and finish is None:
                    text, ids = "", []
                elif maybe_call and spec is not None and (call := parse_tool_call("".join(held), spec)) is not None:
                    lp = chat_logprobs_of(ids, lps) if n_lp is not None and ids else None
                    evs.append(openai_types.chat_chunk(cid, model_name, created,
                                                       {"tool_calls": [call.as_openai(0)]}, lp, None))
                    text, ids, finish, held = "", [], "tool_calls", None
                else:
                    text, held = "".join(held), None
            lp = chat_logprobs_of(ids, lps) if n_lp is not None and ids else None
            if text:
                evs.append(openai_types.chat_chunk(cid, model_name, created, {"content": text}, lp, None))
                lp = None
            if ch.finish_reason is not None:
                last = openai_types.chat_chunk(cid, model_name, created, {}, lp, finish)
                assert ch.timings is not None
                last["timings"] = openai_types.server_timings(ch.timings)
                evs.append(last)
            return evs

        def final() -> list[Any]:
            if not include_usage:
                return []
            return [_usage_chunk(cid, "chat.completion.chunk", created, model_name, handle.request, n_out[0])]

        return sse_response(stream(handle, events, final, constraint_field))

    return app


def load_app(model: str | None = None, *, n_threads: int | None = None, n_ctx: int = 4096, precision: str = "fast",
             kv_dtype: str = "float32", max_batch: int = 16, token_budget: int = TOKEN_BUDGET,
             kv_budget_bytes: int | None = None, max_queue: int = 64, prefix_cache: bool = True,
             api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
             draft: int | None = None) -> FastAPI:
    """Load a model (a path or a known name), start an Engine on it, and return the app over
    it (the engine as app.state.engine). draft: the Engine's speculative decoding (None: its
    default)."""
    from pyinfer.model import Model
    from pyinfer.registry import resolve_model

    path = resolve_model(model)
    m = Model.load(path, n_ctx=n_ctx, n_threads=n_threads, precision=precision, kv_dtype=kv_dtype)
    engine = Engine(m, max_batch=max_batch, token_budget=token_budget, kv_budget_bytes=kv_budget_bytes,
                    max_queue=max_queue, prefix_cache=prefix_cache, draft=draft)
    return create_app(engine, model_name=path.stem, api_key=api_key, max_body_bytes=max_body_bytes)


def serve(model: str | None = None, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          n_threads: int | None = None, n_ctx: int = 4096, precision: str = "fast", kv_dtype: str = "float32",
          max_batch: int = 16, token_budget: int = TOKEN_BUDGET, kv_budget_bytes: int | None = None,
          max_queue: int = 64, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, log_level: str = "info",
          prefix_cache: bool = True, draft: int | None = None) -> None:
    """Load a model and serve it until interrupted (what `pyinfer serve` runs)."""
    import uvicorn

    app = load_app(model, n_threads=n_threads, n_ctx=n_ctx, precision=precision, kv_dtype=kv_dtype,
                   max_batch=max_batch, token_budget=token_budget, kv_budget_bytes=kv_budget_bytes, max_queue=max_queue,
                   prefix_cache=prefix_cache, api_key=api_key, max_body_bytes=max_body_bytes, draft=draft)
    engine = app.state.engine
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        engine.close(30)
