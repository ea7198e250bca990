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
how many passes it takes changes. Nothing is drafted where no n-gram matches, and the draft
length adapts to how much of the last draft was kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["PromptLookup"]


@dataclass
class PromptLookup:
    """Drafts for one sequence. max_draft: the most tokens guessed per pass; ngram_max,
    ngram_min: the longest and shortest suffix of the sequence looked up (the longest that
    matches wins). `extend` gives it tokens as they join the sequence (the prompt first);
    `draft` proposes what follows; `kept` says how many of the last draft were accepted."""

    max_draft: int = 8
    ngram_max: int = 4
    ngram_min: int = 2
    tokens: list[int] = field(default_factory=list)
    drafted: int = 0  # tokens proposed so far
    accepted: int = 0  # of them, kept
    _limit: int = 0  # the next draft's length, adapted
    # n-gram -> the position just after its latest occurrence whose continuation is known
    # (the index is one token behind the sequence, so the current suffix never finds itself)
    _index: dict[tuple[int, ...], int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if self.max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {self.max_draft}")
        self._limit = self.max_draft
        toks, self.tokens = self.tokens, []
        self.extend(toks)

    def extend(self, toks: Sequence[int]) -> None:
        for t in toks:
            self.tokens.append(int(t))
            end = len(self.tokens) - 1  # n-grams ending before the newest token: their continuation is known
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end >= n:
                    self._index[tuple(self.tokens[end - n : end])] = end

    def draft(self, room: int | None = None) -> list[int]:
        """Up to min(the adapted length, room) tokens guessed to follow the sequence, or []
        when no suffix of ngram_min.. ngram_max tokens occurred before."""
        k = self._limit if room is None else min(self._limit, room)
        if k < 1:
            return []
        toks = self.tokens
        for n in range(min(self.ngram_max, len(toks)), self.ngram_min - 1, -1):
            at = self._index.get(tuple(toks[len(toks) - n :]))
            if at is not None:
                out = toks[at : at + k]
                self.drafted += len(out)
                return out
        return []

    def kept(self, proposed: int, accepted: int) -> None:
        """The last draft had `proposed` tokens, of which the first `accepted` were kept: a
        draft kept whole doubles the next one's length (up to max_draft), one cut short
        shrinks it to one more than it kept."""
        self.accepted += accepted
        if proposed == 0:
            return
        self._limit = min(self.max_draft, 2 * self._limit) if accepted == proposed else max(1, accepted + 1)
