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
   forever by small ones); each starts from the longest cached prefix of its prompt;
3. one forward pass (`Batch.step`) evaluates the last sampled token of every decoding
   sequence and, in the same pass, prompt chunks of the prefilling ones, up to token_budget
   prompt tokens in all (chunked prefill: a long prompt holds nobody's next token back, and
   costs the others one step's share of the pass); each sequence's Request samples from its
   row (a prefilling one when its last chunk is in). Prompts with the fewest tokens left go
   first (a question after a cached system prompt does not wait behind a long document's
   chunks), except that those passed over for `max_defer` steps go before them, oldest first.

Speculative decoding (`draft`, on by default on the fast path): a decoding sequence whose
last tokens occurred earlier in its prompt or output brings the tokens that followed them
there as guesses (`pyinfer.lookup`), evaluated in the same pass after its sampled token; its
Request samples from each of its rows in turn and keeps the guesses while each matches, and
the cache drops the rest. A guess's rows come out of the prompt chunks' token budget, and
each sequence's guess is as long as the whole step's expected tokens per unit of its cost
say (the engine times its steps by rows). Tokens are those of plain decoding.

Batch invariance: with precision="fast" each row of a step is bit for bit its sequence's
own evaluation, a prompt evaluated in chunks gives the same bits as evaluated whole, and a
copied prefix is the cache its evaluation would have made, so a request's tokens and
log-probabilities do not depend on what runs beside it, on the chunking, or on the prefix
cache (the same request through Model.generate gives the same result). The exact path does
not promise this for batched rows.

Admission: a sequence reserves a context for its prompt + max_tokens (max_tokens=None: the
whole context), rounded up to `ctx_granularity` tokens and capped at the model's n_ctx, in a
context of exactly that size: its KV cache (`Model.context_nbytes(n_ctx, 1)`; the forward
pass's scratch is the engine's one Batch, sized for max_batch + token_budget rows).
Finished sequences' contexts stay idle in a pool, least recently used first, and count
against the budget; they are freed, oldest first, when a new reservation needs their room. A
request that waits is queued (at most max_queue of them); past that, submit raises
OverloadedError. A request larger than the whole budget raises ValueError at once.

Prefix cache: every context, running or idle, remembers the tokens it holds. A new request
starts from the context holding the longest prefix of its prompt (in whole prefix_block
blocks, short of the prompt's last token): the idle context itself when it has the right
size (a truncation), else a copy of that prefix into its own (`Context.copy_prefix`). Only
the rest of the prompt is evaluated; Timings.cached_tokens says how much was found. A
context used as a source moves to the recently used end of the pool, so a shared system
prompt stays cached while requests keep coming. A request whose prefix a running sequence is
still evaluating waits for it (takes no chunk) and copies it once it is there, so requests
arriving together after the same system prompt evaluate it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pyinfer.errors import OverloadedError, ParameterTypeError
from pyinfer.generate import DEFAULT_DRAFT
from pyinfer.lookup import PassCosts, PromptLookup
from pyinfer.model import Batch
from pyinfer.request import (
    TOKEN_BUDGET,
    CancelToken,
    Completion,
    CompletionChunk,
    Request,
    StepResult,
    common_prefix,
    prompt_and_params,
)

if TYPE_CHECKING:
    from pyinfer.model import Context, Model

__all__ = ["TOKEN_BUDGET", "Engine", "EngineStats", "RequestHandle", "available_memory_bytes"]


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
    steps); cached_tokens_total: prompt tokens taken from the prefix cache instead of
    evaluated, by prefix_hits admissions; batch_scratch_bytes: the shared forward-pass
    scratch (outside the budget); the other counters cover every request finished so far."""

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
    cached_tokens_total: int
    prefix_hits: int
    batch_scratch_bytes: int


# ---- delivering chunks to a consumer on any thread or event loop


class _Channel:
    """A queue from the scheduler thread to the request's readers, which may block on it (a
    thread) or await it (an event loop, woken with call_soon_threadsafe). Readers share one
    cursor: each chunk goes to one of them, and every chunk read is kept (`chunks`). Once one
    of them has taken the last item (a chunk with a finish_reason, or an error), the channel
    has ended for all of them, so none waits for an item that will not come."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._items: deque[CompletionChunk | BaseException] = deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.chunks: list[CompletionChunk] = []  # every chunk read so far, in order
        self.ended = False  # the last item has been taken
        self.error: BaseException | None = None  # the error it ended with

    def put(self, item: CompletionChunk | BaseException) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        _wake(waiters)

    def _pop(self) -> CompletionChunk | BaseException | None:
        """The next item (None: the channel has ended), with the lock held."""
        if not self._items:
            return None
        item = self._items.popleft()
        if isinstance(item, BaseException):
            self.error = item
        else:
            self.chunks.append(item)
        if isinstance(item, BaseException) or item.finish_reason is not None:
            self.ended = True
            self._cond.notify_all()  # readers still waiting: nothing more will come
            waiters, self._waiters = self._waiters, []
            _wake(waiters)
        return item

    def get(self, timeout: float | None = None) -> CompletionChunk | BaseException | None:
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._items) or self.ended, timeout):
                raise TimeoutError(f"no chunk within {timeout} s")
            return self._pop()

    async def aget(self) -> CompletionChunk | BaseException | None:
        while True:
            loop = asyncio.get_running_loop()
            with self._cond:
                if self._items or self.ended:
                    return self._pop()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            await fut


def _wake(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    for loop, fut in waiters:
        with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits any more
            loop.call_soon_threadsafe(_wake_future, fut)


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
    failure in the model) are raised from the iteration.

    Where it is on its way (time.perf_counter, for a live view): `started` (it arrived; its
    tokenizing follows), `admitted` (its context was reserved: the queue is behind it) and
    `prefilled` (the forward pass holding its prompt's last token ended), None until then;
    its Timings give the first token (ttft_s) and the end (total_s). `label`: a name the
    caller may give it (the server puts its completion id there)."""

    def __init__(self, engine: Engine, request: Request, n_ctx: int, submitted: float,
                 started: float | None = None) -> None:
        self.request = request
        self.n_ctx = n_ctx  # the size of the KV cache it reserves
        self.submitted = submitted
        self.started = submitted if started is None else started
        self.admitted: float | None = None
        self.prefilled: float | None = None
        self.label: str | None = None
        self._engine = engine
        self._channel = _Channel()

    @property
    def finished(self) -> bool:
        """All chunks have been read."""
        return self._channel.ended

    def cancel(self) -> None:
        self.request.cancel_token.cancel()
        self._engine._wake()

    def _take(self, item: CompletionChunk | BaseException | None) -> CompletionChunk | None:
        """A chunk read, or None once the last one has been read (here or by another reader);
        the error the request ended with is raised to every reader."""
        if isinstance(item, BaseException):
            raise item
        if item is None and self._channel.error is not None:
            # A copy for each later reader (threads may share the first): the original's
            # traceback stays its own, chained here as the cause.
            err = self._channel.error
            try:
                again = copy.copy(err)
            except Exception:  # one that cannot be copied is raised as it is
                raise err from None
            raise again from err
        return item

    def __iter__(self) -> Iterator[CompletionChunk]:
        return self

    def __next__(self) -> CompletionChunk:
        chunk = self._take(self._channel.get())
        if chunk is None:
            raise StopIteration
        return chunk

    def __aiter__(self) -> AsyncIterator[CompletionChunk]:
        return self

    async def __anext__(self) -> CompletionChunk:
        chunk = self._take(await self._channel.aget())
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    def result(self, timeout: float | None = None) -> Completion:
        """The whole completion, waiting for it to finish (TimeoutError after `timeout`
        seconds without a chunk). Chunks read by iterating it, here or in another thread,
        are part of it."""
        while self._take(self._channel.get(timeout)) is not None:
            pass
        return self.request.completion(self._channel.chunks)

    async def aresult(self) -> Completion:
        while self._take(await self._channel.aget()) is not None:
            pass
        return self.request.completion(self._channel.chunks)


# ---- the scheduler's view of a running sequence


class _Seq:
    __slots__ = ("ctx", "guess", "handle", "lend_n", "lender", "lookup", "next_token", "passed", "prefill",
                 "prefill_at", "prefill_s", "req", "tokens")

    def __init__(self, handle: RequestHandle, ctx: Context, cached: int, lender: _Seq | None = None,
                 lend_n: int = 0, lookup: PromptLookup | None = None) -> None:
        self.handle = handle
        self.req = handle.request
        self.ctx = ctx
        self.prefill = self.req.prefill_ids()
        self.prefill_at = cached  # prompt tokens in the cache so far (a reused prefix first)
        self.prefill_s = 0.0
        self.next_token: int | None = None  # sampled, to be evaluated by the next step
        self.tokens: list[int] = self.prefill[:cached]  # what ctx holds, position by position
        # A sequence still prefilling the first lend_n tokens of this prompt: this one waits
        # for them and copies them, rather than evaluating the same tokens beside it.
        self.lender = lender
        self.lend_n = lend_n
        self.passed = 0  # steps in a row this prefilling sequence got less than a whole chunk
        # Speculative decoding by prompt lookup (pyinfer.lookup): the drafts' source, and the
        # tokens guessed to follow next_token in this step
        self.lookup = lookup
        if lookup is not None:
            lookup.extend(self.prefill)
        self.guess: list[int] = []


class Engine:
    """Many requests on one model: a scheduler thread batching their decode steps.

    max_batch: sequences running at once (prefilling or decoding). token_budget: the
    largest prompt chunk evaluated in one step. kv_budget_bytes: memory for the sequences'
    contexts, each counted whole (KV cache and forward-pass scratch, Model.context_nbytes),
    those reserved by running sequences and those kept idle for reuse (None: half the memory
    available now). max_queue: requests that may wait for admission before submit raises
    OverloadedError. max_defer: steps a prompt with more tokens left than others may be
    passed over before it goes first. ctx_granularity: a reservation is rounded up to this many tokens, so
    that freed caches fit later requests. on_finish: called on the scheduler thread with
    each finished Request (for metrics; it must be quick and must not raise). recent: how
    many of the latest requests `recent()` keeps (a live view's rows).

    The model must not be used by anything else while the engine runs (its contexts are
    the engine's, but decode_batch's scratch is shared).
    """

    def __init__(
        self,
        model: Model,
        *,
        max_batch: int = 16,
        token_budget: int = TOKEN_BUDGET,
        kv_budget_bytes: int | None = None,
        max_queue: int = 64,
        max_defer: int = 4,
        ctx_granularity: int = 256,
        prefix_cache: bool = True,
        prefix_block: int = 16,
        on_finish: Callable[[Request], None] | None = None,
        recent: int = 64,
        draft: int | None = None,
    ) -> None:
        self.model = model
        # Speculative decoding by prompt lookup: up to `draft` guessed tokens per sequence
        # per step (None: DEFAULT_DRAFT on the fast path, else off), as Model.generate does.
        if draft is None:
            draft = DEFAULT_DRAFT if model.precision == "fast" else 0
        if isinstance(draft, bool) or not isinstance(draft, int) or not 0 <= draft <= 64:
            raise ValueError(f"draft must be an int in [0, 64], got {draft!r}")
        self.draft = draft
        self._costs = PassCosts()  # the steps' costs by decode rows, which the drafts weigh
        self.n_ctx = int(model.n_ctx)
        self.max_batch = _positive("max_batch", max_batch)
        self.token_budget = _positive("token_budget", token_budget)
        self.max_queue = _positive("max_queue", max_queue)
        self.max_defer = _positive("max_defer", max_defer)
        self.ctx_granularity = _positive("ctx_granularity", ctx_granularity)
        if kv_budget_bytes is None:
            kv_budget_bytes = available_memory_bytes() // 2
        self.kv_budget_bytes = _positive("kv_budget_bytes", kv_budget_bytes)
        # A budget that holds not even the smallest context would refuse every request as if
        # each asked too much: the configuration is what is wrong.
        smallest = self.context_bytes_for(min(self.ctx_granularity, self.n_ctx))
        if smallest > self.kv_budget_bytes:
            raise ValueError(f"kv_budget_bytes = {self.kv_budget_bytes} holds no context: the smallest "
                             f"({min(self.ctx_granularity, self.n_ctx)} tokens) takes {smallest} bytes")
        self.prefix_cache = bool(prefix_cache)
        self.prefix_block = _positive("prefix_block", prefix_block)
        self.on_finish = on_finish
        # One forward pass per step: a row for each decoding sequence, up to token_budget
        # prompt tokens of the prefilling ones.
        self._batch = Batch(model, self.max_batch + self.token_budget)

        self._cond = threading.Condition(threading.Lock())
        self._waiting: deque[RequestHandle] = deque()
        self._running: list[_Seq] = []
        # Finished sequences' contexts, least recently used first, with the tokens they hold.
        self._idle: OrderedDict[Context, list[int]] = OrderedDict()
        self._bytes_in_use = 0  # contexts of running sequences, as context_bytes_for counts them
        self._bytes_idle = 0
        self._closed = False
        self._batch_size = 0
        self._steps = 0
        self._decode_rows = 0
        self._finished = 0
        self._prompt_total = 0
        self._predicted_total = 0
        self._cached_total = 0
        self._prefix_hits = 0
        # (running, waiting): the most at once since peaks() last read them, raised where each
        # count grows, so a queue that forms and drains between two reads is still seen.
        self._peaks = (0, 0)
        self._jobs: deque[tuple[Callable[[], Any], Future[Any]]] = deque()  # run between steps
        self._recent: deque[RequestHandle] = deque(maxlen=_positive("recent", recent))
        self._thread = threading.Thread(target=self._loop, name="pyinfer-engine", daemon=True)
        self._thread.start()

    # -- submitting

    def context_bytes_for(self, n_ctx: int) -> int:
        """The bytes a sequence's context of n_ctx tokens allocates: its KV cache (and one
        row of scratch of its own: the engine's steps run in one shared batch)."""
        return int(self.model.context_nbytes(n_ctx, 1))

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
        ids, params, constraint = prompt_and_params(
            prompt,
            self.model.tokenizer,
            lambda text: self.model.tokenize(text, add_bos=add_bos, special=special),
            sampling,
            "submit",
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
            constraint=constraint,
            started=t0,
            tokenize_s=perf_counter() - t0,
        )
        need = self.context_bytes_for(n_ctx)
        if need > self.kv_budget_bytes:
            raise ValueError(  # worded from max_tokens, so that the server names that field
                f"max_tokens with the prompt asks for a context of {n_ctx} tokens ({need} bytes of KV "
                f"cache and scratch), more than the engine's budget of {self.kv_budget_bytes} bytes: "
                "lower max_tokens"
            )
        handle = RequestHandle(self, req, n_ctx, perf_counter(), t0)
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
            self._raise_peaks()
            self._recent.append(handle)
            self._cond.notify()
        return handle

    def embed(self, texts: str | Sequence[str] | Sequence[Sequence[int]], **kwargs: Any) -> Future[np.ndarray]:
        """Model.embed(texts, **kwargs) run on the scheduler thread between two steps (the
        model is the engine's; one job between two steps, so a caller with much to embed
        splits it): a Future of the embeddings, which cancel() drops while it waits."""
        fut: Future[np.ndarray] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._jobs.append((lambda: self.model.embed(texts, **kwargs), fut))
            self._cond.notify()
        return fut

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
                cached_tokens_total=self._cached_total,
                prefix_hits=self._prefix_hits,
                batch_scratch_bytes=self._batch.nbytes,
            )

    def peaks(self) -> tuple[int, int]:
        """(running, waiting): the most sequences running and requests waiting at once since
        the last call (or the engine's start), counted as the engine changes them, not
        sampled; the next call's count starts from the counts now. For one reader (the live
        view's History)."""
        with self._cond:
            peaks = self._peaks
            self._peaks = (len(self._running), len(self._waiting))
            return peaks

    def _raise_peaks(self) -> None:
        """Fold the counts now into the peaks (with self._cond held)."""
        self._peaks = (max(self._peaks[0], len(self._running)), max(self._peaks[1], len(self._waiting)))

    def recent(self) -> list[RequestHandle]:
        """The latest submitted requests (up to `recent` of them), oldest first: waiting,
        running or finished."""
        with self._cond:
            return list(self._recent)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running(self) -> bool:
        """Whether the scheduler thread is alive (it stops on close, or on a failure of its own)."""
        return self._thread.is_alive()

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
                    self._cond.wait_for(lambda: self._closed or bool(self._waiting or self._running or self._jobs))
                    if self._closed:
                        break
                    # One job between two steps: the running sequences wait for one, not for
                    # every job queued (a big embeddings request comes as many).
                    job = self._jobs.popleft() if self._jobs else None
                if job is not None and job[1].set_running_or_notify_cancel():
                    fn, fut = job
                    try:
                        fut.set_result(fn())
                    except Exception as e:
                        fut.set_exception(e)
                if self._waiting or self._running:
                    self._step()
        except BaseException as e:  # a bug in the scheduler: fail every request, not hang them
            self._closed = True
            self._fail_all(RuntimeError(f"the engine stopped: {e!r}"))
            raise
        self._cancel_all()

    def _step(self) -> None:
        self._drop_cancelled()
        # Waiting sequences copy their lenders' prefixes before admission may reuse a lender's
        # idle context for someone else.
        self._borrow()
        self._admit()
        # One forward pass: the last sampled token of every decoding sequence, then prompt
        # chunks of the prefilling ones, up to token_budget tokens: those passed over for
        # max_defer steps first, oldest first; then the fewest tokens left first (admission
        # order on ties; the sort is stable).
        rows: list[tuple[_Seq, list[int]]] = []
        budget = self.token_budget
        base_rows, base_tokens = 0, 0.0
        for s in self._running:
            if s.next_token is None:
                continue
            s.guess = []
            if s.lookup is not None and budget > 0:
                s.lookup.extend([s.next_token])
                # The drafts share the step with the others' rows, and their rows come out of
                # the prompt chunks' budget.
                room = min(budget, s.ctx.n_ctx - s.ctx.n_past - 1)
                s.guess, gain = s.lookup.draft_in_batch(room, base_rows, base_tokens)
                budget -= len(s.guess)
                base_tokens += gain
            elif s.lookup is not None:
                s.lookup.extend([s.next_token])
                base_tokens += 1
            base_rows += 1 + len(s.guess)
            rows.append((s, [s.next_token, *s.guess]))
        n_decode = len(rows)
        prefilling = [s for s in self._running if s.next_token is None and s.lender is None]
        prefilling.sort(key=lambda s: (0, 0) if s.passed >= self.max_defer else (1, len(s.prefill) - s.prefill_at))
        for s in prefilling:
            left = len(s.prefill) - s.prefill_at
            chunk = s.prefill[s.prefill_at : s.prefill_at + budget]
            # Passed over: less than a whole chunk (what is left, up to the budget).
            s.passed = 0 if len(chunk) == min(left, self.token_budget) else s.passed + 1
            if chunk:
                rows.append((s, chunk))
                budget -= len(chunk)
        if rows:
            self._run(rows, n_decode)
        with self._cond:
            self._steps += 1

    def _run(self, rows: list[tuple[_Seq, list[int]]], n_decode: int) -> None:
        n_logits = [1 + len(s.guess) if s.next_token is not None else 1 for s, _ in rows]
        t = perf_counter()
        try:
            logits = self._batch.step([s.ctx for s, _ in rows], [toks for _, toks in rows],
                                      n_logits if any(k > 1 for k in n_logits) else None)
        except BaseException as e:
            for s, _ in rows:
                self._end(s, None, error=e)
            return
        t_end = perf_counter()
        dt = t_end - t
        with self._cond:
            self._batch_size = len(rows)
            self._decode_rows += n_decode
        if n_decode == len(rows):  # a step of decode rows alone: what the drafts weigh
            self._costs.observe(sum(n_logits), dt)
        at = 0
        for (s, toks), k in zip(rows, n_logits):
            row = logits[at]
            at += k
            s.tokens += toks
            if s.next_token is not None:
                if s.guess:
                    self._verify(s, logits[at - k : at], dt)
                else:
                    self._sample(s, row, dt)
                continue
            s.prefill_s += dt
            s.prefill_at += len(toks)
            if s.prefill_at == len(s.prefill):
                s.handle.prefilled = t_end
                with self._cond:
                    self._prompt_total += s.req.timings.prompt_tokens
                self._sample(s, row, s.prefill_s)

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

    def _block_prefix(self, tokens: list[int], prompt: list[int]) -> int:
        """Tokens of prompt that tokens can serve from a cache: their common prefix in whole
        prefix_block blocks, short of the prompt's last token (whose logits the first step
        needs)."""
        limit = (len(prompt) - 1) // self.prefix_block * self.prefix_block
        return min(common_prefix(tokens, prompt), limit) // self.prefix_block * self.prefix_block

    def _prefix_source(self, prompt: list[int]) -> tuple[Context | None, int]:
        """The context (running or idle) holding the longest prefix of prompt, in whole
        prefix_block blocks and short of the prompt's last token (whose logits the first
        step needs), and that length; (None, 0) when none holds a block."""
        if not self.prefix_cache:
            return None, 0
        best: Context | None = None
        best_n = 0
        if len(prompt) <= self.prefix_block:
            return None, 0
        candidates = [(s.ctx, s.tokens) for s in self._running] + list(self._idle.items())
        for ctx, toks in candidates:
            n = self._block_prefix(toks, prompt)
            if n > best_n:
                best, best_n = ctx, n
        return best, best_n

    def _prefix_lender(self, prompt: list[int], cached: int) -> tuple[_Seq | None, int]:
        """The running sequence still prefilling the longest prefix of prompt past `cached`
        tokens (in whole blocks, short of the last token), and that length; (None, 0) if
        none would add a block."""
        if not self.prefix_cache:
            return None, 0
        best: _Seq | None = None
        best_n = cached
        for s in self._running:
            if s.next_token is None:
                n = self._block_prefix(s.prefill, prompt)
                if n > best_n and n > s.prefill_at:
                    best, best_n = s, n
        return (best, best_n) if best is not None else (None, 0)

    def _borrow(self) -> None:
        """Sequences waiting for a lender's prefix: once it holds it (or is gone), copy the
        longest cached prefix there is and go on prefilling from there."""
        for s in self._running:
            a = s.lender
            if a is None:
                continue
            if a in self._running and a.next_token is None and a.prefill_at < s.lend_n:
                continue  # the lender is still on its way there
            s.lender = None
            src, cached = self._prefix_source(s.prefill)
            if src is None or cached <= s.prefill_at:
                continue
            try:
                s.ctx.copy_prefix(src, cached)
            except BaseException as e:
                self._end(s, None, error=e)
                return
            if src in self._idle:
                self._idle.move_to_end(src)  # a prefix in use stays cached longest
            self._record_cached(s.req, len(s.prefill), cached)
            s.prefill_at = cached
            s.tokens = s.prefill[:cached]

    def _record_cached(self, req: Request, n_prompt: int, cached: int) -> None:
        """req now starts from `cached` tokens of a cached prefix (more than it had): its
        timings and the prefix-cache counters say so."""
        tm = req.timings
        with self._cond:
            if cached and tm.cached_tokens == 0:
                self._prefix_hits += 1
            self._cached_total += cached - tm.cached_tokens
        tm.cached_tokens = cached
        tm.prompt_tokens = n_prompt - cached

    def _admit(self) -> None:
        while True:
            with self._cond:
                if not self._waiting or len(self._running) >= self.max_batch:
                    return
                h = self._waiting[0]
            prompt = h.request.prefill_ids()
            src, cached = self._prefix_source(prompt)
            lender, lend_n = self._prefix_lender(prompt, cached)
            need = self.context_bytes_for(h.n_ctx)
            with self._cond:
                # An idle context of the right size: the source itself if it is one, else
                # the least recently used; else room for a new one, freeing idle contexts
                # (least recently used first, the source last).
                ctx = src if src is not None and src in self._idle and src.n_ctx == h.n_ctx else None
                if ctx is None:
                    ctx = next((c for c in self._idle if c.n_ctx == h.n_ctx and c is not src), None)
                if ctx is None:
                    while self._idle and self._bytes_in_use + self._bytes_idle + need > self.kv_budget_bytes:
                        victim = next((c for c in self._idle if c is not src), None)
                        if victim is None:  # only the source is left to free
                            victim, src, cached = src, None, 0
                        assert victim is not None
                        del self._idle[victim]
                        self._bytes_idle -= self._ctx_bytes(victim)
                    if self._bytes_in_use + self._bytes_idle + need > self.kv_budget_bytes:
                        return  # it waits for a running sequence to finish
                else:
                    del self._idle[ctx]
                    self._bytes_idle -= need
                self._waiting.popleft()
                self._bytes_in_use += need
            try:
                if ctx is None:
                    ctx = self.model.context(h.n_ctx, n_batch=1)
                if src is not None and cached:
                    ctx.copy_prefix(src, cached)  # src may be ctx: then a truncation
                else:
                    ctx.reset()
            except BaseException as e:
                with self._cond:
                    self._bytes_in_use -= need
                h._channel.put(e)
                continue
            if src is not None and src in self._idle:
                self._idle.move_to_end(src)  # a prefix in use stays cached longest
            tm = h.request.timings
            tm.cached_tokens = 0
            self._record_cached(h.request, len(prompt), cached)
            # The wait for admission is queueing too.
            h.admitted = perf_counter()
            tm.queue_s += h.admitted - h.submitted
            with self._cond:
                lookup = PromptLookup(max_draft=self.draft, costs=self._costs) if self.draft else None
                self._running.append(_Seq(h, ctx, cached, lender, lend_n, lookup))
                self._raise_peaks()

    def _sample(self, s: _Seq, logits: np.ndarray, eval_s: float) -> None:
        try:
            r = s.req.step(logits, eval_s=eval_s)
        except BaseException as e:
            self._end(s, None, error=e)
            return
        self._advance(s, r)

    def _advance(self, s: _Seq, r: StepResult) -> None:
        """After s's last row: end it, or send its text and keep the token for the next step."""
        if r.finished:
            self._end(s, r.chunk)
            return
        if r.chunk is not None:
            self._deliver(s.handle, r.chunk)
        s.next_token = r.token

    def _verify(self, s: _Seq, rows: np.ndarray, eval_s: float) -> None:
        """Sample from the rows of next_token and its guessed successors in turn, while each
        token sampled is the guess the next row was computed after; the cache then keeps only
        the tokens kept (as pyinfer.generate's driver does for one sequence)."""
        guess, lookup = s.guess, s.lookup
        assert lookup is not None
        start = len(s.tokens) - len(rows)  # where next_token went
        kept = 0
        r = None
        try:
            for i, row in enumerate(rows):
                r = s.req.step(row, eval_s=eval_s if i == 0 else 0.0)
                if r.finished or i == len(guess) or r.token != guess[i] or s.req.cancelled:
                    break
                kept += 1
                lookup.extend([guess[i]])
                if r.chunk is not None:
                    self._deliver(s.handle, r.chunk)
        except BaseException as e:
            self._end(s, None, error=e)
            return
        finally:
            lookup.kept(len(guess), kept)
            s.req.timings.draft_tokens += len(guess)
            s.req.timings.draft_accepted += kept
            del s.tokens[start + 1 + kept :]
            s.ctx.truncate(start + 1 + kept)
            s.guess = []
        assert r is not None
        self._advance(s, r)

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
        """Take s out of the batch, keep its context idle (with the tokens it holds, for
        prefix reuse) and send its last chunk (or the error: then the context is dropped)."""
        nbytes = self._ctx_bytes(s.ctx)
        with self._cond:
            self._running.remove(s)
            self._bytes_in_use -= nbytes
            if error is None:
                self._idle[s.ctx] = s.tokens
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
            jobs = list(self._jobs)
            self._jobs.clear()
        for _, fut in jobs:
            fut.cancel()

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            handles = list(self._waiting) + [s.handle for s in self._running]
            self._waiting.clear()
            self._running.clear()
            self._bytes_in_use = 0
        for h in handles:
            h._channel.put(error)
