"""Speculative decoding by prompt lookup: drafts come from the latest earlier occurrence of the
sequence's last n-gram, and decoding with drafts gives the tokens, log-probabilities, text and
finish of decoding without them, for greedy and sampled requests, at stop strings, max_tokens
and the end of the context, in fewer forward passes."""

from __future__ import annotations

import numpy as np
import pytest
from _flat_costs import FlatCosts

from pyinfer import Model
from pyinfer.generate import context_pool
from pyinfer.lookup import MAX_MATCH, PassCosts, PromptLookup, prior_cost

# A prompt the model continues by copying: a list it has seen twice.
PATTERN = "red, green, blue, yellow, purple, orange, pink, brown, " * 3 + "red, green,"
CODE_TASK = [{"role": "user", "content": "Repeat this line exactly: the quick brown fox jumps over the lazy dog "
              "and the quick brown fox jumps over the lazy dog again."}]


def flat_costs() -> PassCosts:
    """Costs measured as a machine where every pass costs one step would show."""
    c = PassCosts()
    for _ in range(PassCosts.TRUST):
        for rows in range(1, 10):
            c.observe(rows, 0.004)
    return c


def test_candidates_follow_the_latest_earlier_occurrence():
    lk = PromptLookup(max_draft=3, ngram_max=3, ngram_min=2)
    lk.extend([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3])
    # the suffix [1, 2, 3] occurred at 0; [2, 3] later at 6 (followed by 7, 8): the longest wins
    assert lk.candidates() == ([4, 5, 9], 3)
    lk.extend([4, 6])
    assert lk.candidates() == ([], 0)  # [4, 6] and [6] never occurred before
    lk.extend([2, 3])
    # [6, 2, 3] unseen; of [2, 3]'s occurrences (at 1, 6, 11) the latest, followed by 4, 6, 2
    assert lk.candidates() == ([4, 6, 2], 2)
    assert lk.candidates(room=1) == ([4], 2)
    assert lk.candidates(room=0) == ([], 0)


def test_the_current_suffix_never_matches_itself():
    lk = PromptLookup(ngram_min=1, ngram_max=2)
    lk.extend([5, 6])
    assert lk.candidates() == ([], 0)
    lk.extend([5])
    assert lk.candidates() == ([6, 5], 1)


def test_a_match_extends_back_beyond_the_ngram():
    lk = PromptLookup(max_draft=2, ngram_max=2, ngram_min=1)
    lk.extend([7, 8, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4])
    assert lk.candidates() == ([5, 6], 4)  # the 2-gram [3, 4], and [1, 2] before it too
    long = list(range(100, 140))
    lk.extend([*long, 9, *long])
    assert lk.candidates() == ([9, 100], MAX_MATCH)  # capped


def test_draft_length_weighs_cost_against_the_chance_of_keeping():
    seq = [*range(50, 70), 1, *range(50, 70)]
    # Passes that cost what one step costs: every candidate is worth sending.
    lk = PromptLookup(max_draft=8, costs=flat_costs())
    lk.extend(seq[:30])
    assert lk.draft() == seq[9:17]  # what followed 58 the first time
    assert lk.drafted == 8
    # Each row a full step: no draft can beat a plain step, however sure.
    steep = PassCosts()
    for _ in range(5):
        steep.observe(1, 0.004)
        for rows in range(2, 10):
            steep.observe(rows, 0.004 * rows)
    assert [steep.ratio(r) for r in (2, 5, 9)] == pytest.approx([2.0, 5.0, 9.0])
    lk = PromptLookup(max_draft=8, costs=steep)
    lk.extend(seq[:30])
    assert lk.candidates()[0] and lk.draft() == []
    # The prior (a fifth of a step per row): a long match is worth more rows than a short one.
    lk = PromptLookup(max_draft=8)
    lk.extend(seq[:22])  # a 1-token match (50), then 51 guessed after it
    short = len(lk.draft())
    lk.extend(seq[22:30])
    assert 1 <= short < len(lk.draft())


def test_the_chance_of_keeping_is_learned_from_every_candidate():
    lk = PromptLookup(max_draft=4, ngram_min=1, ngram_max=1, costs=flat_costs())
    lk.extend([1, 2, 3, 4, 5, 6])
    prior = lk.keep_chance(1)
    for t in (7, 1, 9):  # after 1 came 2; the sequence goes on with 9 instead
        lk.extend([t])
    assert lk.candidates() == ([], 0)
    lk.extend([1])
    assert lk.draft() == [9, 1]  # the latest occurrence of 1 was followed by 9, 1 (a 1-token match)
    lk.extend([8])  # and now by 8: the guess is scored when the sampled token arrives
    assert lk.keep_chance(1) < prior
    # Candidates not sent are scored too: with steep costs nothing is sent, yet a copied run
    # raises the estimate at the match lengths it passes through.
    steep = PassCosts()
    for _ in range(3):
        steep.observe(1, 0.001)
    for rows in range(2, 10):
        for _ in range(3):
            steep.observe(rows, 0.001 * rows)
    lk = PromptLookup(max_draft=4, costs=steep)
    run = list(range(200, 220))
    lk.extend([*run, 5, 200, 201])
    before = [lk.keep_chance(n) for n in (2, 3, 4, 5)]
    assert lk.draft() == [] and lk.candidates()[0] == [202, 203, 204, 205]
    lk.draft()
    lk.extend(run[2:8])
    after = [lk.keep_chance(n) for n in (2, 3, 4, 5)]
    assert all(a > b for a, b in zip(after, before))
    assert lk.keep_chance(6) == pytest.approx(PromptLookup().keep_chance(6))  # never tried


def test_pass_costs_are_medians_on_a_line():
    c = PassCosts()
    assert c.ratio(1) == 1.0 and c.ratio(2) == pytest.approx(prior_cost(2))
    for _ in range(5):
        c.observe(3, 0.01)  # one row count alone: no line through it yet
    assert c.ratio(3) == pytest.approx(prior_cost(3))
    c = PassCosts()
    for s in (0.004, 0.004, 0.5, 0.004):  # a preempted step does not move the median
        c.observe(1, s)
    for _ in range(40):
        c.observe(2, 0.0044)
        c.observe(6, 0.006)
    c.observe(6, 1.0)  # nor a preempted pass
    c.observe(5, 0.1)  # nor a row count timed once
    # the line through (1, 4 ms), (2, 4.4 ms) and (6, 6 ms)
    assert [c.ratio(r) for r in (1, 2, 6)] == pytest.approx([1.0, 1.1, 1.5])
    assert c.ratio(4) == pytest.approx(1.3)  # never measured: read off the line
    assert c.ratio(1000) == c.ratio(c.max_rows)
    for bad in ((0, 0.01), (2, 0.0), (2, float("nan")), (2, float("inf")), (1000, 0.01)):
        c.observe(*bad)
    assert c.ratio(4) == pytest.approx(1.3)
    # Passes shared by many sequences (never one row alone) give the line as well.
    shared = PassCosts()
    for _ in range(3):
        for rows in (8, 10, 12):
            shared.observe(rows, 0.002 + 0.0005 * rows)
    assert shared.ratio(10) / shared.ratio(8) == pytest.approx(7 / 6)


def test_bad_lookup_parameters():
    with pytest.raises(ValueError, match="max_draft"):
        PromptLookup(max_draft=0)
    with pytest.raises(ValueError, match="ngram_min"):
        PromptLookup(ngram_min=3, ngram_max=2)


@pytest.fixture(scope="module")
def fast(default_model):
    m = Model.load(default_model, n_ctx=512, precision="fast")
    context_pool(m).costs = FlatCosts()  # drafts sent whatever this machine's timings say
    return m


def same(a, b):
    assert (a.token_ids, a.text, a.logprobs, a.finish_reason, a.stop_reason) == (
        b.token_ids, b.text, b.logprobs, b.finish_reason, b.stop_reason)


@pytest.mark.parametrize("kw", [{"temperature": 0}, {"temperature": 0.8, "seed": 11}, {"temperature": 1.5, "seed": 3,
                                                                                        "top_k": 0}])
def test_drafted_output_is_plain_output(fast, kw):
    plain = fast.generate(PATTERN, max_tokens=48, draft=0, logprobs=2, **kw)
    drafted = fast.generate(PATTERN, max_tokens=48, draft=8, logprobs=2, **kw)
    same(drafted, plain)
    assert plain.timings.draft_tokens == 0
    t = drafted.timings
    assert 0 < t.draft_accepted <= t.draft_tokens
    if kw["temperature"] == 0:
        assert t.draft_accepted >= 16  # the list is copied


def test_chat_stream_and_stops(fast):
    plain = fast.chat(CODE_TASK, max_tokens=40, temperature=0, draft=0)
    drafted = fast.chat(CODE_TASK, max_tokens=40, temperature=0, draft=8)
    same(drafted, plain)
    chunks = list(fast.generate(PATTERN, max_tokens=40, temperature=0, draft=8, stream=True))
    want = list(fast.generate(PATTERN, max_tokens=40, temperature=0, draft=0, stream=True))
    assert "".join(c.text for c in chunks) == "".join(c.text for c in want)
    assert [t for c in chunks for t in c.token_ids] == [t for c in want for t in c.token_ids]
    # A stop string and max_tokens inside a draft end the request where plain decoding does.
    for kw in ({"stop": ["purple"]}, {"max_tokens": 5}, {"max_tokens": 0}):
        args = {"max_tokens": 40, "temperature": 0, **kw}
        same(fast.generate(PATTERN, draft=8, **args), fast.generate(PATTERN, draft=0, **args))


def test_the_end_of_the_context_inside_a_draft(default_model):
    small = Model.load(default_model, n_ctx=80, precision="fast")
    context_pool(small).costs = FlatCosts()
    ids = small.tokenize(PATTERN)
    assert 40 < len(ids) < 80
    a = small.generate(ids, max_tokens=None, temperature=0, draft=8)
    b = small.generate(ids, max_tokens=None, temperature=0, draft=0)
    same(a, b)
    # the cache holds all but the last token sampled
    assert a.finish_reason == "length" and len(ids) + len(a.token_ids) == 81 and a.timings.draft_accepted > 0


def test_bad_draft_values(fast):
    for bad in (-1, 65, 2.5, True):
        with pytest.raises(ValueError, match="draft must be an int"):
            fast.generate("hi", draft=bad)


def test_a_pass_writes_its_rows_into_a_given_buffer(fast):
    ids = fast.tokenize(PATTERN)[:6]
    ctx = fast.context()
    want = ctx.eval(ids, all_logits=True)
    ctx.reset()
    buf = np.full((8, fast.n_vocab), np.nan, np.float32)
    got = ctx.eval(ids, all_logits=True, out=buf[:6])
    assert np.shares_memory(got, buf) and np.array_equal(got, want) and np.isnan(buf[6:]).all()
    for bad in (buf[:5], buf[:6].astype(np.float64), buf[:6, ::2], np.asfortranarray(buf[:6])):
        with pytest.raises(ValueError, match="out must be"):
            ctx.eval(ids, all_logits=True, out=bad)
    with pytest.raises(ValueError, match="out is for all_logits"):
        ctx.eval(ids, out=buf[:6])
    assert ctx.n_past == 6  # a refused call evaluates nothing
