"""Token sampling: penalties, logit bias, temperature, top-k, top-p, min-p, a seeded draw,
and per-token log-probabilities. The loops over the vocabulary are in `_sampling.pyx`.

The chain, in order (each step is skipped at its neutral value):

1. repetition penalties on the tokens of the last `repeat_last_n` of the history, with
   llama.cpp's semantics: a positive logit is divided by `repeat_penalty`, a negative one
   multiplied by it, then `count * frequency_penalty + presence_penalty` is subtracted;
2. `logit_bias` added (-inf bans a token);
3. temperature 0: the argmax (lowest id on ties), nothing else applies;
4. otherwise temperature, then top-k, top-p and min-p, then one draw.

Temperature comes first, as in transformers: the filters see the distribution that is
drawn from. (llama.cpp applies it after them, so at temperature != 1 its top-p and min-p
keep a different number of tokens.) top-p keeps the shortest run of the most likely tokens
whose probability reaches `top_p`, over what top-k left; min-p keeps the tokens at least
`min_p` times as likely as the most likely one. A token within float rounding (1e-6
relative) of a cut-off is kept, so a cut-off placed exactly on a probability is stable.

Log-probabilities are those of the model: log-softmax of the raw logits, before penalties,
bias, temperature and filters, as llama-cpp-python and the OpenAI API report them.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Union

import numpy as np

from pyinfer import _sampling
from pyinfer.errors import ParameterTypeError

History = Union[Sequence[int], np.ndarray]

# Biases are added to float32 logits: past float32's range (3.4e38) a bias would overflow
# mid-request. 1e30 leaves room for the logit and the temperature's division, and forces or
# suppresses a token as surely as anything larger.
MAX_LOGIT_BIAS = 1e30

# ---- parameters


def _number(name: str, value: Any) -> float:
    # bool is an int subclass, but temperature=True is a mistake, not 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ParameterTypeError(f"{name} must be a number, not {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an int past float64's range: not inf, which 1e999 spells
        raise ValueError(f"{name} is outside a float's range") from None
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return value


# The largest count or id a parameter may take: the sampling loops index with 32-bit ints,
# and a Python int past that raises OverflowError deep inside them.
INT32_MAX = 2**31 - 1


def _integer(name: str, value: Any, lo: int | None = None, hi: int = INT32_MAX, what: str = "") -> int:
    """value as an int; with lo given, ValueError unless lo <= value <= hi, naming the
    parameter, the value and the range (`what`: what the bounds mean)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ParameterTypeError(f"{name} must be an int, not {type(value).__name__}")
    v = int(value)
    if lo is not None and not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}]{what}, got {v}")
    return v


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token. The defaults are llama.cpp's, written here only (Model.generate,
    generate() and the command line take theirs from here; pyinfer.Llama keeps
    llama-cpp-python's own set).

    Every int is bounded (top_k, repeat_last_n, logprobs, logit_bias ids by INT32_MAX; seed
    below 2**64): ValueError naming the parameter, the value and the range.

    temperature: >= 0; 0 is greedy (argmax). top_k: >= 0; 0 keeps the whole vocabulary.
    top_p: in [0, 1]; 1 is off, 0 keeps only the most likely token. min_p: in [0, 1]; 0 is
    off. repeat_penalty: > 0; 1 is off. presence_penalty, frequency_penalty: finite; 0 is
    off (a penalized logit is kept within float32's range, so every such value is defined).
    repeat_last_n: how many of the latest tokens (prompt included) the penalties look at; 0
    is off, -1 the whole history. logit_bias: token id -> value added to its logit
    (|bias| <= MAX_LOGIT_BIAS = 1e30, or -inf to ban it). seed: an int >= 0 makes the draws
    reproducible; None takes a fresh random seed for each Sampler. logprobs: None, or how many most likely
    alternatives to report with each token's log-probability (0: the token's own only).
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    logprobs: int | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)  # frozen: store the normalized value

        t = _number("temperature", self.temperature)
        if not 0.0 <= t < math.inf:
            raise ValueError(f"temperature must be >= 0 and finite (0 is greedy), got {t}")
        put("temperature", t)
        put("top_k", _integer("top_k", self.top_k, 0, what=" (0 keeps every token)"))
        for name in ("top_p", "min_p"):
            v = _number(name, getattr(self, name))
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
            put(name, v)
        r = _number("repeat_penalty", self.repeat_penalty)
        if not 0.0 < r < math.inf:
            raise ValueError(f"repeat_penalty must be > 0 and finite (1 is off), got {r}")
        put("repeat_penalty", r)
        for name in ("presence_penalty", "frequency_penalty"):
            v = _number(name, getattr(self, name))
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite (0 is off), got {v}")
            put(name, v)
        put("repeat_last_n", _integer("repeat_last_n", self.repeat_last_n, -1,
                                      what=" (-1: the whole history, 0: off)"))

        if not isinstance(self.logit_bias, Mapping):
            raise ParameterTypeError(
                f"logit_bias must be a mapping of token id -> bias, "
                f"not {type(self.logit_bias).__name__}"
            )
        bias: dict[int, float] = {}
        for tok, b in self.logit_bias.items():
            tok = _integer("a logit_bias token id", tok)
            if not 0 <= tok <= INT32_MAX:
                raise ValueError(f"logit_bias token id {tok} is {'negative' if tok < 0 else 'too large'}: "
                                 f"ids are in [0, {INT32_MAX}]")
            b = _number(f"logit_bias[{tok}]", b)
            if b == math.inf:
                raise ValueError(
                    f"logit_bias[{tok}] is +inf: use a large finite value to force a token"
                )
            if b != -math.inf and abs(b) > MAX_LOGIT_BIAS:
                raise ValueError(
                    f"logit_bias[{tok}] = {b!r} is out of range: a bias must be within "
                    f"+-{MAX_LOGIT_BIAS:g} (or -inf to ban the token)"
                )
            bias[tok] = b
        put("logit_bias", MappingProxyType(bias))

        if self.seed is not None:
            put("seed", _integer("seed", self.seed, 0, 2**64 - 1, " or None (a fresh seed)"))
        if self.logprobs is not None:
            put("logprobs", _integer("logprobs", self.logprobs, 0, what=" or None"))

    @property
    def greedy(self) -> bool:
        """True when the token is the argmax (temperature 0): no draw, no seed needed."""
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """True when repetition penalties change any logit."""
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


# llama.cpp's defaults, for the signatures and options that show them.
DEFAULT_PARAMS = SamplingParams()


# ---- results


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability under the model, and the most likely tokens."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (id, logprob), most likely first


# ---- log-probabilities


def _logsumexp_row(x: np.ndarray, m: float, scratch: np.ndarray) -> float:
    """log(sum(exp(x))) of a float32 row whose maximum is m, summed in float64 in one
    vectorized pass (scratch: a float32 buffer at least as long as x)."""
    return m + math.log(_sampling.exp_sum(x, m, 1.0, scratch))


def logsumexp(x: Any) -> np.ndarray:
    """log(sum(exp(x))) over the last axis of float32 logits, summed in float64: a float64
    array of x.shape[:-1]."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    if a.ndim == 0 or a.shape[-1] == 0:
        raise ValueError(f"logsumexp needs a non-empty last axis, got shape {a.shape}")
    rows = a.reshape(-1, a.shape[-1])
    scratch = np.empty(a.shape[-1], np.float32)
    out = np.array([_logsumexp_row(r, float(r.max()), scratch) for r in rows])
    return out.reshape(a.shape[:-1])


def log_softmax(x: Any, axis: int = -1) -> np.ndarray:
    """Log-probabilities of logits along `axis`, as float32 (llama-cpp-python's dtype)."""
    a = np.moveaxis(np.asarray(x, dtype=np.float32), axis, -1)
    lse = logsumexp(a).astype(np.float32)
    return np.moveaxis(a - lse[..., None], -1, axis)


# ---- the sampler


class Sampler:
    """Draws tokens from logits rows with one SamplingParams; keeps its RNG between calls,
    so one Sampler serves one generation. Not thread-safe (one per request).

    >>> s = Sampler(SamplingParams(temperature=0.7, seed=42), n_vocab=len(row))
    >>> token = s.sample(row, history)
    """

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        if not isinstance(params, SamplingParams):
            raise ParameterTypeError(f"params must be SamplingParams, not {type(params).__name__}")
        n_vocab = _integer("n_vocab", n_vocab)
        if not 0 < n_vocab < 2**31:
            raise ValueError(f"n_vocab must be in [1, 2**31), got {n_vocab}")
        bad = [t for t in params.logit_bias if t >= n_vocab]
        if bad:
            raise ValueError(
                f"logit_bias token id {bad[0]} is out of range for a vocabulary of {n_vocab}"
            )
        if params.logprobs is not None and params.logprobs > n_vocab:
            raise ValueError(f"logprobs={params.logprobs} exceeds the vocabulary ({n_vocab})")
        self.params = params
        self.n_vocab = n_vocab
        # The seed in use, so that a run with seed=None can be repeated.
        self.seed: int = params.seed if params.seed is not None else secrets.randbits(64)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._bias_ids = np.fromiter(params.logit_bias.keys(), np.int32, len(params.logit_bias))
        self._bias = np.fromiter(params.logit_bias.values(), np.float32, len(params.logit_bias))
        # Work buffers, reused for every token: no allocation per call.
        self._work = np.empty(n_vocab, np.float32)
        self._scratch = np.empty(n_vocab, np.float32)
        self._idx = np.empty(n_vocab, np.int32)
        self._w = np.empty(n_vocab, np.float32)
        self._counts = np.zeros(n_vocab, np.int32)

    def _row(self, logits: np.ndarray) -> np.ndarray:
        if not isinstance(logits, np.ndarray):
            raise ParameterTypeError(f"logits must be a NumPy array, not {type(logits).__name__}")
        if logits.shape != (self.n_vocab,):
            raise ValueError(f"logits must have shape ({self.n_vocab},), got {logits.shape}")
        if logits.dtype != np.float32 or not logits.flags.c_contiguous:
            logits = np.ascontiguousarray(logits, dtype=np.float32)
        return logits

    def _adjusted(self, logits: np.ndarray, history: History) -> np.ndarray:
        """The logits after penalties and bias (a copy when either applies)."""
        p = self.params
        window: list[int] = []
        if p.penalized and len(history):
            window = list(history if p.repeat_last_n == -1 else history[-p.repeat_last_n :])
        if not window and not len(self._bias):
            return logits
        x = self._work
        np.copyto(x, logits)
        if window:
            _sampling.apply_penalties(
                x,
                window,
                self._counts,
                p.repeat_penalty,
                p.presence_penalty,
                p.frequency_penalty,
            )
        if len(self._bias):
            _sampling.apply_bias(x, self._bias_ids, self._bias)
        return x

    def adjusted(self, logits: np.ndarray, history: History = ()) -> np.ndarray:
        """The logits after the penalties and logit_bias (a new array)."""
        x = self._adjusted(self._row(logits), history)
        return x.copy()

    @staticmethod
    def _best(x: np.ndarray) -> int:
        best = int(np.argmax(x))  # the first maximum; a NaN anywhere is returned first
        v = float(x[best])
        if math.isnan(v) or v == math.inf:
            raise ValueError("the logits contain NaN or +inf")
        if v == -math.inf:
            raise ValueError("every token is banned (all logits are -inf after logit_bias)")
        return best

    def candidates(
        self, logits: np.ndarray, history: History = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """The distribution a token is drawn from: surviving ids and their probabilities
        (summing to 1). Greedy gives the argmax with probability 1."""
        x = self._adjusted(self._row(logits), history)
        best = self._best(x)
        p = self.params
        if p.greedy:
            return np.array([best], np.int32), np.ones(1)
        c = self._filter(x, best)
        w = self._w[:c].astype(np.float64)
        return self._idx[:c].copy(), w / w.sum()

    def _filter(self, x: np.ndarray, best: int) -> int:
        """Temperature, top-k, top-p and min-p over adjusted logits x: the surviving ids and
        their weights land in self._idx[:c] and self._w[:c]; returns c."""
        p = self.params
        return _sampling.filter_candidates(
            x, x[best], p.temperature, p.top_k, p.top_p, p.min_p, self._idx, self._w, self._scratch
        )

    def sample(self, logits: np.ndarray, history: History = ()) -> int:
        """One token id from a logits row (float32, n_vocab). `history`: the token ids so
        far, prompt included, that the repetition penalties look at."""
        x = self._adjusted(self._row(logits), history)
        best = self._best(x)
        p = self.params
        if p.greedy:
            return best
        c = self._filter(x, best)
        if c == 1:
            return int(self._idx[0])
        return int(self._idx[_sampling.draw(self._w, c, self._rng.random())])

    def logprob(self, logits: np.ndarray, token: int, n_top: int | None = None) -> TokenLogprob:
        """`token`'s log-probability under the raw logits, with the `n_top` (default:
        params.logprobs or 0) most likely tokens and theirs."""
        x = self._row(logits)
        token = _integer("token", token)
        if not 0 <= token < self.n_vocab:
            raise ValueError(f"token id {token} is out of range for a vocabulary of {self.n_vocab}")
        if n_top is None:
            n_top = self.params.logprobs or 0
        lse = _logsumexp_row(x, float(x[self._best(x)]), self._scratch)
        top: tuple[tuple[int, float], ...] = ()
        if n_top > 0:
            c = _sampling.top_ids(x, n_top, self._idx)
            ids = self._idx[:c].tolist()
            top = tuple(zip(ids, (x[ids].astype(np.float64) - lse).tolist()))
        return TokenLogprob(token, float(x[token]) - lse, top)
