"""pyinfer's engine as a Ray Serve application (the `[ray]` extra: `pip install 'pyinfer[ray]'`).

Two deployments behind Serve's HTTP proxy:

- `PyinferEngine`: each replica loads the model once and runs one `Engine` with the
  OpenAI app of `pyinfer.server` in-process; a request reaches it as one streamed call
  (`http`) that yields the response's status and headers, then its body as it is written.
  It autoscales on ongoing requests per replica and is health-checked (a replica whose
  scheduler has stopped is restarted).
- `PyinferFront` (the ingress, no CPU reserved): checks the API key, reads the body, picks a
  routing key and forwards the request. Requests that share a key prefer the same replica
  (`PrefixAffinityRouter`), so the replica that holds a conversation's or a system prompt's
  KV blocks in its prefix cache serves the next request that shares them. The key is the
  `x-session-id` header, else the request's `user` field, else a hash of the head of the
  prompt (the first message of a chat, the first 256 characters of a completion's prompt).
  A request whose replica dies before any of its body was sent is retried on another
  replica; one that dies mid-stream ends with an error event, the OpenAI error shape.
  `GET /metrics` gathers every replica's metrics, each sample labelled `replica`.

    from pyinfer.serve.ray import ReplicaConfig, application
    from ray import serve
    serve.run(application(ReplicaConfig(n_threads=1), replicas=2), route_prefix="/")

`pyinfer serve --ray` does that and waits (see `run`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import random
import signal
import threading
from collections.abc import AsyncIterator, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

import ray
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
from starlette.types import Receive, Scope, Send

from pyinfer.engine import TOKEN_BUDGET
from pyinfer.server import (
    DEFAULT_MAX_BODY_BYTES,
    APIError,
    check_api_key,
    install_error_handlers,
    load_app,
    read_body,
)

ENGINE_DEPLOYMENT = "PyinferEngine"
FRONT_DEPLOYMENT = "PyinferFront"
REPLICA_HEADER = "x-pyinfer-replica"  # names the replica that answered
SESSION_HEADER = "x-session-id"
PROMPT_HEAD_CHARS = 256
# Failures of the replica itself (its process died, or it cannot be reached), as opposed to
# an error the request earned: only these are retried.
_REPLICA_FAILURES = (RayActorError, ActorUnavailableError)


@dataclass(frozen=True)
class ReplicaConfig:
    """What each replica loads and how its engine schedules: `pyinfer.server.load_app`'s
    options, by the same names."""

    model: str | None = None  # a GGUF path or a known model name (default: smollm2)
    n_threads: int = 1  # the replica reserves this many CPUs from Ray
    n_ctx: int = 4096
    precision: str = "fast"
    kv_dtype: str = "float32"
    max_batch: int = 16
    token_budget: int = TOKEN_BUDGET
    kv_budget_bytes: int | None = None  # default: half the memory available to the replica
    max_queue: int = 64
    prefix_cache: bool = True
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    draft: int | None = None  # guessed tokens per pass (None: the engine's default)

    def __post_init__(self) -> None:
        for name in ("n_threads", "n_ctx", "max_batch", "token_budget", "max_body_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.max_queue, int) or self.max_queue < 0:
            raise ValueError(f"max_queue must be a non-negative integer, got {self.max_queue!r}")


@dataclass(frozen=True)
class Autoscaling:
    """Replicas between min_replicas and max_replicas, aiming at target_ongoing_requests
    requests in flight per replica (default: the replica's max_batch)."""

    min_replicas: int = 1
    max_replicas: int = 2
    target_ongoing_requests: float | None = None
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if not (isinstance(self.min_replicas, int) and 0 <= self.min_replicas <= self.max_replicas):
            raise ValueError(f"min_replicas must be an integer in 0..max_replicas, got {self.min_replicas!r}")
        if not (isinstance(self.max_replicas, int) and self.max_replicas >= 1):
            raise ValueError(f"max_replicas must be a positive integer, got {self.max_replicas!r}")
        if self.target_ongoing_requests is not None and not self.target_ongoing_requests > 0:
            raise ValueError(f"target_ongoing_requests must be > 0, got {self.target_ongoing_requests!r}")


# -- routing ---------------------------------------------------------------------------------


def routing_key(headers: dict[str, str], body: Any) -> str:
    """What requests that should meet on one replica share: the session header, else the
    OpenAI `user` field, else the head of the prompt; "" when none (least loaded wins)."""
    session = headers.get(SESSION_HEADER, "").strip()
    if session:
        return "session:" + session
    if not isinstance(body, dict):
        return ""
    user = body.get("user")
    if isinstance(user, str) and user:
        return "user:" + user
    messages, prompt = body.get("messages"), body.get("prompt")
    if isinstance(messages, list) and messages:
        head = json.dumps(messages[0], sort_keys=True, default=str)
    elif isinstance(prompt, str) and prompt:
        head = prompt[:PROMPT_HEAD_CHARS]
    else:
        return ""
    return "prompt:" + hashlib.blake2b(head.encode(errors="replace"), digest_size=16).hexdigest()


def _weight(key: str, replica: str) -> int:
    """Rendezvous hashing: each (key, replica) pair's weight, the same in every process."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest(), "big")


class PrefixAffinityRouter(RequestRouter):
    """Requests with a routing key go to the replica that ranks it highest (rendezvous
    hashing: adding or losing a replica moves only the keys it gains or held), unless that
    replica's queue is more than `max_imbalance` requests longer than the shortest one
    known, or it refuses the request (full): then the next in rank. Requests without a key
    go to the less loaded of two replicas drawn at random."""

    max_imbalance = 8

    def initialize_state(self, max_imbalance: int = 8, **kwargs: Any) -> None:
        if not isinstance(max_imbalance, int) or max_imbalance < 0:
            raise ValueError(f"max_imbalance must be a non-negative integer, got {max_imbalance!r}")
        self.max_imbalance = max_imbalance

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:  # when every replica is full: wait between rounds of probes
            pending_request.routing_context.should_backoff = True
        key = pending_request.metadata.session_id if pending_request is not None else ""
        if not key:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        ranked = sorted(candidate_replicas, key=lambda r: _weight(key, r.replica_id.unique_id), reverse=True)
        lens = {r.replica_id: self.replica_queue_len_cache.get(r.replica_id) for r in ranked}
        known = [n for n in lens.values() if n is not None]
        if known:
            floor = min(known)
            near = [r for r in ranked if (n := lens[r.replica_id]) is None or n <= floor + self.max_imbalance]
            ranked = near + [r for r in ranked if r not in near]
        return [[r] for r in ranked]


# -- the replica -----------------------------------------------------------------------------


class EngineReplica:
    """One model and its `Engine`, with `pyinfer.server`'s app over it."""

    def __init__(self, config: ReplicaConfig) -> None:
        # No key here: the front checks it before anything reaches a replica.
        self.app = load_app(**dataclasses.asdict(config))
        self.engine = self.app.state.engine
        self.replica = serve.get_replica_context().replica_id.unique_id

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine has stopped is restarted."""
        if self.engine.closed or not self.engine.running:
            raise RuntimeError("the engine's scheduler has stopped")

    def metrics(self) -> tuple[str, bytes]:
        return self.replica, generate_latest(self.app.state.metrics.registry)

    def pid(self) -> tuple[str, int]:
        return self.replica, os.getpid()

    async def http(self, request: dict[str, Any], body: bytes) -> AsyncIterator[Any]:
        """Run one HTTP request (its ASGI scope's fields, FORWARDED_SCOPE) through the app:
        yields (status, headers), then the body's pieces as the app writes them. Cancelling
        the call is the client going away."""
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "scheme": "http",
                 "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), "http_version": "1.1", **request}
        sent: asyncio.Queue[MutableMapping[str, Any] | None] = asyncio.Queue()
        gone = asyncio.Event()
        body_read = False

        async def receive() -> dict[str, Any]:
            nonlocal body_read
            if not body_read:
                body_read = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            await sent.put(message)

        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda _: sent.put_nowait(None))
        try:
            while (message := await sent.get()) is not None:
                if message["type"] == "http.response.start":
                    yield message["status"], [*message.get("headers", []),
                                              (REPLICA_HEADER.encode(), self.replica.encode())]
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield bytes(message["body"])
                    if not message.get("more_body", False):
                        break
            if task.done():
                task.result()  # the app's own failure, if any
        finally:
            gone.set()  # the app's stream cancels the request's sequence when it sees this
            if not task.done():
                try:
                    await asyncio.wait_for(asyncio.shield(task), 5)
                except (asyncio.TimeoutError, Exception):
                    task.cancel()

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close(10)


# -- the front -------------------------------------------------------------------------------


def merge_metrics(parts: Iterable[tuple[str, bytes]]) -> bytes:
    """Prometheus expositions of several replicas as one, each sample labelled `replica`."""
    families: dict[str, Metric] = {}
    for replica, text in sorted(parts):
        for fam in text_string_to_metric_families(text.decode()):
            out = families.get(fam.name)
            if out is None:
                out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                out.add_sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp, s.exemplar)

    class _All:
        def collect(self) -> Iterable[Metric]:
            return families.values()

    return generate_latest(_All())


# The parts of an HTTP request's ASGI scope a replica gets as they are (the proxy's root_path
# included: a route prefix reaches the app as it would behind any proxy).
FORWARDED_SCOPE = ("method", "path", "raw_path", "root_path", "query_string", "headers", "http_version")


class Front:
    """The ingress: the key check, the routing key, retries before the first byte."""

    def __init__(self, engine: DeploymentHandle, api_key: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, retries: int = 1,
                 first_byte_timeout_s: float = 600.0) -> None:
        self.engine = engine
        self.expected = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.retries = retries
        self.first_byte_timeout_s = first_byte_timeout_s

    def __serve_build_asgi_app__(self) -> FastAPI:
        app = FastAPI(title="pyinfer (Ray Serve)", docs_url=None, redoc_url=None, openapi_url=None)
        install_error_handlers(app)

        @app.get("/health")
        async def health() -> JSONResponse:
            return JSONResponse({"status": "ok"})

        @app.get("/metrics")
        async def metrics(request: HTTPRequest) -> Response:
            check_api_key(self.expected, request)
            results = await self.engine.broadcast("metrics").results_async(timeout_s=15, return_exceptions=True)
            # A replica that is dying or starting is left out of this scrape, not the whole of it.
            return Response(merge_metrics(r for r in results if isinstance(r, tuple)), media_type=CONTENT_TYPE_LATEST)

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
        async def forward(request: HTTPRequest, path: str) -> Response:
            check_api_key(self.expected, request)
            return await self.forward(request)

        return app

    async def forward(self, request: HTTPRequest) -> Response:
        body = await read_body(request, self.max_body_bytes)
        try:
            parsed = json.loads(body) if body else None
        except (ValueError, RecursionError):
            parsed = None  # the replica answers what is wrong with it
        key = routing_key(dict(request.headers), parsed)
        scope = {k: request.scope[k] for k in FORWARDED_SCOPE if k in request.scope}
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            options: dict[str, Any] = {"method_name": "http", "stream": True}
            if key and attempt == 0:  # a retry goes wherever the router finds room
                options["session_id"] = key
            gen: Any = None
            try:
                gen = self.engine.options(**options).remote(scope, body)
                status, headers = await asyncio.wait_for(gen.__anext__(), self.first_byte_timeout_s)
                try:
                    first = await asyncio.wait_for(gen.__anext__(), self.first_byte_timeout_s)
                except StopAsyncIteration:
                    first = None
            except _REPLICA_FAILURES as e:  # nothing was sent yet: another replica may serve it
                _cancel(gen)
                last = e
                await asyncio.sleep(0.25 * 2 ** attempt)
                continue
            except BackPressureError as e:
                _cancel(gen)
                raise APIError(503, f"every replica is full: {e}", type="server_error", code="overloaded",
                               headers={"Retry-After": "1"}) from None
            except asyncio.TimeoutError:
                _cancel(gen)
                raise APIError(503, f"no replica answered within {self.first_byte_timeout_s:.0f} s",
                               type="server_error", code="replica_unavailable", headers={"Retry-After": "1"}) from None
            except RayTaskError as e:
                _cancel(gen)
                raise APIError(500, f"internal error in the replica: {e.cause!r}", type="server_error") from None
            except BaseException:  # cancelled: the client went away before the first byte
                _cancel(gen)
                raise
            return Forwarded(status, headers, first, gen)
        raise APIError(503, f"the replica serving the request failed, and {self.retries} retries too: {last}",
                       type="server_error", code="replica_unavailable", headers={"Retry-After": "1"})


def _cancel(gen: Any) -> None:
    if gen is not None:
        gen.cancel()


class Forwarded(Response):
    """A replica's response passed on as it arrives. A replica lost mid-way ends a stream of
    server-sent events with an error event; a client that goes away cancels the replica's
    call (and with it the engine's request)."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], first: bytes | None, gen: Any) -> None:
        self.status_code = status
        self.raw_headers = [(k, v) for k, v in headers if k.lower() not in (b"content-length", b"transfer-encoding")]
        self.background = None
        self.first, self.gen = first, gen
        self.sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        done = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if self.first is not None:
                await send({"type": "http.response.body", "body": self.first, "more_body": True})
            try:
                async for piece in self.gen:
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            except (*_REPLICA_FAILURES, RayTaskError) as e:
                if self.sse:  # the status has gone out: the failure becomes the stream's last event
                    message = f"the replica serving this request failed mid-way: {type(e).__name__}"
                    event = APIError(502, message, type="server_error", code="replica_failed").event()
                    await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
            done = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if not done:  # the client went away (cancelled, or its connection refused a write)
                self.gen.cancel()


# -- the application -------------------------------------------------------------------------


def application(config: ReplicaConfig | None = None, *, replicas: int = 1, autoscaling: Autoscaling | None = None,
                api_key: str | None = None, retries: int = 1, max_imbalance: int = 8,
                health_check_period_s: float = 2.0) -> serve.Application:
    """The Serve application: `replicas` fixed replicas, or autoscaling between its bounds."""
    config = config or ReplicaConfig()
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValueError(f"replicas must be a positive integer, got {replicas!r}")
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
    router_config: Any = RequestRouterConfig  # a pydantic model whose fields mypy reads wrongly
    options: dict[str, Any] = {
        "name": ENGINE_DEPLOYMENT,
        "ray_actor_options": {"num_cpus": config.n_threads},
        # A replica takes what its engine runs and queues; past that requests wait at the front,
        # up to max_queued_requests, and then are refused (503 with Retry-After).
        "max_ongoing_requests": config.max_batch + max(1, config.max_queue),
        "max_queued_requests": max(1, config.max_queue),
        "request_router_config": router_config(request_router_class=f"{__name__}.PrefixAffinityRouter",
                                               request_router_kwargs={"max_imbalance": max_imbalance}),
        "health_check_period_s": health_check_period_s,
        "health_check_timeout_s": 30.0,
        "graceful_shutdown_timeout_s": 10.0,
    }
    if autoscaling is None:
        options["num_replicas"] = replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": autoscaling.min_replicas, "max_replicas": autoscaling.max_replicas,
            "initial_replicas": max(1, autoscaling.min_replicas),
            "target_ongoing_requests": autoscaling.target_ongoing_requests or config.max_batch,
            "upscale_delay_s": autoscaling.upscale_delay_s, "downscale_delay_s": autoscaling.downscale_delay_s}
    deployment: Any = serve.deployment  # typed as a decorator factory; called on a class here
    engine = deployment(EngineReplica).options(**options)
    front = deployment(serve.ingress()(Front)).options(
        name=FRONT_DEPLOYMENT, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096)
    return front.bind(engine.bind(config), api_key=api_key, max_body_bytes=config.max_body_bytes, retries=retries)


def local_cluster_defaults() -> None:
    """Settings for a cluster started on this machine, unless the environment has its own:
    Ray starts worker processes (the replicas among them) at niceness 15, so that the
    driver comes first; a replica is the work here, and beside any busy process at niceness 0
    it would get a sliver of a core (per-token latency 20 times longer, measured). And Serve's
    start-up checks get more time than their defaults (5 s for the proxy to be ready, 0.1 s
    for a queue-length probe): a small machine is busy loading models then."""
    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "2")


def run(config: ReplicaConfig, *, host: str = "127.0.0.1", port: int = 8000, address: str | None = None,
        replicas: int = 1, autoscaling: Autoscaling | None = None, api_key: str | None = None,
        name: str = "pyinfer") -> None:
    """What `pyinfer serve --ray` runs: join the cluster at `address` (or $RAY_ADDRESS; "auto":
    the one `ray start` left on this machine), else start one here; serve the application on
    host:port through Serve's proxy until SIGINT or SIGTERM, then take it down."""
    started_here = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or "local"
        if address != "local":
            ray.init(address=address, log_to_driver=False)
        else:
            local_cluster_defaults()
            ray.init(address="local", include_dashboard=False, log_to_driver=False)
            started_here = True
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(config, replicas=replicas, autoscaling=autoscaling, api_key=api_key),
                  name=name, route_prefix="/", blocking=False)
        print(f"pyinfer serve: Ray Serve application {name!r} on http://{host}:{port}/ "
              f"({'autoscaling' if autoscaling else f'{replicas} replica(s)'}, {config.n_threads} thread(s) each)",
              flush=True)
        stop.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        try:
            serve.delete(name)
            if started_here:
                serve.shutdown()
        finally:
            if started_here:
                ray.shutdown()


def replica_pids(app_name: str = "pyinfer", timeout_s: float = 30) -> dict[str, int]:
    """Each live replica's process id, by replica id (for operations: which process to watch)."""
    handle = serve.get_deployment_handle(ENGINE_DEPLOYMENT, app_name=app_name)
    return dict(handle.broadcast("pid").results(timeout_s=timeout_s))


__all__ = ["Autoscaling", "EngineReplica", "Forwarded", "Front", "PrefixAffinityRouter", "ReplicaConfig",
           "application", "local_cluster_defaults", "merge_metrics", "replica_pids", "routing_key", "run"]
