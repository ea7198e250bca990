"""The decode loop: chunked prefill, sampling, stop conditions (end-of-turn tokens, stop
strings, max_tokens, a full context), text streamed at character boundaries, cancellation,
and the timing of every part of a request.

It drives any context that follows the small `Context` protocol below, so the model's
forward pass stays apart from generation logic.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Literal, Protocol, overload

import numpy as np

from pyinfer.errors import ContextOverflowError, ParameterTypeError
from pyinfer.sampling import Sampler, SamplingParams, TokenLogprob
from pyinfer.tokenizer import Tokenizer

FinishReason = Literal["stop", "length", "cancelled"]


class Context(Protocol):
    """One sequence's state in a model: its KV cache and position."""

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


class CancelToken:
    """Stops a generation from another thread: `cancel()` takes effect before the next
    decode step or prefill chunk, and the generation ends with finish_reason "cancelled"."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@dataclass
class Timings:
    """Where a request's time went, in seconds (time.perf_counter).

    The clock starts at `started` when the caller passes it (the moment the request
    arrived), else when generate() was called. ttft_s: from then to the first token
    sampled. token_intervals_s[0] = ttft_s, then the time between consecutive tokens (a
    decode step, the sampling, and whatever the consumer of a stream did in between).
    eval_s and sample_s split the decode time between the model and the sampler; the rest
    of decode_s is the loop's own overhead.
    """

    queue_s: float = 0.0  # before generate() was called, less tokenize_s
    tokenize_s: float = 0.0  # as reported by the caller
    prefill_s: float = 0.0  # ctx.eval over the prompt
    ttft_s: float | None = None  # None when no token was sampled
    decode_s: float = 0.0  # from the first token sampled to the last
    eval_s: float = 0.0  # ctx.eval during decode
    sample_s: float = 0.0  # the sampler, over all tokens (logprobs included)
    total_s: float = 0.0
    prompt_tokens: int = 0  # evaluated in prefill
    sampled_tokens: int = 0  # an end-of-turn token included
    token_intervals_s: list[float] = field(default_factory=list)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second of decode (llama.cpp's eval rate)."""
        n = self.sampled_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


@dataclass
class CompletionChunk:
    """A piece of a streamed completion.

    token_ids: the tokens sampled since the previous chunk (text held back, an unfinished
    character or a possible stop string, may leave a chunk's text short of them). The last
    chunk carries finish_reason, stop_reason and timings.
    """

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    timings: Timings | None = None


@dataclass
class Completion:
    """A finished completion.

    token_ids: every token generated, the ones that spelled a stop string included, an
    end-of-turn token excluded; logprobs (when asked for) match them one to one. text
    excludes the stop string and anything after it. finish_reason: "stop" (an end-of-turn
    token or a stop string; stop_reason says which: the token id or the string), "length"
    (max_tokens, or the context is full), "cancelled". prompt_tokens: evaluated, after
    truncation; truncated_tokens: dropped from the prompt's start (truncate="left").
    """

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    stop_reason: str | int | None
    logprobs: list[TokenLogprob] | None
    prompt_tokens: int
    truncated_tokens: int
    timings: Timings
    seed: int | None  # the sampler's seed (None when greedy): repeats a seed=None run


# ---- argument checks


def _prompt_list(prompt_ids: Sequence[int] | np.ndarray, n_vocab: int) -> list[int]:
    if isinstance(prompt_ids, (str, bytes)):
        raise ParameterTypeError("prompt_ids must be token ids: tokenize the text first")
    if isinstance(prompt_ids, np.ndarray):
        if prompt_ids.ndim != 1 or prompt_ids.dtype.kind not in "iu":
            raise ParameterTypeError(
                f"prompt_ids must be a 1-D integer array, got {prompt_ids.dtype} with shape "
                f"{prompt_ids.shape}"
            )
        ids = prompt_ids.tolist()
    else:
        try:
            ids = [operator.index(i) for i in prompt_ids if not isinstance(i, bool)]
        except TypeError as e:
            raise ParameterTypeError(f"prompt_ids must be a sequence of ints: {e}") from None
        if len(ids) != len(prompt_ids):
            raise ParameterTypeError("prompt_ids must be a sequence of ints, not bools")
    if not ids:
        raise ValueError("the prompt is empty: at least one token is needed to predict the next")
    if min(ids) < 0 or max(ids) >= n_vocab:
        pos, bad = next((p, i) for p, i in enumerate(ids) if not 0 <= i < n_vocab)
        raise ValueError(
            f"prompt token {pos} has id {bad}, out of range for a vocabulary of {n_vocab}"
        )
    return ids


def _stop_list(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    out = []
    for s in stop:
        if not isinstance(s, str):
            raise ParameterTypeError(f"stop strings must be str, not {type(s).__name__}")
        if not s:
            raise ValueError("a stop string is empty: it would stop before the first token")
        out.append(s)
    return out


def _truncate_left(
    ids: list[int], room: int, max_tokens: int | None, keep_first: bool
) -> list[int]:
    """The prompt cut from the left to leave room for max_tokens, but never for more than
    half of the free context; a leading BOS stays when keep_first."""
    reserve = room // 2 if max_tokens is None else min(max_tokens, room // 2)
    keep = max(1, room - reserve)
    if keep_first and keep > 1:
        return ids[:1] + ids[len(ids) - keep + 1 :]
    return ids[len(ids) - keep :]


# ---- stop strings


def _scan(text: str, stops: list[str], final: bool = False) -> tuple[str, str, str | None]:
    """Split decoded text into (safe to emit, held back, stop string found).

    When a stop string occurs, the text before its first occurrence is emitted and the rest
    dropped. Otherwise the longest end of `text` that begins some stop string is held back
    (unless `final`: no more text will come): text that could still become a stop string
    is never emitted.
    """
    at, hit = -1, None
    for s in stops:
        j = text.find(s)
        if j != -1 and (hit is None or j < at):
            at, hit = j, s
    if hit is not None:
        return text[:at], "", hit
    if final:
        return text, "", None
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return text[: len(text) - hold], text[len(text) - hold :], None


# ---- the loop


@overload
def generate(
    ctx: Context,
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
    started: float | None = None,
    tokenize_s: float = 0.0,
) -> Completion: ...


@overload
def generate(
    ctx: Context,
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
    started: float | None = None,
    tokenize_s: float = 0.0,
) -> Iterator[CompletionChunk]: ...


def generate(
    ctx: Context,
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
    started: float | None = None,
    tokenize_s: float = 0.0,
) -> Completion | Iterator[CompletionChunk]:
    """Continue `ctx` with `prompt_ids`, then generate until a stop condition.

    The prompt is evaluated at the context's current position (n_past) in chunks of
    n_batch tokens; pass a fresh or reset context to start a new sequence. The caller owns
    the context: after a generation ends, is cancelled or its stream is closed, the cache
    holds the prompt and the tokens evaluated so far (the last sampled token is not
    evaluated).

    max_tokens: None = until an end-of-turn token or a full context; 0 = prefill only.
    stop: strings that end the generation; neither they nor anything after them is
    returned. stream=True returns an iterator of CompletionChunk (text only at character
    boundaries, a possible stop string held back); closing it stops the loop at once.
    cancel: a CancelToken another thread may trigger. truncate="left": a prompt longer than
    the free context loses its oldest tokens instead of raising ContextOverflowError,
    leaving room for max_tokens (but at most half the free context; None: half) and keeping
    a leading BOS when the tokenizer adds one. special: include control tokens' text in the
    output.
    started, tokenize_s: when the request arrived (perf_counter) and how long tokenizing
    took, so that timings cover the whole request.

    Errors (raised here, before anything runs, also with stream=True): an empty prompt,
    ids out of range, parameters of the wrong type or range, ContextOverflowError.
    """
    t_call = perf_counter()
    if params is None:
        params = SamplingParams()
    elif not isinstance(params, SamplingParams):
        raise ParameterTypeError(f"params must be SamplingParams, not {type(params).__name__}")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
            raise ParameterTypeError(
                f"max_tokens must be an int or None, not {type(max_tokens).__name__}"
            )
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 or None (no limit), got {max_tokens}")
        max_tokens = int(max_tokens)
    if isinstance(n_batch, bool) or not isinstance(n_batch, (int, np.integer)) or n_batch < 1:
        raise ValueError(f"n_batch must be an int >= 1, got {n_batch!r}")
    if truncate not in (None, "left"):
        raise ValueError(f"truncate must be None or 'left', got {truncate!r}")
    if cancel is None:
        cancel = CancelToken()
    elif not isinstance(cancel, CancelToken):
        raise ParameterTypeError(f"cancel must be a CancelToken, not {type(cancel).__name__}")
    stops = _stop_list(stop)
    ids = _prompt_list(prompt_ids, tokenizer.vocab_size)

    n_ctx, n_past = int(ctx.n_ctx), int(ctx.n_past)
    room = n_ctx - n_past
    truncated = 0
    if len(ids) > room:
        if truncate != "left" or room < 1:
            used = f", {n_past} of them already in use" if n_past else ""
            raise ContextOverflowError(
                f"the prompt has {len(ids)} tokens, more than the context holds "
                f"(n_ctx = {n_ctx}{used}): shorten it, load the model with a larger n_ctx, "
                "or pass truncate='left'",
                len(ids),
                n_ctx,
            )
        keep_bos = bool(tokenizer.add_bos) and ids[0] == tokenizer.bos_id
        new = _truncate_left(ids, room, max_tokens, keep_bos)
        truncated = len(ids) - len(new)
        ids = new

    sampler = Sampler(params, tokenizer.vocab_size)
    chunks = _run(
        ctx,
        tokenizer,
        ids,
        sampler,
        max_tokens,
        stops,
        cancel,
        int(n_batch),
        special,
        t_call,
        started,
        tokenize_s,
    )
    if stream:
        return chunks
    text: list[str] = []
    token_ids: list[int] = []
    logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
    last = CompletionChunk("", [])
    for last in chunks:
        text.append(last.text)
        token_ids += last.token_ids
        if logprobs is not None and last.logprobs:
            logprobs += last.logprobs
    assert last.finish_reason is not None and last.timings is not None
    return Completion(
        text="".join(text),
        token_ids=token_ids,
        finish_reason=last.finish_reason,
        stop_reason=last.stop_reason,
        logprobs=logprobs,
        prompt_tokens=len(ids),
        truncated_tokens=truncated,
        timings=last.timings,
        seed=None if params.greedy else sampler.seed,
    )


def _run(
    ctx: Context,
    tokenizer: Tokenizer,
    ids: list[int],
    sampler: Sampler,
    max_tokens: int | None,
    stops: list[str],
    cancel: CancelToken,
    n_batch: int,
    special: bool,
    t_call: float,
    started: float | None,
    tokenize_s: float,
) -> Iterator[CompletionChunk]:
    t0 = t_call if started is None else started
    tm = Timings(
        queue_s=max(0.0, t_call - t0 - tokenize_s),
        tokenize_s=tokenize_s,
        prompt_tokens=len(ids),
    )
    want_lp = sampler.params.logprobs is not None
    reason: FinishReason = "length"
    stop_reason: str | int | None = None

    # prefill, a chunk at a time so that a cancel waits for one chunk at most
    t = perf_counter()
    logits = None
    for i in range(0, len(ids), n_batch):
        if cancel.cancelled:
            tm.prefill_s = perf_counter() - t
            tm.total_s = perf_counter() - t0
            yield CompletionChunk("", [], [] if want_lp else None, "cancelled", None, tm)
            return
        logits = ctx.eval(ids[i : i + n_batch])
    tm.prefill_s = perf_counter() - t
    assert logits is not None

    eot = tokenizer.eot_ids
    decoder = tokenizer.decoder(special=special)
    history = list(ids)  # what the repetition penalties look at
    held = ""  # decoded text not emitted yet: it could still become a stop string
    chunk_ids: list[int] = []
    chunk_lp: list[TokenLogprob] = []
    t_prev = t0
    t_first = t_last = 0.0
    n = 0
    while True:
        if max_tokens is not None and n >= max_tokens:
            break
        if cancel.cancelled:
            reason = "cancelled"
            break
        ts = perf_counter()
        tok = sampler.sample(logits, history)
        lp = sampler.logprob(logits, tok) if want_lp else None
        t_last = perf_counter()
        tm.sample_s += t_last - ts
        tm.token_intervals_s.append(t_last - t_prev)
        t_prev = t_last
        if n == 0:
            t_first = t_last
            tm.ttft_s = t_last - t0
        n += 1
        if tok in eot:
            reason, stop_reason = "stop", tok
            break
        history.append(tok)
        chunk_ids.append(tok)
        if lp is not None:
            chunk_lp.append(lp)
        emit, held, hit = _scan(held + decoder.feed(tok), stops)
        if hit is not None:
            reason, stop_reason = "stop", hit
            tm.sampled_tokens = n
            tm.decode_s = t_last - t_first
            tm.total_s = perf_counter() - t0
            yield CompletionChunk(emit, chunk_ids, chunk_lp if want_lp else None, reason, hit, tm)
            return
        if emit:
            yield CompletionChunk(emit, chunk_ids, chunk_lp if want_lp else None)
            chunk_ids, chunk_lp = [], []
        if max_tokens is not None and n >= max_tokens:
            break
        if ctx.n_past >= ctx.n_ctx:  # no room to evaluate this token
            break
        if cancel.cancelled:
            reason = "cancelled"
            break
        te = perf_counter()
        logits = ctx.eval([tok])
        tm.eval_s += perf_counter() - te

    # The held text did not become a stop string; an unfinished character ends as U+FFFD.
    emit, _, hit = _scan(held + decoder.flush(), stops, final=True)
    if hit is not None:  # only a stop string containing U+FFFD can appear here
        reason, stop_reason = "stop", hit
    tm.sampled_tokens = n
    tm.decode_s = t_last - t_first
    tm.total_s = perf_counter() - t0
    yield CompletionChunk(emit, chunk_ids, chunk_lp if want_lp else None, reason, stop_reason, tm)
