"""The decode loop, driven by a scripted context whose logits put all the mass on chosen
tokens: stop strings split across tokens, UTF-8 held back, end-of-turn tokens, max_tokens,
a full context, prompt overflow and truncation, cancellation from another thread and by
closing the stream, chunked prefill, logprobs and timings. The real model's end-to-end
runs live with the model's tests."""

from __future__ import annotations

import functools
import operator
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pyinfer import CancelToken, ContextOverflowError, Tokenizer
from pyinfer.errors import ParameterTypeError
from pyinfer.generate import Completion, CompletionChunk, generate
from pyinfer.gguf import GGUFReader
from pyinfer.request import _scan
from pyinfer.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


class ScriptedContext:
    """A deterministic stand-in for a model context: once the prompt (prompt_len tokens) is
    in, the logits row after each position puts all the mass on the next token of
    `script`, then on `end`. Records every eval call."""

    def __init__(
        self,
        script: list[int],
        prompt_len: int,
        n_vocab: int,
        end: int,
        n_ctx: int = 256,
        on_eval=None,
    ) -> None:
        self.script, self.prompt_len, self.n_vocab, self.end = script, prompt_len, n_vocab, end
        self.n_ctx = n_ctx
        self.n_past = 0
        self.evals: list[list[int]] = []
        self.on_eval = on_eval  # called after each eval with this context

    def eval(self, ids: list[int]) -> np.ndarray:
        assert isinstance(ids, list) and ids
        assert self.n_past + len(ids) <= self.n_ctx, "evaluated past the context"
        self.n_past += len(ids)
        self.evals.append(list(ids))
        k = self.n_past - self.prompt_len
        row = np.full(self.n_vocab, -20.0, np.float32)
        if k >= 0:
            row[self.script[k] if k < len(self.script) else self.end] = 20.0
        if self.on_eval is not None:
            self.on_eval(self)
        return row

    def reset(self) -> None:
        self.n_past = 0
        self.evals.clear()


@pytest.fixture(scope="module")
def tok(default_model: Path) -> Tokenizer:
    with GGUFReader(default_model) as r:
        return Tokenizer(r.metadata)


@pytest.fixture(scope="module")
def byte_ids(tok: Tokenizer) -> dict[int, int]:
    """A token id for each single byte the vocabulary has (to split text anywhere)."""
    out: dict[int, int] = {}
    for i in range(tok.vocab_size):
        b = tok.token_bytes(i)
        if len(b) == 1 and not tok.is_control(i):
            out.setdefault(b[0], i)
    return out


@pytest.fixture
def run(tok: Tokenizer, byte_ids: dict[int, int]):
    """run(text, prompt="Hi", **kw): generate a script that spells `text` a byte per token
    (or the given ids); returns (result, context)."""

    def _run(script, prompt="Hi", params=GREEDY, n_ctx=256, end=None, on_eval=None, **kw):
        if isinstance(script, str):
            script = [byte_ids[b] for b in script.encode()]
        prompt_ids = tok.tokenize(prompt) if isinstance(prompt, str) else prompt
        ctx = ScriptedContext(
            script,
            len(prompt_ids),
            tok.vocab_size,
            tok.eos_id if end is None else end,
            n_ctx=n_ctx,
            on_eval=on_eval,
        )
        return generate(ctx, tok, prompt_ids, params, **kw), ctx

    return _run


def texts(chunks: list[CompletionChunk]) -> list[str]:
    return [c.text for c in chunks]


# ---- plain runs and end-of-turn


def test_greedy_run_until_eos(run, tok: Tokenizer):
    script = tok.tokenize("Hello world, this is a test.")
    out, ctx = run(script)
    assert isinstance(out, Completion)
    assert out.text == "Hello world, this is a test."
    assert out.token_ids == script  # the EOS is not part of the output
    assert (out.finish_reason, out.stop_reason) == ("stop", tok.eos_id)
    assert out.prompt_tokens == 1 and out.truncated_tokens == 0 and out.seed is None
    # every generated token but the EOS was evaluated after the prompt
    assert ctx.evals == [tok.tokenize("Hi")] + [[t] for t in script]


def test_any_end_of_turn_token_stops(run, tok: Tokenizer):
    for end in sorted(tok.eot_ids):
        out, _ = run("ok", end=end)
        assert (out.text, out.finish_reason, out.stop_reason) == ("ok", "stop", end)


def test_stream_chunks_add_up_to_the_completion(run, tok: Tokenizer):
    script = tok.tokenize("One two three four five")
    chunks = list(run(script, stream=True)[0])
    whole, _ = run(script)
    assert "".join(texts(chunks)) == whole.text
    assert functools.reduce(operator.iadd, (c.token_ids for c in chunks), []) == whole.token_ids
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert chunks[-1].timings is not None and all(c.timings is None for c in chunks[:-1])


def test_control_tokens_are_dropped_unless_special(run, tok: Tokenizer):
    im_start = tok.tokenize("<|im_start|>", add_bos=False, special=True)
    script = tok.tokenize("a") + im_start + tok.tokenize("b")
    assert run(script)[0].text == "ab"
    assert run(script, special=True)[0].text == "a<|im_start|>b"


# ---- stop strings


def test_stop_string_split_across_tokens_is_neither_emitted_nor_leaked(run):
    chunks = list(run("abc STOP def", stop=["STOP"], stream=True)[0])
    assert "".join(texts(chunks)) == "abc "
    assert all("S" not in t for t in texts(chunks))  # no prefix of the stop string shown
    last = chunks[-1]
    assert (last.finish_reason, last.stop_reason) == ("stop", "STOP")
    out, ctx = run("abc STOP def", stop="STOP")
    assert out.text == "abc " and out.stop_reason == "STOP"
    # generation ended on the P: the tokens that spelled the stop string are in token_ids
    assert len(out.token_ids) == len("abc STOP")
    assert ctx.n_past == 1 + len("abc STOP") - 1  # the last token is never evaluated


def test_text_held_back_is_released_when_it_stops_matching(run):
    chunks = list(run("xx STAR yy", stop=["STOP"], stream=True)[0])
    shown = texts(chunks)
    assert "".join(shown) == "xx STAR yy"
    # 'S' and 'ST' were held back and came out with the 'A' that ruled the stop string out
    assert "STA" in shown


def test_held_prefix_is_released_at_the_end(run):
    out, _ = run("see ST", stop=["STOP"])
    assert (out.text, out.finish_reason) == ("see ST", "stop")
    out, _ = run("see ST", stop=["STOP"], max_tokens=5)
    assert (out.text, out.finish_reason) == ("see S", "length")
    out, _ = run("see ST", stop=["STOP"], max_tokens=6)
    assert (out.text, out.finish_reason) == ("see ST", "length")


def test_the_earliest_stop_string_wins(run):
    out, _ = run("a;b.c", stop=[".", ";"])
    assert (out.text, out.stop_reason) == ("a", ";")
    out, _ = run("STOP now", stop=["STOP"])
    assert (out.text, out.finish_reason) == ("", "stop")
    out, _ = run("one\n\nUser: hi", stop=["\nUser:", "\n\n"])
    assert (out.text, out.stop_reason) == ("one", "\n\n")


def test_stop_string_inside_one_token(run, tok: Tokenizer):
    script = tok.tokenize(" Paris. The end")
    assert len(tok.tokenize(". The")) > 1
    out, _ = run(script, stop=["ris. T"])
    assert out.text == " Pa"


def test_scan_holds_the_longest_possible_start():
    assert _scan("abc", ["cd", "bcx"]) == ("a", "bc", None)
    assert _scan("abc", ["zz"]) == ("abc", "", None)
    assert _scan("abcd", ["cd"]) == ("ab", "", "cd")
    assert _scan("ab", ["b"]) == ("a", "", "b")
    assert _scan("abc", ["cd"], final=True) == ("abc", "", None)


# ---- UTF-8 across tokens


def test_characters_split_across_tokens_are_held_until_complete(run):
    text = "é😀 ü"  # 2 + 4 + 1 + 2 bytes, one byte per token
    chunks = list(run(text, stream=True)[0])
    shown = texts(chunks)
    assert "".join(shown) == text
    assert all("\ufffd" not in t for t in shown)
    # one chunk per complete character: the lead bytes produced no text of their own
    assert shown[:-1] == ["é", "😀", " ", "ü"]
    assert [len(c.token_ids) for c in chunks[:-1]] == [2, 4, 1, 2]


def test_stop_string_split_inside_a_character(run):
    out, _ = run("abcé😀def", stop=["é😀"])
    assert (out.text, out.stop_reason) == ("abc", "é😀")
    chunks = list(run("abcé😀def", stop=["😀d"], stream=True)[0])
    assert "".join(texts(chunks)) == "abcé"


def test_unfinished_character_at_the_end_becomes_a_replacement(run, byte_ids):
    out, _ = run([byte_ids[ord("a")], byte_ids[0xF0], byte_ids[0x9F]])
    assert out.text == "a\ufffd"


# ---- length limits


def test_max_tokens(run):
    out, ctx = run("abcdefgh", max_tokens=3)
    assert (out.text, out.finish_reason, out.stop_reason) == ("abc", "length", None)
    assert len(out.token_ids) == 3
    assert ctx.n_past == 1 + 2  # the prompt and all but the last token
    out, ctx = run("abcdefgh", max_tokens=0)
    assert (out.text, out.token_ids, out.finish_reason) == ("", [], "length")
    assert ctx.n_past == 1 and out.timings.ttft_s is None


def test_a_full_context_finishes_with_length_not_an_error(run, tok: Tokenizer):
    prompt = tok.tokenize("one two three four")
    out, ctx = run("abcdefghijklmnop", prompt=prompt, n_ctx=len(prompt) + 4)
    # 4 free positions: 4 tokens evaluated, a 5th sampled from the last logits
    assert (out.text, out.finish_reason) == ("abcde", "length")
    assert ctx.n_past == ctx.n_ctx
    chunks = list(run("abcdefghijklmnop", prompt=prompt, n_ctx=len(prompt), stream=True)[0])
    assert "".join(texts(chunks)) == "a" and chunks[-1].finish_reason == "length"


def test_a_prompt_longer_than_the_context_raises(run, tok: Tokenizer):
    prompt = tok.tokenize("a b c d e f g h i j")
    with pytest.raises(ContextOverflowError, match=rf"{len(prompt)} tokens.*n_ctx = 8") as e:
        run("x", prompt=prompt, n_ctx=8)
    assert isinstance(e.value, ValueError)
    assert (e.value.n_tokens, e.value.n_ctx) == (len(prompt), 8)
    # raised at the call, also for a stream, before anything is evaluated
    with pytest.raises(ContextOverflowError):
        run("x", prompt=prompt, n_ctx=8, stream=True)


def test_truncate_left_keeps_the_latest_tokens(tok: Tokenizer):
    prompt = list(range(100, 120))  # 20 tokens
    # 16 positions, max_tokens=4: the last 12 prompt tokens stay
    ctx = ScriptedContext([tok.tokenize("z")[0]] * 10, 12, tok.vocab_size, tok.eos_id, n_ctx=16)
    out = generate(ctx, tok, prompt, GREEDY, max_tokens=4, truncate="left")
    assert ctx.evals[0] == prompt[-12:]
    assert (out.prompt_tokens, out.truncated_tokens) == (12, 8)
    assert (out.text, out.finish_reason) == ("zzzz", "length")
    # without max_tokens: half the context is kept for the answer
    ctx = ScriptedContext([], 8, tok.vocab_size, tok.eos_id, n_ctx=16)
    out = generate(ctx, tok, prompt, GREEDY, truncate="left")
    assert ctx.evals[0] == prompt[-8:] and out.truncated_tokens == 12


# ---- argument checks


@pytest.mark.parametrize(
    "prompt, error, match",
    [
        ([], ValueError, "empty"),
        ([1, 49152], ValueError, r"prompt token 1 has id 49152, out of range"),
        ([-1], ValueError, "out of range"),
        ("Hello", ParameterTypeError, "tokenize the text first"),
        ([1.0, 2.0], ParameterTypeError, "ints"),
        ([True], ParameterTypeError, "bools"),
        (np.array([1.5]), ParameterTypeError, "integer array"),
    ],
)
def test_invalid_prompts(tok: Tokenizer, prompt, error, match):
    ctx = ScriptedContext([], 1, tok.vocab_size, tok.eos_id)
    with pytest.raises(error, match=match):
        generate(ctx, tok, prompt)
    assert ctx.evals == []


@pytest.mark.parametrize(
    "kw, error",
    [
        ({"max_tokens": -1}, ValueError),
        ({"max_tokens": 2.5}, ParameterTypeError),
        ({"stop": [""]}, ValueError),
        ({"stop": [3]}, ParameterTypeError),
        ({"n_batch": 0}, ValueError),
        ({"truncate": "right"}, ValueError),
        ({"cancel": threading.Event()}, ParameterTypeError),
    ],
)
def test_invalid_arguments(tok: Tokenizer, kw, error):
    ctx = ScriptedContext([], 1, tok.vocab_size, tok.eos_id)
    with pytest.raises(error):
        generate(ctx, tok, [1], **kw)


def test_numpy_prompts_are_accepted(run, tok: Tokenizer):
    out, ctx = run("ok", prompt=np.array(tok.tokenize("Hi there"), np.int64))
    assert out.text == "ok" and ctx.evals[0] == tok.tokenize("Hi there")


# ---- prefill in chunks, cancellation


def test_prefill_runs_in_chunks_of_n_batch(run):
    prompt = list(range(300, 325))  # 25 tokens
    out, ctx = run("ab", prompt=prompt, n_batch=10)
    assert ctx.evals[:3] == [prompt[:10], prompt[10:20], prompt[20:]]
    assert out.text == "ab" and out.timings.prompt_tokens == 25


def test_closing_the_stream_stops_at_once(run):
    stream, ctx = run("abcdefghijklmnopqrstuvwxyz", stream=True)
    assert next(stream).text == "a" and next(stream).text == "b"
    n = len(ctx.evals)
    stream.close()
    assert len(ctx.evals) == n
    with pytest.raises(StopIteration):
        next(stream)


def _cancel_from_another_thread_at(step: int, token: CancelToken):
    """An on_eval hook: at eval number `step`, another thread cancels, and the eval returns
    only once it has (a decode step that is running when the cancel arrives)."""
    done = threading.Event()

    def hook(ctx) -> None:
        if len(ctx.evals) == step:

            def cancel() -> None:
                token.cancel()
                done.set()

            threading.Thread(target=cancel).start()
            assert done.wait(5)

    return hook


def test_cancel_from_another_thread_stops_within_one_decode_step(run):
    token = CancelToken()
    stream, ctx = run(
        "abcdefghijklmnop",
        cancel=token,
        stream=True,
        on_eval=_cancel_from_another_thread_at(4, token),
    )
    chunks = list(stream)
    # evals: the prompt, then 'a', 'b', 'c'; cancelled during the one for 'c'
    assert len(ctx.evals) == 4
    assert "".join(texts(chunks)) == "abc"
    assert chunks[-1].finish_reason == "cancelled"


def test_cancel_during_prefill_stops_after_the_running_chunk(run):
    token = CancelToken()
    prompt = list(range(300, 340))
    out, ctx = run(
        "abc",
        prompt=prompt,
        n_batch=8,
        cancel=token,
        on_eval=_cancel_from_another_thread_at(2, token),
    )
    assert ctx.evals == [prompt[:8], prompt[8:16]]
    assert (out.text, out.token_ids, out.finish_reason) == ("", [], "cancelled")
    assert out.timings.ttft_s is None


def test_cancel_from_a_thread_while_a_slow_model_runs(run):
    token = CancelToken()
    decoding = threading.Event()

    def slow(ctx) -> None:
        if len(ctx.evals) == 3:  # the prompt and two tokens evaluated: it is decoding
            decoding.set()
        time.sleep(0.02)

    result: list[Completion] = []
    worker = threading.Thread(
        target=lambda: result.append(run("a" * 200, cancel=token, on_eval=slow)[0])
    )
    worker.start()
    assert decoding.wait(30)
    t = time.perf_counter()
    token.cancel()
    worker.join(5)
    # Stopped within a step or so (0.02 s each), not after the 200 tokens (4 s).
    assert not worker.is_alive() and time.perf_counter() - t < 1.0
    assert result[0].finish_reason == "cancelled" and 0 < len(result[0].text) < 200


# ---- sampling through the loop


class NoisyContext(ScriptedContext):
    """Logits that differ at every position but not between runs."""

    def eval(self, ids: list[int]) -> np.ndarray:
        super().eval(ids)
        rng = np.random.default_rng(self.n_past)
        return (rng.standard_normal(self.n_vocab) * 3).astype(np.float32)


def test_seeded_generation_is_reproducible(tok: Tokenizer):
    def go(seed):
        ctx = NoisyContext([], 1, tok.vocab_size, tok.eos_id)
        return generate(ctx, tok, [1], SamplingParams(seed=seed, top_k=0), max_tokens=30)

    a, b, c = go(7), go(7), go(8)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    fresh = go(None)
    assert fresh.seed is not None and go(fresh.seed).token_ids == fresh.token_ids


def test_penalties_see_the_prompt_and_the_output(tok: Tokenizer):
    a_id = tok.tokenize("a")[0]

    class Flat(ScriptedContext):
        def eval(self, ids):
            super().eval(ids)
            row = np.zeros(self.n_vocab, np.float32)
            row[a_id], row[a_id + 1] = 2.0, 1.9
            return row

    ctx = Flat([], 1, tok.vocab_size, tok.eos_id)
    out = generate(
        ctx, tok, [a_id], SamplingParams(temperature=0, repeat_penalty=1.1), max_tokens=2
    )
    # 'a' is in the prompt: 2 / 1.1 < 1.9; then the other one is the repeat
    assert out.token_ids == [a_id + 1, a_id]
    ctx = Flat([], 1, tok.vocab_size, tok.eos_id)
    out = generate(ctx, tok, [5], SamplingParams(temperature=0, repeat_penalty=1.1), max_tokens=2)
    assert out.token_ids == [a_id, a_id + 1]


def test_logprobs_follow_the_tokens(run, tok: Tokenizer):
    params = SamplingParams(temperature=0, logprobs=2)
    out, _ = run("abc", params=params, stop=["c"])
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 3
    for lp, t in zip(out.logprobs, out.token_ids):
        assert lp.token == t and -1e-6 < lp.logprob <= 0
        assert lp.top[0][0] == t and len(lp.top) == 2
    chunks = list(run("abc", params=params, stream=True)[0])
    assert sum(len(c.logprobs) for c in chunks) == 3
    assert run("abc")[0].logprobs is None


# ---- timings


def test_timings_are_present_and_consistent(run, tok: Tokenizer):
    prompt = tok.tokenize("a longer prompt to prefill")
    started = time.perf_counter()
    time.sleep(0.01)

    def slow(ctx) -> None:
        time.sleep(0.002)

    out, _ = run("abcdefgh", prompt=prompt, on_eval=slow, started=started, tokenize_s=0.004)
    tm = out.timings
    assert tm.prompt_tokens == len(prompt) and tm.sampled_tokens == 9  # 8 + the EOS
    assert tm.tokenize_s == 0.004 and 0.005 < tm.queue_s < 1.0
    assert tm.ttft_s is not None and tm.ttft_s > tm.queue_s + tm.prefill_s
    assert tm.prefill_s >= 0.002 and tm.prefill_tokens_per_s > 0
    assert len(tm.token_intervals_s) == 9 and tm.token_intervals_s[0] == tm.ttft_s
    assert tm.decode_s == pytest.approx(sum(tm.token_intervals_s[1:]), rel=1e-6)
    assert tm.eval_s >= 8 * 0.002 and tm.eval_s + tm.sample_s <= tm.decode_s + tm.sample_s
    assert tm.decode_tokens_per_s == pytest.approx(8 / tm.decode_s)
    assert tm.ttft_s + tm.decode_s <= tm.total_s
    assert all(t > 0 for t in tm.token_intervals_s)


def test_timings_without_a_start_time(run):
    out, _ = run("ab")
    tm = out.timings
    assert tm.queue_s == 0.0 and tm.tokenize_s == 0.0
    assert 0 < tm.ttft_s <= tm.total_s and tm.sampled_tokens == 3
