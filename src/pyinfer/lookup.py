"""Prompt-lookup drafts for speculative decoding: the tokens that followed the latest earlier
occurrence of the sequence's last n-gram, in the prompt or in the output so far.

A task grounded in its input (rewrite this, summarize that, edit this code) copies runs of
the prompt into its output; once the output's last few tokens match a place in the prompt,
the tokens after that place are a good guess of what comes next. The driver evaluates the
sampled token and the guess in one forward pass (which reads the weights once, as one decode
step does), samples from each row in turn, and keeps the rows while the token sampled from
each equals the guessed token the next row was computed after. The first mismatch ends the
pass: its row gives the next token, and the positions after it are dropped from the cache.

Every token still comes from the Request's own sampler, in order, from the logits the plain
loop would have computed (bit for bit on the fast path, whose rows do not depend on what else
a pass holds), so the output is the plain loop's for any sampling parameters and seed; only
how many passes it takes changes.

How long a draft to send is a trade: a pass of more rows costs more (little more while the
weights' stream dominates, about a fifth of a step per row once the arithmetic does), and
each guessed token is kept only if all before it were. The lookup sends the length that
maximizes the tokens a pass is expected to give per unit of its cost,
(1 + E[tokens kept]) / cost(1 + length), nothing where no length beats a plain step. The
chance that a guessed token is kept grows with how long the match it continues already is
(the n-gram found, extended back, plus the guesses before it); the lookup learns it per match
length as the sequence goes, from every guess it could have made (also those it did not
send: the tokens sampled next tell), starting from a prior. PassCosts learns the costs from
the passes' times.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["PassCosts", "PromptLookup"]

MAX_MATCH = 16  # match lengths from here on share one estimate of acceptance


def prior_keep(length: int) -> float:
    """The prior chance that the token after a match of `length` tokens is the one the
    occurrence continues with: about a quarter after one token, a half after two, nine in
    ten from six on (what small chat models do on tasks that copy their input)."""
    return 0.95 - 0.7 * 0.6 ** (length - 1)


def prior_cost(rows: int) -> float:
    """The prior cost of a pass of `rows` rows, in one-row passes: a fifth of a step per
    extra row (a compute-bound pass on one core; shorter passes, still bound by the weights'
    stream, cost less, and the measurements say so once they are run)."""
    return 1.0 + 0.2 * (rows - 1)


class PassCosts:
    """What a forward pass of r rows costs, as a multiple of a one-row pass: a line in r
    fitted to the measured passes' times (a + b r seconds), so that every pass informs every
    length (one never sent, or sent at an unlucky moment, is not judged on its own few
    times), and a pass shared by many sequences, which never runs one row alone, is weighed
    as well. Each row count contributes the median of its last few times (a preempted pass
    or a page fault only ever adds time), weighted by how many it has; until two row counts
    have a few, prior_cost. One object per model and thread count (a ContextPool holds one,
    an Engine another); reads and updates need no lock (a lost update only delays the
    estimate)."""

    KEEP = 15  # the times kept per row count
    TRUST = 3  # the times a row count needs before it takes part in the fit

    def __init__(self, max_rows: int = 65) -> None:
        self.max_rows = max_rows
        self._times: dict[int, deque[float]] = {}
        self._medians: dict[int, float] = {}
        self._line: tuple[float, float] | None = None  # seconds: intercept, slope

    def observe(self, rows: int, seconds: float) -> None:
        if not 1 <= rows <= self.max_rows or not seconds > 0 or seconds == float("inf"):
            return
        these = self._times.setdefault(rows, deque(maxlen=self.KEEP))
        these.append(seconds)
        if len(these) >= self.TRUST:
            self._medians[rows] = statistics.median(these)
            if len(self._medians) >= 2:
                self._fit()

    def _fit(self) -> None:
        pts = [(float(r), m, float(len(self._times[r]))) for r, m in self._medians.items()]
        sw = sum(w for _, _, w in pts)
        mx = sum(w * x for x, _, w in pts) / sw
        my = sum(w * y for _, y, w in pts) / sw
        sxx = sum(w * (x - mx) ** 2 for x, _, w in pts)
        slope = max(0.0, sum(w * (x - mx) * (y - my) for x, y, w in pts) / sxx)
        a = my - slope * mx
        self._line = (a, slope) if a + slope > 0 else None

    def ratio(self, rows: int) -> float:
        r = min(max(rows, 1), self.max_rows)
        if self._line is None:
            return prior_cost(r)
        a, b = self._line
        return (a + b * r) / (a + b)


@dataclass
class PromptLookup:
    """Drafts for one sequence. max_draft: the most tokens guessed per pass; ngram_max,
    ngram_min: the longest and shortest suffix of the sequence looked up (the longest that
    matches wins); costs: the passes' costs (a fresh PassCosts if None). `extend` gives it
    tokens as they join the sequence (the prompt first, then each token kept or sampled);
    `draft` proposes what follows; `passed` times a pass; `kept` counts what was kept."""

    max_draft: int = 8
    ngram_max: int = 4
    ngram_min: int = 1
    costs: PassCosts | None = None
    prior_weight: float = 4.0  # the prior's weight in the acceptance estimate, in guesses
    tokens: list[int] = field(default_factory=list)
    drafted: int = 0  # tokens proposed so far
    accepted: int = 0  # of them, kept
    # n-gram -> the position just after its latest occurrence whose continuation is known
    # (the index is one token behind the sequence, so the current suffix never finds itself)
    _index: dict[tuple[int, ...], int] = field(default_factory=dict, repr=False)
    # per match length (index; MAX_MATCH and longer share the last): guesses checked, kept
    _tried: list[int] = field(default_factory=lambda: [0] * (MAX_MATCH + 1), repr=False)
    _hits: list[int] = field(default_factory=lambda: [0] * (MAX_MATCH + 1), repr=False)
    # the last lookup's candidates (all of them, sent or not), their match length, and how
    # many of them the tokens since have confirmed
    _pending: list[int] = field(default_factory=list, repr=False)
    _pending_match: int = 0
    _pending_at: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if self.max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {self.max_draft}")
        if self.costs is None:
            self.costs = PassCosts()
        toks, self.tokens = self.tokens, []
        self.extend(toks)

    def extend(self, toks: Sequence[int]) -> None:
        for t in toks:
            t = int(t)
            if self._pending:
                self._check(t)
            self.tokens.append(t)
            end = len(self.tokens) - 1  # n-grams ending before the newest token: their continuation is known
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end >= n:
                    self._index[tuple(self.tokens[end - n : end])] = end

    def _check(self, t: int) -> None:
        """Score the pending candidate that `t` takes the place of."""
        j = self._pending_at
        length = min(self._pending_match + j, MAX_MATCH)
        self._tried[length] += 1
        if t == self._pending[j]:
            self._hits[length] += 1
            self._pending_at = j + 1
            if self._pending_at < len(self._pending):
                return
        self._pending = []

    def keep_chance(self, length: int) -> float:
        """The estimated chance that a guess continuing a match of `length` tokens is kept."""
        i = min(length, MAX_MATCH)
        w = self.prior_weight
        return (self._hits[i] + w * prior_keep(i)) / (self._tried[i] + w)

    def candidates(self, room: int | None = None) -> tuple[list[int], int]:
        """What the lookup finds: the up to min(max_draft, room) tokens that followed the
        latest earlier occurrence of the longest suffix of ngram_min.. ngram_max tokens, and
        how long a match they continue (the suffix, extended back while the occurrence's
        earlier tokens are the sequence's, up to MAX_MATCH); ([], 0) where none occurred."""
        k = self.max_draft if room is None else min(self.max_draft, room)
        toks = self.tokens
        end = len(toks)
        if k < 1:
            return [], 0
        for n in range(min(self.ngram_max, end), self.ngram_min - 1, -1):
            at = self._index.get(tuple(toks[end - n :]))
            if at is not None:
                break
        else:
            return [], 0
        match = n
        while match < MAX_MATCH and at - match > 0 and toks[at - match - 1] == toks[end - match - 1]:
            match += 1
        return toks[at : at + k], match

    def draft(self, room: int | None = None) -> list[int]:
        """The leading part of the candidates worth a pass: the length with the most tokens
        expected per unit of cost, [] where none beats a plain step (or nothing matched)."""
        return self.draft_in_batch(room)[0]

    def draft_in_batch(self, room: int | None = None, rows: int = 0, tokens: float = 0.0) -> tuple[list[int], float]:
        """draft() for a sequence whose pass is shared: `rows` rows of other sequences are in it
        already, expected to give `tokens` tokens. The length chosen is the one with the most
        tokens expected from the whole pass per unit of its cost; returns it and the tokens
        this sequence's rows are expected to give (1 + the guesses expected to be kept)."""
        cands, match = self.candidates(room)
        self._pending, self._pending_match, self._pending_at = cands, match, 0
        costs = self.costs
        assert costs is not None
        best, best_gain = 0, 1.0
        best_rate = (tokens + 1.0) / costs.ratio(rows + 1)
        p, expected = 1.0, 0.0
        for j in range(len(cands)):
            p *= self.keep_chance(match + j)
            expected += p
            rate = (tokens + 1.0 + expected) / costs.ratio(rows + j + 2)
            if rate > best_rate:
                best, best_rate, best_gain = j + 1, rate, 1.0 + expected
        self.drafted += best
        return cands[:best], best_gain

    def passed(self, rows: int, seconds: float) -> None:
        """A forward pass of `rows` rows (the sampled token and a draft) took `seconds`."""
        assert self.costs is not None
        self.costs.observe(rows, seconds)

    def kept(self, proposed: int, accepted: int) -> None:
        """The last draft had `proposed` tokens, of which the first `accepted` were kept."""
        self.accepted += accepted
