"""One request's state, stepped from outside: its sampler, token history, stop-string buffer,
UTF-8 stream decoder, timings, cancellation and finish reason.

A Request never calls the model. Whoever owns the model (the single-sequence driver in
`generate`, later a scheduler serving many requests) evaluates `prefill_ids()`, hands the
last logits row to `step()`, evaluates the token it returns, and so on until a step says
the request has finished:

    req = Request(tokenizer, prompt_ids, params, n_ctx=ctx.n_ctx, max_tokens=64)
    logits = ctx.eval(req.prefill_ids())
    while True:
        r = req.step(logits)
        if r.chunk is not None:
            emit(r.chunk)
        if r.finished:
            break
        logits = ctx.eval([r.token])

Every argument is checked when the Request is made, so nothing a caller passed can fail
later, in the middle of a stream.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Literal, cast

import numpy as np

from pyinfer.errors import ContextOverflowError, ParameterTypeError
from pyinfer.sampling import INT32_MAX, Sampler, SamplingParams, TokenLogprob
from pyinfer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from pyinfer.constraint import Constraint

# Hooks a caller may give a request (llama-cpp-python's logits_processor and stopping_criteria).
LogitsHook = Callable[[np.ndarray, np.ndarray], np.ndarray]
StopHook = Callable[[np.ndarray, np.ndarray], bool]

FinishReason = Literal["stop", "length", "cancelled"]


# Prompt tokens a scheduler step of the engine evaluates beside the decoding rows. Each step's
# pass is one token of every decoding sequence, so the budget is what their next tokens wait
# for while prompts come in: 128 tokens halves the wait of 256 for a few percent of prefill
# speed (`pyinfer bench serve`, concurrency 16: p50 TTFT after a cached prefix 250 ms against
# 388).
TOKEN_BUDGET = 128


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
    arrived), else when the Request was made. ttft_s: from then to the first token
    sampled. token_intervals_s[0] = ttft_s, then the time between consecutive tokens (a
    decode step, the sampling, and whatever the consumer of a stream did in between).
    eval_s and sample_s split the decode time between the model and the sampler; the rest
    of decode_s is the loop's own overhead.
    """

    queue_s: float = 0.0  # before the Request was made, less tokenize_s (+ an engine's admission wait)
    tokenize_s: float = 0.0  # as reported by the caller
    prefill_s: float = 0.0  # the model over the prompt, as the driver reports it
    ttft_s: float | None = None  # None when no token was sampled
    decode_s: float = 0.0  # from the first token sampled to the last
    eval_s: float = 0.0  # the model during decode, as the driver reports it
    sample_s: float = 0.0  # the sampler, over all tokens (logprobs included)
    total_s: float = 0.0
    prompt_tokens: int = 0  # evaluated in prefill
    cached_tokens: int = 0  # of the prompt, found in a cached prefix (not evaluated)
    first_sample_s: float = 0.0  # the sampler on the first token's logits (logprobs included)
    draft_tokens: int = 0  # guessed by speculative decoding (prompt lookup)
    draft_accepted: int = 0  # of them, kept
    constraint_s: float = 0.0  # computing the constraint's token masks and advancing it (in sample_s)
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


@dataclass(frozen=True)
class StepResult:
    """What one step of a request gives back.

    chunk: text and tokens to pass on now, or None (text held back); the request's last
    chunk carries its finish reason and timings. token: the token to evaluate before the
    next step, None once finished. finished: no more steps.
    """

    chunk: CompletionChunk | None
    token: int | None
    finished: bool


class BannedError(ValueError):
    """The request's logit_bias bans (-inf) every token that may come next: all of the
    vocabulary, or all its constraint allows there. Its own doing, found as it samples."""


# ---- argument checks


CONSTRAINT_KEYWORDS = ("constraint", "response_format", "grammar", "regex", "choice", "json_schema")


def prompt_and_params(
    prompt: object, tokenizer: Tokenizer, tokenize: Callable[[str], list[int]], sampling: dict[str, object],
    caller: str,
) -> tuple[Sequence[int] | np.ndarray, SamplingParams, Constraint | None]:
    """A request's prompt ids (a text tokenized with `tokenize`, or ids as given), its
    SamplingParams from the sampling keywords and its Constraint from the constraint
    keywords (CONSTRAINT_KEYWORDS: pyinfer.constraint.constraint_from's), for the entry
    points that take them (generate, Engine.submit); an unknown keyword is a TypeError naming
    `caller`."""
    wanted = {k: sampling.pop(k) for k in CONSTRAINT_KEYWORDS if k in sampling}
    constraint = None
    if any(v is not None for v in wanted.values()):
        from pyinfer.constraint import constraint_from

        constraint = constraint_from(tokenizer, **wanted)  # type: ignore[arg-type]
    ids: Sequence[int] | np.ndarray
    if isinstance(prompt, str):
        ids = tokenize(prompt)
    elif isinstance(prompt, (Sequence, np.ndarray)) and not isinstance(prompt, (bytes, bytearray)):
        ids = cast("Sequence[int] | np.ndarray", prompt)  # a str took the branch above
    else:
        raise ParameterTypeError(f"prompt must be a str or a sequence of token ids, not {type(prompt).__name__}")
    if sampling.get("logit_bias", ()) is None:
        del sampling["logit_bias"]
    try:
        params = SamplingParams(**sampling)  # type: ignore[arg-type]
    except TypeError as e:
        if "unexpected keyword" not in str(e):
            raise
        raise TypeError(f"{caller}(): {e}") from None
    return ids, params, constraint


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """How many leading tokens two token sequences share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def _prompt_list(prompt_ids: Sequence[int] | np.ndarray, n_vocab: int) -> list[int]:
    if isinstance(prompt_ids, (str, bytes)):
        raise ParameterTypeError("prompt_ids must be token ids: tokenize the text first")
    if isinstance(prompt_ids, np.ndarray):
        if prompt_ids.ndim != 1 or prompt_ids.dtype.kind not in "iu":
            raise ParameterTypeError(
                f"prompt_ids must be a 1-D integer array, got {prompt_ids.dtype} with shape "
                f"{prompt_ids.shape}"
            )
        ids: list[int] = prompt_ids.tolist()
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


# Stop strings are scanned on the scheduler's thread after every token, so their number and
# length bound every request's step time: 16 strings of 1024 characters (OpenAI takes 4;
# llama.cpp takes any number) keep the scan well under a millisecond per token.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024


def stop_strings(stop: str | Sequence[str] | None) -> list[str]:
    """`stop` checked and as a list: strings, none empty, at most MAX_STOP_STRINGS of them,
    none longer than MAX_STOP_CHARS characters (ParameterTypeError, ValueError naming stop)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    elif not isinstance(stop, Sequence) or isinstance(stop, (bytes, bytearray)):
        raise ParameterTypeError(f"stop must be a string or a list of strings, not {type(stop).__name__}")
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"stop has {len(stop)} strings, more than the {MAX_STOP_STRINGS} allowed")
    out = []
    for s in stop:
        if not isinstance(s, str):
            raise ParameterTypeError(f"stop strings must be str, not {type(s).__name__}")
        if not s:
            raise ValueError("stop: a stop string is empty: it would stop before the first token")
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(
                f"stop: a stop string has {len(s)} characters, more than the {MAX_STOP_CHARS} allowed"
            )
        out.append(s)
    return out


def check_flag(name: str, value: object) -> bool:
    """A True / False parameter: "yes" or 1 is a mistake to name, not a truth value."""
    if not isinstance(value, (bool, np.bool_)):
        raise ParameterTypeError(f"{name} must be True or False, not {value!r:.40}")
    return bool(value)


def _count(name: str, value: object, minimum: int, what: str = "") -> int:
    """A count in [minimum, INT32_MAX] (positions are 32-bit in the kernels)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ParameterTypeError(f"{name} must be an int, not {type(value).__name__}")
    if not minimum <= value <= INT32_MAX:
        raise ValueError(f"{name} must be in [{minimum}, {INT32_MAX}]{what}, got {value}")
    return int(value)


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
    """Split decoded text into (safe to emit, held back, stop string found): the definition
    StopScanner computes incrementally (this costs O(held text x stop length) per call).

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


class StopScanner:
    """`_scan` over a stream of text fed piece by piece, without rescanning the held text:
    one KMP automaton per stop string, whose state is the longest end of the stream that
    begins that string. A character costs amortized O(1) per stop string, so a request with
    long stop strings does not slow the scheduler's steps; building the tables (at most
    MAX_STOP_STRINGS x MAX_STOP_CHARS steps) happens when the Request is made."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self._fail = [_prefix_function(s) for s in stops]
        self._state = [0] * len(stops)
        self.held = ""  # the end of the stream that could still become a stop string

    def feed(self, piece: str, final: bool = False) -> tuple[str, str | None]:
        """Take the next piece of text; returns (safe to emit, stop string found). After a
        stop string the rest is dropped; `final`: no more text comes, emit what is held."""
        text = self.held + piece
        base = len(self.held)
        at, hit = -1, None
        hold = 0
        for i, s in enumerate(self.stops):
            q, fail, n = self._state[i], self._fail[i], len(s)
            for p, c in enumerate(piece):
                while q and s[q] != c:
                    q = fail[q - 1]
                if s[q] == c:
                    q += 1
                if q == n:  # the first occurrence of s ends here
                    start = base + p + 1 - n
                    if hit is None or start < at:
                        at, hit = start, s
                    break
            self._state[i] = q
            hold = max(hold, q)
        if hit is not None:
            self.held = ""
            return text[:at], hit
        if final:
            self.held = ""
            return text, None
        cut = len(text) - hold
        self.held = text[cut:]
        return text[:cut], None


def _prefix_function(s: str) -> list[int]:
    """pi[i]: the length of the longest proper prefix of s[: i + 1] that also ends it."""
    pi = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = pi[k - 1]
        if s[i] == s[k]:
            k += 1
        pi[i] = k
    return pi


# ---- the request


class Request:
    """One generation request: everything but the model.

    tokenizer, prompt_ids: the prompt as token ids, to be evaluated at positions n_past..
    of a sequence holding n_ctx tokens. params: how to sample (None: SamplingParams()).
    max_tokens: None = until an end-of-turn token or a full sequence; 0 = prefill only.
    stop: strings that end the generation; neither they nor anything after them is
    returned. cancel: a CancelToken another thread may trigger. truncate="left": a prompt
    longer than the free context loses its oldest tokens instead of raising
    ContextOverflowError, leaving room for max_tokens (but at most half the free context;
    None: half) and keeping a leading BOS when the tokenizer adds one. special: include
    control tokens' text in the output. constraint: the tokens allowed at each step
    (pyinfer.constraint; a finished text ends the request with "stop"). logits_processor:
    f(ids, logits) -> logits, given the tokens so far (prompt included, int32) and a copy of
    each row before sampling; stopping_criteria: f(ids, logits) -> bool after each token
    sampled (true ends the request with "stop"). started,
    tokenize_s: when the request arrived
    (perf_counter) and how long tokenizing took, so that timings cover the whole request.

    Raises here, before anything runs: an empty prompt, ids out of range, parameters of
    the wrong type or range, ContextOverflowError.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] | np.ndarray,
        params: SamplingParams | None = None,
        *,
        n_ctx: int,
        n_past: int = 0,
        max_tokens: int | None = None,
        stop: str | Sequence[str] | None = None,
        cancel: CancelToken | None = None,
        truncate: Literal["left"] | None = None,
        special: bool = False,
        constraint: Constraint | None = None,
        logits_processor: LogitsHook | None = None,
        stopping_criteria: StopHook | None = None,
        started: float | None = None,
        tokenize_s: float = 0.0,
    ) -> None:
        t_call = perf_counter()
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise ParameterTypeError(f"params must be SamplingParams, not {type(params).__name__}")
        if max_tokens is not None:
            max_tokens = _count("max_tokens", max_tokens, 0, " or None (no limit)")
        if truncate not in (None, "left"):
            raise ValueError(f"truncate must be None or 'left', got {truncate!r}")
        special = check_flag("special", special)
        if cancel is None:
            cancel = CancelToken()
        elif not isinstance(cancel, CancelToken):
            raise ParameterTypeError(f"cancel must be a CancelToken, not {type(cancel).__name__}")
        n_ctx = _count("n_ctx", n_ctx, 1)
        n_past = _count("n_past", n_past, 0)
        if n_past > n_ctx:
            raise ValueError(f"n_past ({n_past}) exceeds n_ctx ({n_ctx})")
        self.stops = stop_strings(stop)
        ids = _prompt_list(prompt_ids, tokenizer.vocab_size)

        room = n_ctx - n_past
        self.truncated_tokens = 0
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
            self.truncated_tokens = len(ids) - len(new)
            ids = new

        self.params = params
        self.sampler = Sampler(params, tokenizer.vocab_size)
        if constraint is not None:
            from pyinfer.constraint import Constraint

            if not isinstance(constraint, Constraint):
                raise ParameterTypeError(f"constraint must be a Constraint, not {type(constraint).__name__}")
        self.constraint = constraint
        for name, hook in (("logits_processor", logits_processor), ("stopping_criteria", stopping_criteria)):
            if hook is not None and not callable(hook):
                raise ParameterTypeError(f"{name} must be callable, not {type(hook).__name__}")
        self.logits_processor = logits_processor
        self.stopping_criteria = stopping_criteria
        self.prompt_ids = ids
        self.max_tokens = max_tokens
        self.cancel_token = cancel
        self.n_ctx = n_ctx
        self.history = list(ids)  # what the repetition penalties look at
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None

        self._t0 = t_call if started is None else started
        self.timings = Timings(
            queue_s=max(0.0, t_call - self._t0 - tokenize_s),
            tokenize_s=tokenize_s,
            prompt_tokens=len(ids),
        )
        self._eot = tokenizer.eot_ids
        self._decoder = tokenizer.decoder(special=special)
        self._want_lp = params.logprobs is not None
        self._pos = n_past + len(ids)  # positions filled once the prefill has run
        self._stops = StopScanner(self.stops)  # holds back text that could become a stop string
        self._ids: list[int] = []  # sampled since the last chunk
        self._lps: list[TokenLogprob] = []
        self._n = 0  # tokens sampled
        self._steps = 0
        self._t_prev = self._t0
        self._t_first = self._t_last = 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cancelled(self) -> bool:
        """The cancel token has been triggered (the request may not have finished yet)."""
        return self.cancel_token.cancelled

    def prefill_ids(self) -> list[int]:
        """The prompt tokens to evaluate before the first step (after truncation), at
        positions n_past..; the driver may evaluate them in chunks."""
        return list(self.prompt_ids)

    def step(self, logits: np.ndarray, *, eval_s: float = 0.0) -> StepResult:
        """Sample from `logits`, the row after the last token evaluated (the prompt's last
        for the first step, then the token the previous step returned), and say what comes
        next. eval_s: how long the model took to produce these logits (for the first step,
        the whole prefill), for the timings."""
        if self.finished:
            raise RuntimeError(f"the request has finished ({self.finish_reason})")
        tm = self.timings
        if self._steps == 0:
            tm.prefill_s = eval_s
        else:
            tm.eval_s += eval_s
        self._steps += 1
        if self.max_tokens is not None and self._n >= self.max_tokens:
            return self._finish("length")
        if self.cancelled:
            return self._finish("cancelled")

        sampler = self.sampler
        if self.logits_processor is not None:
            logits = self._processed(logits)
        ts = perf_counter()
        if self.constraint is not None:
            # Tokens that would leave the language are out; the log-probabilities are those
            # of what was sampled from.
            logits = self.constraint.masked(logits)
            tm.constraint_s += perf_counter() - ts
        try:
            tok = sampler.sample(logits, self.history)
        except ValueError:
            if np.isneginf(sampler.adjusted(logits, self.history)).all():
                allowed = "the constraint allows" if self.constraint is not None else "there is"
                raise BannedError(f"logit_bias bans every token {allowed} at token {self._n}: nothing can be "
                                  "sampled") from None
            raise
        lp = sampler.logprob(logits, tok) if self._want_lp else None
        self._t_last = perf_counter()
        tm.sample_s += self._t_last - ts
        tm.token_intervals_s.append(self._t_last - self._t_prev)
        self._t_prev = self._t_last
        if self._n == 0:
            self._t_first = self._t_last
            tm.ttft_s = self._t_last - self._t0
            tm.first_sample_s = self._t_last - ts
        self._n += 1
        if tok in self._eot:
            return self._finish("stop", tok)
        if self.constraint is not None:
            ta = perf_counter()
            self.constraint.advance(tok)
            tm.constraint_s += perf_counter() - ta
        self.history.append(tok)
        self._ids.append(tok)
        if lp is not None:
            self._lps.append(lp)
        emit, hit = self._stops.feed(self._decoder.feed(tok))
        if hit is not None:
            # Text after a stop string is dropped: no flush of the held text or the decoder.
            return self._end(emit, "stop", hit)
        if self.constraint is not None and self.constraint.done:  # the text is complete
            return self._finish("stop", emit=emit)
        if self.stopping_criteria is not None and self.stopping_criteria(np.array(self.history, np.int32), logits):
            return self._finish("stop", emit=emit)
        if self.max_tokens is not None and self._n >= self.max_tokens:
            return self._finish("length", emit=emit)
        if self._pos >= self.n_ctx:  # no room to evaluate this token
            return self._finish("length", emit=emit)
        if self.cancelled:
            return self._finish("cancelled", emit=emit)
        self._pos += 1  # the driver evaluates tok before the next step
        chunk = None
        if emit:
            chunk = self._chunk(emit)
        return StepResult(chunk, tok, False)

    def abort(self, *, eval_s: float = 0.0) -> StepResult:
        """Finish now with "cancelled" (the driver saw the cancel token before evaluating
        what this request gave it). eval_s: model time spent since the last step (a prefill
        cut short)."""
        if self.finished:
            raise RuntimeError(f"the request has finished ({self.finish_reason})")
        if self._steps == 0:
            self.timings.prefill_s = eval_s
        else:
            self.timings.eval_s += eval_s
        return self._finish("cancelled")

    def completion(self, chunks: Iterable[CompletionChunk]) -> Completion:
        """This request's chunks, all of them, folded into one Completion."""
        text: list[str] = []
        token_ids: list[int] = []
        logprobs: list[TokenLogprob] | None = [] if self._want_lp else None
        last = CompletionChunk("", [])
        for last in chunks:
            text.append(last.text)
            token_ids += last.token_ids
            if logprobs is not None and last.logprobs:
                logprobs += last.logprobs
        if last.finish_reason is None or last.timings is None:
            raise RuntimeError("the chunks ended before the request finished")
        return Completion(
            text="".join(text),
            token_ids=token_ids,
            finish_reason=last.finish_reason,
            stop_reason=last.stop_reason,
            logprobs=logprobs,
            prompt_tokens=len(self.prompt_ids),
            truncated_tokens=self.truncated_tokens,
            timings=last.timings,
            seed=None if self.params.greedy else self.sampler.seed,
        )

    # -- internals

    def _processed(self, logits: np.ndarray) -> np.ndarray:
        assert self.logits_processor is not None
        out = np.asarray(self.logits_processor(np.array(self.history, np.int32), np.array(logits, np.float32)))
        n = self.sampler.n_vocab
        if out.shape != (n,):
            raise ValueError(f"logits_processor returned shape {out.shape}, not ({n},)")
        return np.ascontiguousarray(out, np.float32)

    def _chunk(self, text: str) -> CompletionChunk:
        c = CompletionChunk(text, self._ids, self._lps if self._want_lp else None)
        self._ids, self._lps = [], []
        return c

    def _finish(
        self, reason: FinishReason, stop_reason: str | int | None = None, *, emit: str = ""
    ) -> StepResult:
        # The held text did not become a stop string; an unfinished character ends as U+FFFD.
        tail, hit = self._stops.feed(self._decoder.flush(), final=True)
        if hit is not None:  # only a stop string containing U+FFFD can appear here
            reason, stop_reason = "stop", hit
        return self._end(emit + tail, reason, stop_reason)

    def _end(self, text: str, reason: FinishReason, stop_reason: str | int | None) -> StepResult:
        tm = self.timings
        tm.sampled_tokens = self._n
        tm.decode_s = self._t_last - self._t_first
        tm.total_s = perf_counter() - self._t0
        self.finish_reason, self.stop_reason = reason, stop_reason
        chunk = self._chunk(text)
        chunk.finish_reason, chunk.stop_reason, chunk.timings = reason, stop_reason, tm
        return StepResult(chunk, None, True)
