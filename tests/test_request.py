"""The Request on its own, stepped from outside with logits rows the test makes: what each
step returns, finishing on length, a full sequence and cancellation, misuse after the end,
and several requests stepped in turn (as a batching scheduler will) giving what each gives
alone through generate(); stop strings bounded and scanned incrementally."""

from __future__ import annotations

from pathlib import Path

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyinfer import CancelToken, ContextOverflowError, SamplingParams, Tokenizer
from pyinfer.errors import ParameterTypeError
from pyinfer.generate import generate
from pyinfer.gguf import GGUFReader
from pyinfer.request import MAX_STOP_CHARS, MAX_STOP_STRINGS, Request, StepResult, StopScanner, _scan

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tok(default_model: Path) -> Tokenizer:
    with GGUFReader(default_model) as r:
        return Tokenizer(r.metadata)


def onehot(tok: Tokenizer, i: int) -> np.ndarray:
    row = np.full(tok.vocab_size, -20.0, np.float32)
    row[i] = 20.0
    return row


def run_alone(tok: Tokenizer, req: Request, script: list[int]) -> list[StepResult]:
    """Step `req` with logits that spell `script`, then the EOS; returns every step."""
    steps = [req.step(onehot(tok, script[0]))]
    k = 1
    while not steps[-1].finished:
        assert steps[-1].token == script[k - 1]
        steps.append(req.step(onehot(tok, script[k] if k < len(script) else tok.eos_id)))
        k += 1
    return steps


def test_steps_hand_back_the_token_to_evaluate_and_the_text(tok: Tokenizer):
    script = tok.tokenize("Hello world")
    req = Request(tok, tok.tokenize("Hi"), GREEDY, n_ctx=64)
    assert req.prefill_ids() == tok.tokenize("Hi")
    steps = run_alone(tok, req, script)
    assert [s.token for s in steps] == script + [None]
    assert [s.finished for s in steps] == [False] * len(script) + [True]
    text = "".join(s.chunk.text for s in steps if s.chunk is not None)
    assert text == "Hello world"
    last = steps[-1].chunk
    assert last is not None and (last.finish_reason, last.stop_reason) == ("stop", tok.eos_id)
    assert req.finished and req.finish_reason == "stop"
    assert last.timings is not None and last.timings.sampled_tokens == len(script) + 1
    with pytest.raises(RuntimeError, match="has finished"):
        req.step(onehot(tok, script[0]))


def test_the_last_token_that_fits_finishes_with_length(tok: Tokenizer):
    prompt = tok.tokenize("one two")
    req = Request(tok, prompt, GREEDY, n_ctx=len(prompt) + 2)
    a, b, c = (tok.tokenize(x)[0] for x in "abc")
    s1, s2 = req.step(onehot(tok, a)), req.step(onehot(tok, b))
    assert (s1.token, s2.token) == (a, b) and not s2.finished
    # both positions are used now: the third token is sampled but cannot be evaluated
    s3 = req.step(onehot(tok, c))
    assert (s3.token, s3.finished, req.finish_reason) == (None, True, "length")
    assert s3.chunk is not None and s3.chunk.token_ids == [c]


def test_max_tokens_zero_finishes_at_the_first_step(tok: Tokenizer):
    req = Request(tok, [1, 2], GREEDY, n_ctx=8, max_tokens=0)
    s = req.step(onehot(tok, 5), eval_s=0.25)
    assert s.finished and s.token is None and s.chunk is not None
    assert (s.chunk.text, s.chunk.token_ids, s.chunk.finish_reason) == ("", [], "length")
    assert s.chunk.timings is not None and s.chunk.timings.prefill_s == 0.25


def test_abort_and_a_cancelled_token(tok: Tokenizer):
    token = CancelToken()
    req = Request(tok, [1], GREEDY, n_ctx=8, cancel=token)
    first = req.step(onehot(tok, tok.tokenize("x")[0]))
    assert not first.finished
    token.cancel()
    assert req.cancelled
    end = req.abort()
    assert end.finished and end.chunk is not None and end.chunk.finish_reason == "cancelled"
    with pytest.raises(RuntimeError):
        req.abort()
    # cancelled before the first step: that step samples nothing
    token = CancelToken()
    token.cancel()
    req = Request(tok, [1], GREEDY, n_ctx=8, cancel=token)
    s = req.step(onehot(tok, 3))
    assert s.finished and req.finish_reason == "cancelled" and s.chunk.token_ids == []


@pytest.mark.parametrize(
    "kw, error",
    [
        ({"n_ctx": 0}, ValueError),
        ({"n_ctx": 8, "n_past": 9}, ValueError),
        ({"n_ctx": 8, "n_past": -1}, ValueError),
        ({"n_ctx": 8.0}, ParameterTypeError),
        ({"n_ctx": 8, "max_tokens": -1}, ValueError),
        ({"n_ctx": 8, "stop": [""]}, ValueError),
        ({"n_ctx": 8, "stop": ["x"] * (MAX_STOP_STRINGS + 1)}, ValueError),
        ({"n_ctx": 8, "stop": ["x" * (MAX_STOP_CHARS + 1)]}, ValueError),
        ({"n_ctx": 8, "stop": 5}, ParameterTypeError),
        ({"n_ctx": 2**31}, ValueError),
        ({"n_ctx": 8, "n_past": 2**40}, ValueError),
        ({"n_ctx": 8, "max_tokens": 2**70}, ValueError),
        ({"n_ctx": 2}, ContextOverflowError),
        ({"n_ctx": 8, "n_past": 6}, ContextOverflowError),
    ],
)
def test_arguments_are_checked_when_the_request_is_made(tok: Tokenizer, kw, error):
    with pytest.raises(error):
        Request(tok, [1, 2, 3], **kw)


def test_requests_stepped_in_turn_match_each_alone(tok: Tokenizer):
    """Three sampled requests advanced round-robin, each fed its own rows, give the tokens
    each gives alone through generate() on a context that returns the same rows."""
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((3, 12, tok.vocab_size)) * 3).astype(np.float32)

    class Rows:
        def __init__(self, r: int) -> None:
            self.r, self.n_past, self.n_ctx = r, 0, 64

        def eval(self, ids: list[int]) -> np.ndarray:
            self.n_past += len(ids)
            return rows[self.r, self.n_past - 3]

        def reset(self) -> None:
            self.n_past = 0

    params = [SamplingParams(seed=s, top_k=0, logprobs=1) for s in (1, 2, 3)]
    alone = [
        generate(Rows(r), tok, [1, 2, 3], params[r], max_tokens=10 - r).token_ids
        for r in range(3)
    ]
    reqs = [Request(tok, [1, 2, 3], params[r], n_ctx=64, max_tokens=10 - r) for r in range(3)]
    got: list[list[int]] = [[], [], []]
    pos = [0, 0, 0]
    while not all(q.finished for q in reqs):
        for r, q in enumerate(reqs):
            if q.finished:
                continue
            s = q.step(rows[r, pos[r]])
            pos[r] += 1
            if s.chunk is not None:
                got[r] += s.chunk.token_ids
    assert got == alone and all(len(g) == 10 - r for r, g in enumerate(got))


def test_stop_strings_are_bounded_with_the_field_named(tok: Tokenizer):
    with pytest.raises(ValueError, match=rf"^stop has 17 strings, more than the {MAX_STOP_STRINGS}"):
        Request(tok, [1], n_ctx=8, stop=[str(i) for i in range(17)])
    with pytest.raises(ValueError, match=rf"^stop: a stop string has 1025 characters.*{MAX_STOP_CHARS}"):
        Request(tok, [1], n_ctx=8, stop=["a" * 1025])
    ok = Request(tok, [1], n_ctx=8, stop=["a" * MAX_STOP_CHARS] * MAX_STOP_STRINGS)
    assert len(ok.stops) == MAX_STOP_STRINGS


def reference_stream(pieces: list[str], stops: list[str]) -> tuple[list[str], str | None]:
    """What _scan gives over a stream, rescanning the held text at every piece."""
    out, held = [], ""
    for p in pieces:
        emit, held, hit = _scan(held + p, stops)
        out.append(emit)
        if hit is not None:
            return out, hit
    emit, _, hit = _scan(held, stops, final=True)
    return out + [emit], hit


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.text("abc", max_size=4), max_size=12),
    st.lists(st.text("abc", min_size=1, max_size=5), min_size=1, max_size=4),
)
def test_stop_scanner_matches_the_rescanning_definition(pieces: list[str], stops: list[str]):
    sc = StopScanner(stops)
    out: list[str] = []
    hit = None
    for p in pieces:
        emit, hit = sc.feed(p)
        out.append(emit)
        if hit is not None:
            break
    else:
        emit, hit = sc.feed("", final=True)
        out.append(emit)
    assert (out, hit) == reference_stream(pieces, stops)


def test_long_stop_strings_cost_little_per_piece():
    # The stream keeps matching all but the last character of the last string, so 1023
    # characters stay held; rescanning them against the other 15 strings, which never
    # match, costs ~15 x 1023 comparisons per piece.
    n = MAX_STOP_CHARS
    stops = ["b" + "a" * (n - 1)] * (MAX_STOP_STRINGS - 1) + ["a" * (n - 1) + "b"]
    sc = StopScanner(stops)
    t = time.perf_counter()
    for _ in range(3000):
        emit, hit = sc.feed("a")
        assert hit is None
    assert len(sc.held) == n - 1 and emit == "a"
    assert time.perf_counter() - t < 2.0  # ~0.05 s; rescanning takes minutes
    assert sc.feed("b") == ("", stops[-1])


def test_max_tokens_out_of_range_names_the_field_and_the_range(tok: Tokenizer):
    with pytest.raises(ValueError, match=rf"^max_tokens must be in \[0, 2147483647\].*, got {2**70}$"):
        Request(tok, [1], n_ctx=8, max_tokens=2**70)
