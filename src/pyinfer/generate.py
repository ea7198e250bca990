"""The single-sequence driver: a Request (see `request`) run on one context, prefill in
chunks of n_batch tokens, then one token evaluated per step, with streaming, stop strings,
logprobs, cancellation, timings and finish reasons all kept by the Request.

It drives any context that follows the small `SequenceContext` protocol below, so the
model's forward pass stays apart from generation logic. `model_generate` and `model_chat`,
behind Model.generate and Model.chat, also own the idle contexts those calls reuse.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, overload

import numpy as np

from pyinfer.lookup import PassCosts, PromptLookup
from pyinfer.request import (
    CancelToken,
    Completion,
    CompletionChunk,
    FinishReason,
    LogitsHook,
    Request,
    StopHook,
    Timings,
    check_flag,
    prompt_and_params,
)
from pyinfer.sampling import SamplingParams
from pyinfer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from pyinfer.constraint import Constraint
    from pyinfer.model import Context, Model

__all__ = [
    "CancelToken",
    "Completion",
    "CompletionChunk",
    "ContextPool",
    "DraftingContext",
    "FinishReason",
    "SequenceContext",
    "Timings",
    "context_pool",
    "generate",
    "model_chat",
    "model_generate",
]


class SequenceContext(Protocol):
    """One sequence's state in a model, as the driver uses it: its KV cache and position."""

    @property
    def n_past(self) -> int:
        """Tokens in the KV cache."""
        ...

    @property
    def n_ctx(self) -> int:
        """Tokens the KV cache can hold."""
        ...

    def eval(self, ids: list[int]) -> np.ndarray:
        """Run `ids` at positions n_past.., append them to the cache (n_past grows by
        len(ids)) and return the float32 logits row (n_vocab,) of the last one."""
        ...

    def reset(self) -> None:
        """Empty the cache (n_past = 0)."""
        ...


class DraftingContext(SequenceContext, Protocol):
    """A context that speculative decoding can drive: every row of a pass, and a truncation
    (Context is one)."""

    def eval(self, ids: list[int], *, all_logits: bool = False, out: np.ndarray | None = None) -> np.ndarray:
        """As SequenceContext.eval; with all_logits, the rows of every id [len(ids), n_vocab],
        written into `out` (of that shape, float32) when given."""
        ...

    def truncate(self, n: int) -> None:
        """Forget positions >= n."""
        ...


# ---- one sequence


@overload
def generate(
    ctx: SequenceContext,
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int] | np.ndarray,
    params: SamplingParams | None = None,
    *,
    max_tokens: int | None = None,
    stop: str | Sequence[str] | None = None,
    stream: Literal[False] = False,
    cancel: CancelToken | None = None,
    n_batch: int = 512,
    truncate: Literal["left"] | None = None,
    special: bool = False,
    constraint: Constraint | None = None,
    logits_processor: LogitsHook | None = None,
    stopping_criteria: StopHook | None = None,
    started: float | None = None,
    tokenize_s: float = 0.0,
    draft: int = 0,
) -> Completion: ...


@overload
def generate(
    ctx: SequenceContext,
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int] | np.ndarray,
    params: SamplingParams | None = None,
    *,
    max_tokens: int | None = None,
    stop: str | Sequence[str] | None = None,
    stream: Literal[True],
    cancel: CancelToken | None = None,
    n_batch: int = 512,
    truncate: Literal["left"] | None = None,
    special: bool = False,
    constraint: Constraint | None = None,
    logits_processor: LogitsHook | None = None,
    stopping_criteria: StopHook | None = None,
    started: float | None = None,
    tokenize_s: float = 0.0,
    draft: int = 0,
) -> Iterator[CompletionChunk]: ...


def generate(
    ctx: SequenceContext,
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int] | np.ndarray,
    params: SamplingParams | None = None,
    *,
    max_tokens: int | None = None,
    stop: str | Sequence[str] | None = None,
    stream: bool = False,
    cancel: CancelToken | None = None,
    n_batch: int = 512,
    truncate: Literal["left"] | None = None,
    special: bool = False,
    constraint: Constraint | None = None,
    logits_processor: LogitsHook | None = None,
    stopping_criteria: StopHook | None = None,
    started: float | None = None,
    tokenize_s: float = 0.0,
    draft: int = 0,
) -> Completion | Iterator[CompletionChunk]:
    """Continue `ctx` with `prompt_ids`, then generate until a stop condition.

    The prompt is evaluated at the context's current position (n_past) in chunks of
    n_batch tokens; pass a fresh or reset context to start a new sequence. The caller owns
    the context: after a generation ends, is cancelled or its stream is closed, the cache
    holds the prompt and the tokens evaluated so far (the last sampled token is not
    evaluated).

    stream=True returns an iterator of CompletionChunk (text only at character
    boundaries, a possible stop string held back); closing it stops the loop at once.
    The other keywords are the Request's: max_tokens (None: until an end-of-turn token or
    a full context; 0: prefill only), stop, cancel, truncate="left", special, constraint
    (pyinfer.constraint), logits_processor, stopping_criteria, started and tokenize_s.
    draft > 0: speculative decoding by prompt lookup (`pyinfer.lookup`), up to `draft`
    tokens guessed per pass, verified in one forward pass; ctx must be a DraftingContext.
    The tokens are those of plain decoding when the context's rows do not depend on the
    pass they are in (precision="fast"); the cache then also holds only the tokens kept.

    Errors (raised here, before anything runs, also with stream=True): an empty prompt,
    ids out of range, parameters of the wrong type or range, ContextOverflowError.
    """
    if isinstance(n_batch, bool) or not isinstance(n_batch, (int, np.integer)) or n_batch < 1:
        raise ValueError(f"n_batch must be an int >= 1, got {n_batch!r}")
    check_flag("stream", stream)
    req = Request(
        tokenizer,
        prompt_ids,
        params,
        n_ctx=int(ctx.n_ctx),
        n_past=int(ctx.n_past),
        max_tokens=max_tokens,
        stop=stop,
        cancel=cancel,
        truncate=truncate,
        special=special,
        constraint=constraint,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        started=started,
        tokenize_s=tokenize_s,
    )
    lookup = _lookup(draft)
    chunks = _drive(ctx, req, int(n_batch), lookup)
    return chunks if stream else req.completion(chunks)


def _lookup(draft: int, costs: PassCosts | None = None) -> PromptLookup | None:
    if isinstance(draft, bool) or not isinstance(draft, (int, np.integer)) or not 0 <= draft <= 64:
        raise ValueError(f"draft must be an int in [0, 64], got {draft!r}")
    return PromptLookup(max_draft=int(draft), costs=costs) if draft else None


def _drive(
    ctx: SequenceContext, req: Request, n_batch: int, lookup: PromptLookup | None = None
) -> Generator[CompletionChunk, None, None]:
    # prefill, a chunk at a time so that a cancel waits for one chunk at most
    ids = req.prefill_ids()
    spent = 0.0
    logits = None
    for i in range(0, len(ids), n_batch):
        if req.cancelled:
            r = req.abort(eval_s=spent)
            assert r.chunk is not None
            yield r.chunk
            return
        t = perf_counter()
        logits = ctx.eval(ids[i : i + n_batch])
        spent += perf_counter() - t
    assert logits is not None
    if lookup is not None:
        lookup.extend(ids)
    r = req.step(logits, eval_s=spent)
    rows_buf: np.ndarray | None = None  # a pass's rows, reused from pass to pass
    while True:
        if r.chunk is not None:
            yield r.chunk
        if r.finished:
            break
        if req.cancelled:  # a consumer of the stream, or another thread, cancelled
            r = req.abort()
            continue
        tok = r.token
        assert tok is not None
        guess = [] if lookup is None else _guess(lookup, tok, ctx)
        t = perf_counter()
        if not guess:
            logits = ctx.eval([tok])
            eval_s = perf_counter() - t
            if lookup is not None:
                lookup.passed(1, eval_s)
            r = req.step(logits, eval_s=eval_s)
            continue
        # The sampled token and the guess in one pass; row i is valid while every guessed
        # token before it is the one sampled.
        assert lookup is not None
        dctx = cast("DraftingContext", ctx)
        start = dctx.n_past
        n = 1 + len(guess)
        if rows_buf is None or len(rows_buf) < n:
            rows_buf = np.empty((1 + lookup.max_draft, logits.shape[-1]), np.float32)
            t = perf_counter()
        rows = dctx.eval([tok, *guess], all_logits=True, out=rows_buf[:n])
        eval_s = perf_counter() - t
        lookup.passed(len(rows), eval_s)
        kept = 0
        for i, row in enumerate(rows):
            r = req.step(row, eval_s=eval_s if i == 0 else 0.0)
            # A token the next row was not computed after ends the pass; the loop above
            # evaluates it (or sees the request finished or cancelled).
            if r.finished or i == len(guess) or r.token != guess[i] or req.cancelled:
                break
            kept += 1
            lookup.extend([guess[i]])
            if r.chunk is not None:
                yield r.chunk
        lookup.kept(len(guess), kept)
        req.timings.draft_tokens += len(guess)
        req.timings.draft_accepted += kept
        dctx.truncate(start + 1 + kept)  # the sampled token and the guesses kept


def _guess(lookup: PromptLookup, token: int, ctx: SequenceContext) -> list[int]:
    """The draft to follow `token` (now joining the sequence), within the context's room."""
    lookup.extend([token])
    return lookup.draft(room=ctx.n_ctx - ctx.n_past - 1)


# ---- Model.generate and Model.chat

# The most tokens guessed per pass by default on the fast path; the lookup sends fewer, or
# none, where the passes' measured costs and the guesses kept so far say more would not pay.
DEFAULT_DRAFT = 8


class ContextPool:
    """Idle contexts of one model, of its n_ctx, reused by model_generate(): allocating a
    KV cache per request would cost more than a short prompt's prefill."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.costs = PassCosts()  # its passes' costs by row count, which the drafts' lengths weigh
        self._idle: list[Context] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Contexts idle now."""
        return len(self._idle)

    def acquire(self) -> Context:
        """An empty context: an idle one, else a new one."""
        with self._lock:
            ctx = self._idle.pop() if self._idle else None
        if ctx is None:
            ctx = self.model.context()
        ctx.reset()
        return ctx

    def release(self, ctx: Context) -> None:
        ctx.reset()
        with self._lock:
            self._idle.append(ctx)


_POOL_ATTR = "_generate_context_pool"
_pool_lock = threading.Lock()


def context_pool(model: Model) -> ContextPool:
    """The pool model_generate() uses for `model`. It is kept in the model object's
    __dict__ (as functools.cached_property keeps its value), so that it lives and dies with
    the model: a table keyed by model would keep every model alive through the contexts."""
    with _pool_lock:
        pool = model.__dict__.get(_POOL_ATTR)
        if pool is None:
            pool = model.__dict__[_POOL_ATTR] = ContextPool(model)
    assert isinstance(pool, ContextPool)
    return pool


def model_generate(
    model: Model,
    prompt: str | Sequence[int] | np.ndarray,
    *,
    max_tokens: int | None = 256,
    stop: str | Sequence[str] | None = None,
    stream: bool = False,
    add_bos: bool | None = None,
    special: bool = False,
    truncate: Literal["left"] | None = None,
    cancel: CancelToken | None = None,
    started: float | None = None,
    draft: int | None = None,
    **sampling: Any,
) -> Completion | Iterator[CompletionChunk]:
    """Continue a prompt (text, or token ids) in a fresh sequence of `model`: what
    Model.generate does.

    sampling: SamplingParams' fields (temperature, top_k, top_p, min_p, repeat_penalty,
    presence_penalty, frequency_penalty, repeat_last_n, logit_bias, seed, logprobs), with
    its defaults, which are llama.cpp's; temperature=0 is greedy. max_tokens=None runs
    until an end-of-turn token or a full context (finish_reason "length"). stop: strings
    that end the text (not returned). stream=True returns an iterator of chunks whose text
    ends only at whole characters; closing it stops generation. special: parse
    control-token texts in a text prompt (and print them in the output). A prompt longer
    than n_ctx raises ContextOverflowError unless truncate="left". started: when the
    request arrived (time.perf_counter()), so timings count the wait before this call.
    draft: speculative decoding by prompt lookup, up to `draft` tokens guessed per pass
    (0: off; None: DEFAULT_DRAFT with precision="fast", whose output it leaves unchanged,
    else off); Timings.draft_tokens / draft_accepted say how it went.
    """
    if started is None:
        started = perf_counter()
    check_flag("stream", stream)
    check_flag("special", special)  # before the prompt is tokenized with it
    ids, params, constraint = prompt_and_params(
        prompt, model.tokenizer, lambda text: model.tokenize(text, add_bos=add_bos, special=special), sampling,
        "generate",
    )
    if draft is None:
        draft = DEFAULT_DRAFT if model.precision == "fast" else 0
    pool = context_pool(model)
    lookup = _lookup(draft, pool.costs)
    tokenizer = model.tokenizer
    ctx = pool.acquire()
    try:
        req = Request(
            tokenizer,
            ids,
            params,
            n_ctx=ctx.n_ctx,
            max_tokens=max_tokens,
            stop=stop,
            cancel=cancel,
            truncate=truncate,
            special=special,
            constraint=constraint,
            started=started,
            tokenize_s=perf_counter() - started,
        )
    except BaseException:
        pool.release(ctx)
        raise
    if not stream:
        try:
            return req.completion(_drive(ctx, req, ctx.n_batch, lookup))
        finally:
            pool.release(ctx)

    def chunks() -> Iterator[CompletionChunk]:
        it = _drive(ctx, req, ctx.n_batch, lookup)
        try:
            yield from it
        finally:
            it.close()
            pool.release(ctx)

    return chunks()


def model_chat(
    model: Model, messages: Sequence[Mapping[str, Any]], **kwargs: Any
) -> Completion | Iterator[CompletionChunk]:
    """Reply to a conversation: messages ({"role": ..., "content": ...}) rendered with the
    model's chat template and an assistant header; the same keywords as model_generate().
    What Model.chat does."""
    started = kwargs.pop("started", None) or perf_counter()
    ids = model.chat_template.encode(model.tokenizer, messages, add_generation_prompt=True)
    # Rendering and tokenizing the conversation count as the request's tokenize time.
    return model_generate(model, ids, started=started, **kwargs)
