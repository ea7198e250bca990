"""The serving engine: one scheduler thread owns a Model and runs many requests at once,
admitting them by KV-cache memory, advancing every running sequence by one token per step in
one batched forward pass, and interleaving prompt chunks of the newcomers.

    engine = Engine(model, max_batch=16)
    handle = engine.submit("The capital of France is", max_tokens=16, seed=1)
    for chunk in handle:              # or: async for chunk in handle
        print(chunk.text, end="")
    print(handle.result().timings)    # the whole Completion
    engine.close()

One step of the scheduler:

1. sequences whose handle was cancelled end at once and give back their context reservation;
2. waiting requests are admitted in arrival order while their reservation fits the KV budget
   and fewer than max_batch sequences run (strict FIFO: a large request is not overtaken
   forever by small ones);
3. one `Model.decode_batch` evaluates the last sampled token of every decoding sequence, and
   each one's Request samples its next token from its row;
4. at most one chunk (up to token_budget tokens) of one prefilling sequence's prompt is
   evaluated, so a long prompt holds the others' next token back by one chunk at most; its
   last chunk gives the first token.

Batch invariance: with precision="fast" a decode_batch row is bit for bit the sequence's own
single step, and a prompt evaluated in chunks gives the same bits as evaluated whole, so a
request's tokens and log-probabilities do not depend on what runs beside it (the same
request through Model.generate gives the same result). The exact path does not promise this
for batched rows.

Admission: a sequence reserves a context for its prompt + max_tokens (max_tokens=None: the
whole context), rounded up to `ctx_granularity` tokens and capped at the model's n_ctx, in a
context of exactly that size. What it reserves is the context's whole allocation,
`Model.context_nbytes`: its KV cache and its forward-pass scratch (n_batch = token_budget
rows, which for a short context weighs more than the cache). Finished sequences' contexts
stay idle in a pool for reuse and count against the budget; they are freed, oldest first,
when a new reservation needs their room. A request that waits is queued (at most max_queue
of them); past that, submit raises OverloadedError. A request larger than the whole budget raises ValueError at once.

Not here yet: reuse of a shared prompt prefix's KV cache, and prefill rows mixed into the
decode step's forward pass (a prefill chunk is its own forward pass).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from pyinfer.errors import OverloadedError, ParameterTypeError
from pyinfer.request import CancelToken, Completion, CompletionChunk, Request, prompt_and_params

if TYPE_CHECKING:
    from pyinfer.model import Context, Model

__all__ = ["Engine", "EngineStats", "RequestHandle", "available_memory_bytes"]


def available_memory_bytes() -> int:
    """Memory the system could give this process now: MemAvailable from /proc/meminfo
    (free pages plus reclaimable caches), else the free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 4 << 30


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ParameterTypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine. running: sequences admitted (prefilling or decoding);
    waiting: requests queued for admission; batch_size: sequences in the last decode step;
    context_bytes_in_use: the contexts (KV cache + forward-pass scratch) reserved by running
    sequences; context_bytes_idle: contexts kept for reuse (freed when a reservation needs
    their room); context_budget_bytes: the bound on both together; steps: scheduler steps run;
    decode_rows: sequence rows the decode steps evaluated (their mean batch, over the decode
    steps); the other counters cover every request finished so far."""

    running: int
    waiting: int
    max_batch: int
    batch_size: int
    context_bytes_in_use: int
    context_bytes_idle: int
    context_budget_bytes: int
    steps: int
    decode_rows: int
    requests_finished: int
    prompt_tokens_total: int
    predicted_tokens_total: int


# ---- delivering chunks to a consumer on any thread or event loop


class _Channel:
    """A queue from the scheduler thread to one consumer, which may block on it (a thread)
    or await it (an event loop, woken with call_soon_threadsafe)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._items: deque[CompletionChunk | BaseException] = deque()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def put(self, item: CompletionChunk | BaseException) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, fut = waiter
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits any more
                loop.call_soon_threadsafe(_wake_future, fut)

    def get(self, timeout: float | None = None) -> CompletionChunk | BaseException:
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._items), timeout):
                raise TimeoutError(f"no chunk within {timeout} s")
            return self._items.popleft()

    async def aget(self) -> CompletionChunk | BaseException:
        while True:
            loop = asyncio.get_running_loop()
            with self._cond:
                if self._items:
                    return self._items.popleft()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, fut)
            await fut


def _wake_future(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


# ---- one request as the caller sees it


class RequestHandle:
    """A submitted request: iterate it (sync or async) for its CompletionChunks, the last of
    which has a finish_reason and timings; `result()` / `await aresult()` give the whole
    Completion (whatever chunks were not read yet included). `cancel()` may be called from
    any thread or event loop: the sequence ends within one scheduler step ("cancelled") and
    its context reservation is freed. Errors the engine meets while running it (it is closing, a
    failure in the model) are raised from the iteration."""

    def __init__(self, engine: Engine, request: Request, n_ctx: int, submitted: float) -> None:
        self.request = request
        self.n_ctx = n_ctx  # the size of the KV cache it reserves
        self.submitted = submitted
        self._engine = engine
        self._channel = _Channel()
        self._chunks: list[CompletionChunk] = []  # every chunk read so far
        self._done = False

    @property
    def finished(self) -> bool:
        """All chunks have been read."""
        return self._done

    def cancel(self) -> None:
        self.request.cancel_token.cancel()
        self._engine._wake()

    def _take(self, item: CompletionChunk | BaseException) -> CompletionChunk:
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._chunks.append(item)
        if item.finish_reason is not None:
            self._done = True
        return item

    def __iter__(self) -> Iterator[CompletionChunk]:
        return self

    def __next__(self) -> CompletionChunk:
        if self._done:
            raise StopIteration
        return self._take(self._channel.get())

    def __aiter__(self) -> AsyncIterator[CompletionChunk]:
        return self

    async def __anext__(self) -> CompletionChunk:
        if self._done:
            raise StopAsyncIteration
        return self._take(await self._channel.aget())

    def result(self, timeout: float | None = None) -> Completion:
        """The whole completion, waiting for it to finish (TimeoutError after `timeout`
        seconds without a chunk)."""
        while not self._done:
            self._take(self._channel.get(timeout))
        return self.request.completion(self._chunks)

    async def aresult(self) -> Completion:
        while not self._done:
            self._take(await self._channel.aget())
        return self.request.completion(self._chunks)


# ---- the scheduler's view of a running sequence


class _Seq:
    __slots__ = ("ctx", "handle", "next_token", "prefill", "prefill_at", "prefill_s", "req")

    def __init__(self, handle: RequestHandle, ctx: Context) -> None:
        self.handle = handle
        self.req = handle.request
        self.ctx = ctx
        self.prefill = self.req.prefill_ids()
        self.prefill_at = 0  # prompt tokens evaluated so far
        self.prefill_s = 0.0
        self.next_token: int | None = None  # sampled, to be evaluated by the next decode step


class Engine:
    """Many requests on one model: a scheduler thread batching their decode steps.

    max_batch: sequences running at once (prefilling or decoding). token_budget: the
    largest prompt chunk evaluated in one step. kv_budget_bytes: memory for the sequences'
    contexts, each counted whole (KV cache and forward-pass scratch, Model.context_nbytes),
    those reserved by running sequences and those kept idle for reuse (None: half the memory
    available now). max_queue: requests that may wait for admission before submit raises
    OverloadedError. ctx_granularity: a reservation is rounded up to this many tokens, so
    that freed caches fit later requests. on_finish: called on the scheduler thread with
    each finished Request (for metrics; it must be quick and must not raise).

    The model must not be used by anything else while the engine runs (its contexts are
    the engine's, but decode_batch's scratch is shared).
    """

    def __init__(
        self,
        model: Model,
        *,
        max_batch: int = 16,
        token_budget: int = 256,
        kv_budget_bytes: int | None = None,
        max_queue: int = 64,
        ctx_granularity: int = 256,
        on_finish: Callable[[Request], None] | None = None,
    ) -> None:
        self.model = model
        self.n_ctx = int(model.n_ctx)
        self.max_batch = _positive("max_batch", max_batch)
        self.token_budget = _positive("token_budget", token_budget)
        self.max_queue = _positive("max_queue", max_queue)
        self.ctx_granularity = _positive("ctx_granularity", ctx_granularity)
        if kv_budget_bytes is None:
            kv_budget_bytes = available_memory_bytes() // 2
        self.kv_budget_bytes = _positive("kv_budget_bytes", kv_budget_bytes)
        self.on_finish = on_finish

        self._cond = threading.Condition(threading.Lock())
        self._waiting: deque[RequestHandle] = deque()
        self._running: list[_Seq] = []
        self._idle: OrderedDict[int, list[Context]] = OrderedDict()  # n_ctx -> contexts, LRU first
        self._bytes_in_use = 0  # contexts of running sequences, as context_bytes_for counts them
        self._bytes_idle = 0
        self._closed = False
        self._batch_size = 0
        self._steps = 0
        self._decode_rows = 0
        self._finished = 0
        self._prompt_total = 0
        self._predicted_total = 0
        self._thread = threading.Thread(target=self._loop, name="pyinfer-engine", daemon=True)
        self._thread.start()

    # -- submitting

    def context_bytes_for(self, n_ctx: int) -> int:
        """The bytes a sequence's context of n_ctx tokens allocates: its KV cache and the
        scratch of its forward pass (n_batch = token_budget rows, capped at n_ctx)."""
        return int(self.model.context_nbytes(n_ctx, min(self.token_budget, n_ctx)))

    def _ctx_bytes(self, ctx: Context) -> int:
        return self.context_bytes_for(ctx.n_ctx)

    def submit(
        self,
        prompt: str | Sequence[int] | np.ndarray,
        *,
        max_tokens: int | None = 256,
        stop: str | Sequence[str] | None = None,
        add_bos: bool | None = None,
        special: bool = False,
        truncate: Literal["left"] | None = None,
        started: float | None = None,
        **sampling: Any,
    ) -> RequestHandle:
        """Queue a completion of `prompt` (text, or token ids) and return its handle.

        The keywords are Model.generate's (sampling: SamplingParams' fields, seed and
        logprobs among them). started: when the request arrived (time.perf_counter()), so
        that its timings count what came before this call. Raises, before anything is
        queued: what Model.generate raises for bad arguments (ValueError, TypeError,
        ContextOverflowError), ValueError when the request's context alone (KV cache and scratch) needs more than
        the budget, OverloadedError when max_queue requests already wait, RuntimeError when
        the engine is closed.
        """
        t0 = perf_counter() if started is None else started
        if self._closed:
            raise RuntimeError("the engine is closed")
        ids, params = prompt_and_params(
            prompt, lambda text: self.model.tokenize(text, add_bos=add_bos, special=special), sampling, "submit"
        )
        # The cache holds the prompt and every sampled token but the last; a request that
        # may run past the context gets the whole context and ends there ("length").
        n_prompt = len(ids)
        n_ctx = self.n_ctx
        if isinstance(max_tokens, (int, np.integer)) and not isinstance(max_tokens, bool) and max_tokens >= 0:
            g = self.ctx_granularity
            n_ctx = min(self.n_ctx, -(-max(n_prompt + int(max_tokens), 1) // g) * g)
        req = Request(
            self.model.tokenizer,
            ids,
            params,
            n_ctx=n_ctx,
            max_tokens=max_tokens,
            stop=stop,
            cancel=CancelToken(),
            truncate=truncate,
            special=special,
            started=t0,
            tokenize_s=perf_counter() - t0,
        )
        need = self.context_bytes_for(n_ctx)
        if need > self.kv_budget_bytes:
            raise ValueError(
                f"the request needs a context of {n_ctx} tokens ({need} bytes of KV cache and "
                f"scratch), more than the engine's budget of {self.kv_budget_bytes} bytes: "
                "lower max_tokens"
            )
        handle = RequestHandle(self, req, n_ctx, perf_counter())
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if len(self._waiting) >= self.max_queue:
                raise OverloadedError(
                    f"the engine is full: {len(self._running)} sequences running and "
                    f"{len(self._waiting)} requests waiting (max_queue = {self.max_queue})",
                    retry_after=1.0,
                )
            self._waiting.append(handle)
            self._cond.notify()
        return handle

    def chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> RequestHandle:
        """Submit a reply to a conversation, rendered with the model's chat template and an
        assistant header (what Model.chat runs); the keywords are submit's."""
        started = kwargs.pop("started", None) or perf_counter()
        ids = self.model.chat_template.encode(self.model.tokenizer, messages, add_generation_prompt=True)
        return self.submit(ids, started=started, **kwargs)

    # -- state

    def stats(self) -> EngineStats:
        with self._cond:
            return EngineStats(
                running=len(self._running),
                waiting=len(self._waiting),
                max_batch=self.max_batch,
                batch_size=self._batch_size,
                context_bytes_in_use=self._bytes_in_use,
                context_bytes_idle=self._bytes_idle,
                context_budget_bytes=self.kv_budget_bytes,
                steps=self._steps,
                decode_rows=self._decode_rows,
                requests_finished=self._finished,
                prompt_tokens_total=self._prompt_total,
                predicted_tokens_total=self._predicted_total,
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float | None = None) -> None:
        """Stop the scheduler: running and waiting requests end "cancelled". Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    # -- the scheduler thread

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._closed or bool(self._waiting or self._running))
                    if self._closed:
                        break
                self._step()
        except BaseException as e:  # a bug in the scheduler: fail every request, not hang them
            self._closed = True
            self._fail_all(RuntimeError(f"the engine stopped: {e!r}"))
            raise
        self._cancel_all()

    def _step(self) -> None:
        self._drop_cancelled()
        self._admit()
        decoding = [s for s in self._running if s.next_token is not None]
        if decoding:
            self._decode(decoding)
        prefilling = next((s for s in self._running if s.next_token is None), None)
        if prefilling is not None:
            self._prefill_chunk(prefilling)
        with self._cond:
            self._steps += 1

    def _drop_cancelled(self) -> None:
        with self._cond:
            gone = [h for h in self._waiting if h.request.cancelled]
            for h in gone:
                self._waiting.remove(h)
        for h in gone:
            self._deliver(h, h.request.abort().chunk)
            self._count(h.request)
        for s in [s for s in self._running if s.req.cancelled]:
            self._end(s, s.req.abort(eval_s=s.prefill_s if s.next_token is None else 0.0).chunk)

    def _admit(self) -> None:
        while True:
            with self._cond:
                if not self._waiting or len(self._running) >= self.max_batch:
                    return
                h = self._waiting[0]
                need = self.context_bytes_for(h.n_ctx)
                reuse = bool(self._idle.get(h.n_ctx))
                if not reuse:
                    # Free idle contexts, oldest first, until the new one fits beside the rest.
                    while self._idle and self._bytes_in_use + self._bytes_idle + need > self.kv_budget_bytes:
                        n, ctxs = next(iter(self._idle.items()))
                        self._bytes_idle -= self._ctx_bytes(ctxs.pop(0))
                        if not ctxs:
                            del self._idle[n]
                    if self._bytes_in_use + self._bytes_idle + need > self.kv_budget_bytes:
                        return  # it waits for a running sequence to finish
                self._waiting.popleft()
                ctx = None
                if reuse:
                    ctx = self._idle[h.n_ctx].pop()
                    self._idle.move_to_end(h.n_ctx)
                    if not self._idle[h.n_ctx]:
                        del self._idle[h.n_ctx]
                    self._bytes_idle -= need
                self._bytes_in_use += need
            if ctx is None:
                try:
                    ctx = self.model.context(h.n_ctx, n_batch=min(self.token_budget, h.n_ctx))
                except BaseException as e:
                    with self._cond:
                        self._bytes_in_use -= need
                    h._channel.put(e)
                    continue
            # The wait for admission is queueing too.
            h.request.timings.queue_s += perf_counter() - h.submitted
            with self._cond:
                self._running.append(_Seq(h, ctx))

    def _decode(self, seqs: list[_Seq]) -> None:
        toks = [s.next_token for s in seqs]
        t = perf_counter()
        try:
            logits = self.model.decode_batch([s.ctx for s in seqs], cast("list[int]", toks))
        except BaseException as e:
            for s in seqs:
                self._end(s, None, error=e)
            return
        dt = perf_counter() - t
        with self._cond:
            self._batch_size = len(seqs)
            self._decode_rows += len(seqs)
        for s, row in zip(seqs, logits):
            self._sample(s, row, dt)

    def _prefill_chunk(self, s: _Seq) -> None:
        chunk = s.prefill[s.prefill_at : s.prefill_at + self.token_budget]
        t = perf_counter()
        try:
            logits = s.ctx.eval(chunk)
        except BaseException as e:
            self._end(s, None, error=e)
            return
        s.prefill_s += perf_counter() - t
        s.prefill_at += len(chunk)
        if s.prefill_at == len(s.prefill):
            with self._cond:
                self._prompt_total += len(s.prefill)
            self._sample(s, logits, s.prefill_s)

    def _sample(self, s: _Seq, logits: np.ndarray, eval_s: float) -> None:
        try:
            r = s.req.step(logits, eval_s=eval_s)
        except BaseException as e:
            self._end(s, None, error=e)
            return
        if r.finished:
            self._end(s, r.chunk)
            return
        if r.chunk is not None:
            self._deliver(s.handle, r.chunk)
        s.next_token = r.token

    def _deliver(self, h: RequestHandle, chunk: CompletionChunk | None) -> None:
        if chunk is not None:
            h._channel.put(chunk)

    def _count(self, req: Request) -> None:
        with self._cond:
            self._finished += 1
            self._predicted_total += req.timings.sampled_tokens
        if self.on_finish is not None:
            with contextlib.suppress(Exception):  # a metrics hook must not take the scheduler down
                self.on_finish(req)

    def _end(self, s: _Seq, chunk: CompletionChunk | None, *, error: BaseException | None = None) -> None:
        """Take s out of the batch, give its cache back to the pool and send its last chunk
        (or the error)."""
        nbytes = self._ctx_bytes(s.ctx)
        with self._cond:
            self._running.remove(s)
            self._bytes_in_use -= nbytes
            if error is None:
                s.ctx.reset()
                self._idle.setdefault(s.handle.n_ctx, []).append(s.ctx)
                self._idle.move_to_end(s.handle.n_ctx)
                self._bytes_idle += nbytes
        if error is not None:
            s.handle._channel.put(error)
        else:
            self._deliver(s.handle, chunk)
            self._count(s.req)

    def _cancel_all(self) -> None:
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
        for h in waiting:
            self._deliver(h, h.request.abort().chunk)
        for s in list(self._running):
            self._end(s, s.req.abort().chunk)
        with self._cond:
            self._idle.clear()
            self._bytes_idle = 0

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            handles = list(self._waiting) + [s.handle for s in self._running]
            self._waiting.clear()
            self._running.clear()
            self._bytes_in_use = 0
        for h in handles:
            h._channel.put(error)
