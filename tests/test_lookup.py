"""Speculative decoding by prompt lookup: drafts come from the latest earlier occurrence of the
sequence's last n-gram, and decoding with drafts gives the tokens, log-probabilities, text and
finish of decoding without them, for greedy and sampled requests, at stop strings, max_tokens
and the end of the context, in fewer forward passes."""

from __future__ import annotations

import pytest

from pyinfer import Model
from pyinfer.lookup import PromptLookup

# A prompt the model continues by copying: a list it has seen twice.
PATTERN = "red, green, blue, yellow, purple, orange, pink, brown, " * 3 + "red, green,"
CODE_TASK = [{"role": "user", "content": "Repeat this line exactly: the quick brown fox jumps over the lazy dog "
              "and the quick brown fox jumps over the lazy dog again."}]


def test_drafts_follow_the_latest_earlier_occurrence():
    lk = PromptLookup(max_draft=3, ngram_max=3, ngram_min=2)
    lk.extend([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3])
    # the suffix [1, 2, 3] occurred at 0; [2, 3] later at 6 (followed by 7, 8): the longest wins
    assert lk.draft() == [4, 5, 9]
    lk.kept(3, 1)  # one kept: the next draft is two long
    lk.extend([4, 6])
    assert lk.draft() == []  # [4, 6] and [6] never occurred before
    lk.extend([2, 3])
    # [6, 2, 3] unseen; of [2, 3]'s occurrences (at 1, 6, 11) the latest, followed by 4, 6
    assert lk.draft() == [4, 6]
    assert lk.draft(room=1) == [4]
    assert lk.drafted == 6


def test_the_current_suffix_never_matches_itself():
    lk = PromptLookup(ngram_min=1, ngram_max=2)
    lk.extend([5, 6])
    assert lk.draft() == []
    lk.extend([5])
    assert lk.draft() == [6, 5]


def test_draft_length_adapts():
    lk = PromptLookup(max_draft=8)
    lk.kept(8, 2)
    lk.extend([1, 2, 3, 1, 2])
    assert lk.draft() == [3, 1, 2]  # three: one more than kept, and all the sequence has
    lk.kept(3, 3)
    assert lk._limit == 6
    with pytest.raises(ValueError, match="max_draft"):
        PromptLookup(max_draft=0)
    with pytest.raises(ValueError, match="ngram_min"):
        PromptLookup(ngram_min=3, ngram_max=2)


@pytest.fixture(scope="module")
def fast(default_model):
    return Model.load(default_model, n_ctx=512, precision="fast")


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
