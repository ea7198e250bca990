"""The serving engine: requests give the bits they give alone, whatever runs beside them,
however their prompts are chunked and whether their prefix comes from the cache; cancellation
frees their memory within a step, admission waits for memory (a context's KV cache) and
overload is refused."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest
from _flat_costs import FlatCosts

from pyinfer import Engine, Model, OverloadedError
from pyinfer.errors import ContextOverflowError


@contextlib.contextmanager
def scheduler_held(engine: Engine):
    """While inside, the engine's scheduler thread waits between steps (on a job of its queue):
    requests submitted meanwhile are all there for its next admission."""
    gate = threading.Event()
    fut: Future[None] = Future()
    with engine._cond:
        engine._jobs.append((gate.wait, fut))
        engine._cond.notify_all()
    try:
        yield
    finally:
        gate.set()
        fut.result(10)


def between_steps(engine: Engine, probe) -> None:
    """Run probe() on the scheduler thread before each of its steps (as a job of its queue)
    until it returns True: it sees the engine's state as one step left it, however slowly
    the test's own thread runs."""

    def job() -> None:
        if not probe():
            with engine._cond:
                engine._jobs.append((job, Future()))

    with engine._cond:
        engine._jobs.append((job, Future()))
        engine._cond.notify_all()


PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):",
    "List three colours:",
    "Water boils at",
    "The quick brown fox",
    "In the year 1969, astronauts first walked on the surface of the moon, and the world watched as",
    "Q: What is two plus two?\nA:",
    "My favourite fruit is",
    "Rain",
]
KW = {"max_tokens": 8, "temperature": 0.6, "logprobs": 2}


@pytest.fixture(scope="module")
def model(default_model):
    return Model.load(default_model, n_ctx=512)


def outputs(completions):
    return [(c.token_ids, c.text, c.logprobs, c.finish_reason) for c in completions]


def test_batched_requests_match_them_alone_bit_for_bit(model):
    alone = [model.generate(p, seed=100 + i, **KW) for i, p in enumerate(PROMPTS)]
    # Alone in an engine (one sequence at a time), then all together with prompts cut into
    # chunks of 8 tokens, so that sequences join the batch at different steps.
    with Engine(model, max_batch=1) as e:
        one = [e.submit(p, seed=100 + i, **KW).result(60) for i, p in enumerate(PROMPTS)]
    with Engine(model, max_batch=16, token_budget=8) as e:
        handles = [e.submit(p, seed=100 + i, **KW) for i, p in enumerate(PROMPTS)]
        together = [h.result(60) for h in handles]
        st = e.stats()
    assert all(c.logprobs for c in alone) and len({tuple(c.token_ids) for c in alone}) == len(PROMPTS)
    assert outputs(one) == outputs(alone)
    assert outputs(together) == outputs(alone)
    # They did share steps: far fewer steps than tokens, and the long prompts took several chunks.
    tokens = sum(c.timings.sampled_tokens for c in together)
    assert st.steps < tokens / 2
    assert st.requests_finished == len(PROMPTS) and st.context_bytes_in_use == 0 and st.running == 0


def test_prompt_in_chunks_gives_the_same_logits_as_whole(model):
    ids = model.tokenize(PROMPTS[6])
    assert len(ids) > 16
    whole = model.context(64).eval(ids).copy()
    ctx = model.context(64, n_batch=5)
    for i in range(0, len(ids), 5):
        chunked = ctx.eval(ids[i : i + 5])
    np.testing.assert_array_equal(chunked, whole)


def test_sync_and_async_streams_give_the_chunks_of_the_result(model):
    with Engine(model) as e:
        h = e.submit(PROMPTS[0], max_tokens=6, temperature=0)
        chunks = list(h)
        assert chunks[-1].finish_reason == "length" and all(c.finish_reason is None for c in chunks[:-1])
        c = h.result()
        assert "".join(ch.text for ch in chunks) == c.text and len(c.token_ids) == 6

        async def consume():
            h2 = e.submit(PROMPTS[0], max_tokens=6, temperature=0)
            return [ch async for ch in h2], await h2.aresult()

        achunks, ac = asyncio.run(consume())
    assert ac.text == c.text and ac.token_ids == c.token_ids and len(achunks) == len(chunks)
    t = ac.timings
    assert t.queue_s >= 0 and t.ttft_s is not None and t.ttft_s >= t.prefill_s > 0


def test_cancel_frees_the_kv_reservation_within_a_step(model):
    with Engine(model) as e:
        assert e.stats().context_bytes_in_use == 0
        h = e.submit(PROMPTS[1], max_tokens=400, temperature=0)
        next(h)
        st = e.stats()
        assert st.running == 1 and st.context_bytes_in_use == e.context_bytes_for(h.n_ctx) > 0
        at_cancel: list[int] = []

        def cancel() -> None:
            h.cancel()
            # Read after the cancel: the step running then ends, and the next one drops it.
            at_cancel.append(e.stats().steps)

        canceller = threading.Thread(target=cancel)  # from another thread
        canceller.start()
        rest = list(h)
        canceller.join(10)
        after = e.stats()
        assert rest[-1].finish_reason == "cancelled"
        assert after.context_bytes_in_use == 0 and after.running == 0
        assert after.steps - at_cancel[0] <= 2
        assert h.result().finish_reason == "cancelled" and len(h.result().token_ids) < 400

        async def cancel_in_loop():
            h2 = e.submit(PROMPTS[1], max_tokens=400, temperature=0)
            async for ch in h2:
                if ch.finish_reason is None:
                    h2.cancel()
            return await h2.aresult()

        c = asyncio.run(cancel_in_loop())
        assert c.finish_reason == "cancelled" and e.stats().context_bytes_in_use == 0


def test_admission_waits_for_memory_and_a_full_queue_is_refused(model):
    with Engine(model) as probe:
        one = probe.context_bytes_for(256)  # a short request's reservation
    with Engine(model, kv_budget_bytes=one + one // 2, max_queue=1) as e:
        # a runs to its max_tokens (its end-of-turn tokens banned; greedy, it ends in about
        # 30), so b waits for it however slowly this thread goes on.
        banned = {t: float("-inf") for t in model.tokenizer.eot_ids}
        a = e.submit(PROMPTS[0], max_tokens=200, temperature=0, logit_bias=banned)
        next(a)  # admitted and running
        b = e.submit(PROMPTS[3], max_tokens=5, temperature=0)
        with pytest.raises(OverloadedError, match="max_queue = 1") as ei:
            e.submit(PROMPTS[4], max_tokens=5, temperature=0)
        assert ei.value.retry_after > 0
        st = e.stats()
        assert st.running == 1 and st.waiting == 1
        a.cancel()
        cb = b.result(60)  # b runs once a has given its memory back
        assert cb.finish_reason == "length" and len(cb.token_ids) == 5
        assert cb.timings.queue_s > 0
        with pytest.raises(ValueError, match=r"context of 512 tokens .* budget"):
            e.submit(PROMPTS[0], max_tokens=None)


def test_a_budget_that_holds_no_context_is_refused_at_construction(model):
    with Engine(model) as probe:
        one = probe.context_bytes_for(256)  # the smallest context (ctx_granularity tokens)
    with pytest.raises(ValueError, match=rf"kv_budget_bytes = {one - 1} holds no context: the smallest "
                                         rf"\(256 tokens\) takes {one} bytes"):
        Engine(model, kv_budget_bytes=one - 1)
    Engine(model, kv_budget_bytes=one).close()


def test_a_reservation_is_the_kv_cache_and_the_step_scratch_is_shared(model):
    probe = Engine(model, max_batch=4, token_budget=64)
    need = probe.context_bytes_for(256)
    scratch = probe.stats().batch_scratch_bytes
    probe.close()
    kv = model.context(256, n_batch=1).kv_nbytes
    assert need == model.context_nbytes(256, 1) and kv < need < kv + kv // 100
    assert scratch == model.context_nbytes(256, 68) - model.context_nbytes(256, 0)  # 4 + 64 rows
    # Room for one short request and a half: the second waits for the first's context.
    with Engine(model, kv_budget_bytes=need + need // 2, max_queue=4) as e:
        # a runs to its max_tokens (its end-of-turn tokens banned): it holds its context
        # throughout, however fast the steps.
        banned = {t: float("-inf") for t in model.tokenizer.eot_ids}
        a = e.submit(PROMPTS[0], max_tokens=200, temperature=0, logit_bias=banned)
        next(a)
        b = e.submit(PROMPTS[3], max_tokens=5, temperature=0)
        seen: list = []
        # Five scheduler steps after b's submission, counted by the scheduler itself: b stays queued.
        between_steps(e, lambda: len(seen) == 5 or bool(seen.append(e.stats())))
        deadline = time.monotonic() + 60
        while len(seen) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        st = seen[-1]
        assert st.running == 1 and st.waiting == 1
        assert st.context_bytes_in_use == need and st.context_budget_bytes == need + need // 2
        a.cancel()
        assert b.result(60).finish_reason == "length"
        st = e.stats()
        # b took over a's idle context; it stays idle now, counted whole.
        assert st.context_bytes_in_use == 0 and st.context_bytes_idle == need


def test_bad_requests_raise_at_submit(model):
    with Engine(model) as e:
        with pytest.raises(ValueError, match="temperature"):
            e.submit("hi", temperature=-1)
        with pytest.raises(TypeError, match="unexpected keyword"):
            e.submit("hi", temprature=0.5)
        with pytest.raises(ContextOverflowError, match="600 tokens"):
            e.submit([1] * 600, max_tokens=4)
        with pytest.raises(ValueError, match="stop string is empty"):
            e.submit("hi", stop=[""])
        with pytest.raises(ValueError, match=r"^top_k must be in \[0, 2147483647\]"):
            e.submit("hi", top_k=2**70)
        with pytest.raises(ValueError, match=r"^max_tokens must be in"):
            e.submit("hi", max_tokens=2**70)
        assert e.stats().waiting == 0
    with pytest.raises(RuntimeError, match="closed"):
        e.submit("hi")


def test_close_ends_running_and_waiting_requests(model):
    e = Engine(model, max_batch=1)
    a = e.submit(PROMPTS[1], max_tokens=400, temperature=0)
    b = e.submit(PROMPTS[2], max_tokens=400, temperature=0)
    next(a)
    e.close(30)
    assert a.result(5).finish_reason == "cancelled" and b.result(5).finish_reason == "cancelled"
    assert not e._thread.is_alive()


SYSTEM = (
    "You are the help desk of a small public library. Answer in one short sentence, politely, and "
    "say so when you do not know. Opening hours are nine to five on weekdays and ten to two on "
    "Saturdays; the library is closed on Sundays. Question: "
)
QUESTIONS = [
    "When do you open on Saturday?", "Can I renew a book by phone?", "Do you have a printer?",
    "Is there parking?", "Are you open on Sunday?", "Can children get a card?", "Do you sell coffee?",
    "Where are the maps?", "How many books may I borrow?", "Is there wifi?", "Can I book a room?",
    "Do you have audiobooks?", "What is the late fee?", "Can I donate books?", "Is the building accessible?",
    "Do you run reading groups?",
]


def test_32_requests_alone_and_together_with_prefixes_give_the_same_bits(default_model):
    """Half the prompts share a long system prompt: together (32 at once, prompts in chunks of
    16, prefixes taken from the cache, two threads) they give the tokens and log-probabilities
    each gives alone (no prefix cache, one thread)."""
    prompts = [SYSTEM + q for q in QUESTIONS] + PROMPTS + [p + " and then" for p in PROMPTS[:6]]
    assert len(prompts) == 32
    kw = {"max_tokens": 6, "temperature": 0.6, "logprobs": 2}
    one = Model.load(default_model, n_ctx=512, n_threads=1)
    with Engine(one, max_batch=1, prefix_cache=False) as e:
        alone = [e.submit(p, seed=7 + i, **kw).result(60) for i, p in enumerate(prompts)]
    two = Model.load(default_model, n_ctx=512, n_threads=2)
    with Engine(two, max_batch=32, token_budget=16) as e:
        e.submit(SYSTEM, max_tokens=1, temperature=0).result(60)  # the shared prefix, cached
        handles = [e.submit(p, seed=7 + i, **kw) for i, p in enumerate(prompts)]
        together = [h.result(60) for h in handles]
        st = e.stats()
    assert outputs(together) == outputs(alone)
    assert all(c.timings.cached_tokens == 0 for c in alone)
    hits = [c.timings.cached_tokens for c in together[:16]]
    assert min(hits) >= len(one.tokenize(SYSTEM)) - 16 and st.cached_tokens_total >= sum(hits)
    assert all(c.timings.prompt_tokens + c.timings.cached_tokens == c.prompt_tokens for c in together)


def test_a_needle_gives_the_same_bits_at_any_place_in_batches_of_any_size(model):
    rng = np.random.default_rng(5)
    needle = "Write a short poem about a lighthouse keeper and"
    kw = {"max_tokens": 8, "temperature": 0.6, "logprobs": 3, "seed": 42}
    want = model.generate(needle, **kw)
    for _ in range(3):
        size = int(rng.integers(2, 12))
        at = int(rng.integers(0, size))
        with Engine(model, max_batch=16, token_budget=int(rng.integers(4, 40))) as e:
            handles = []
            for i in range(size):
                p = needle if i == at else PROMPTS[int(rng.integers(len(PROMPTS)))]
                handles.append(e.submit(p, **kw) if i == at else e.submit(p, max_tokens=int(rng.integers(1, 12))))
            got = [h.result(60) for h in handles][at]
        assert outputs([got]) == outputs([want]), (size, at)


def test_a_conversation_reuses_its_previous_turn(model):
    """The second turn of a chat starts from the first turn's cache (an idle context) and the
    third from the second's while a fourth request runs beside it; the replies are the ones
    evaluated from scratch."""
    turns = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Is there parking?"}]]
    with Engine(model, prefix_cache=False) as e:
        cold = [e.chat(turns[0], max_tokens=12, temperature=0).result(60)]
    with Engine(model) as e:
        warm = [e.chat(turns[0], max_tokens=12, temperature=0).result(60)]
        second = [*turns[0], {"role": "assistant", "content": warm[0].text}, {"role": "user", "content": "Thanks!"}]
        warm.append(e.chat(second, max_tokens=12, temperature=0).result(60))
        st = e.stats()
    with Engine(model, prefix_cache=False) as e:
        cold.append(e.chat(second, max_tokens=12, temperature=0).result(60))
    assert outputs(warm) == outputs(cold)
    n_first = len(model.chat_template.encode(model.tokenizer, turns[0], add_generation_prompt=True))
    assert warm[0].timings.cached_tokens == 0
    assert warm[1].timings.cached_tokens >= (n_first // 16) * 16 > 0
    assert st.prefix_hits == 1 and st.cached_tokens_total == warm[1].timings.cached_tokens


def test_a_running_sequence_lends_its_prefix(model):
    long_prompt = SYSTEM + "Tell me everything about the library."
    with Engine(model) as e:
        a = e.submit(long_prompt, max_tokens=200, temperature=0)
        next(a)  # a is decoding: its prompt is in its cache
        b = e.submit(SYSTEM + "Is there wifi?", max_tokens=5, temperature=0.6, seed=3).result(60)
        a.cancel()
    assert b.timings.cached_tokens >= 32
    assert outputs([b]) == outputs([model.generate(SYSTEM + "Is there wifi?", max_tokens=5, temperature=0.6, seed=3)])


def test_requests_sharing_a_prefix_at_once_evaluate_it_once(model):
    """Eight requests after the same system prompt, submitted together to an empty cache: the
    first evaluates the prompt; the others wait for its blocks, copy them and evaluate only
    their own question; every reply is the one evaluated alone."""
    prompts = [SYSTEM + q for q in QUESTIONS[:8]]
    kw = {"max_tokens": 4, "temperature": 0.6, "logprobs": 2}
    want = [model.generate(p, seed=11 + i, **kw) for i, p in enumerate(prompts)]
    with Engine(model, max_batch=8, token_budget=16) as e:
        with scheduler_held(e):
            handles = [e.submit(p, seed=11 + i, **kw) for i, p in enumerate(prompts)]
        got = [h.result(60) for h in handles]
        st = e.stats()
    assert outputs(got) == outputs(want)
    n_sys = len(model.tokenize(SYSTEM)) // 16 * 16
    assert got[0].timings.cached_tokens == 0
    assert all(c.timings.cached_tokens >= n_sys - 16 > 0 for c in got[1:])
    assert all(c.timings.prompt_tokens + c.timings.cached_tokens == c.prompt_tokens for c in got)
    assert st.prefix_hits == 7 and st.cached_tokens_total == sum(c.timings.cached_tokens for c in got)


def test_a_waiting_sequence_goes_on_when_its_lender_is_cancelled(model):
    """The lender of a prefix is cancelled before it gets there: the borrower takes what it
    holds and evaluates the rest itself, with the reply it gives alone."""
    document = " ".join([SYSTEM] * 3)
    p = document + QUESTIONS[3]
    want = model.generate(p, max_tokens=4, temperature=0)
    seen: list = []

    def cancel_the_lender_on_its_way() -> bool:
        # Between two steps on the scheduler thread: once a holds two blocks of the prefix
        # (8 tokens a step), b waits on it as its lender; a is cancelled there.
        running = {s.handle: s for s in e._running}
        if b not in running or running[a].prefill_at < 32:
            return False
        borrower = running[b]
        seen.append((borrower, borrower.lender, running[a].prefill_at, a.prefilled))
        a.cancel()
        return True

    with Engine(model, max_batch=4, token_budget=8) as e:
        with scheduler_held(e):
            a = e.submit(document + QUESTIONS[0], max_tokens=50, temperature=0)
            b = e.submit(p, max_tokens=4, temperature=0)
            between_steps(e, cancel_the_lender_on_its_way)
        got = b.result(60)
    borrower, lender, lender_at, prefilled = seen[0]
    assert lender is not None and lender.handle is a and prefilled is None and lender_at < borrower.lend_n
    assert outputs([got]) == outputs([want])
    t = got.timings
    assert t.prompt_tokens + t.cached_tokens == got.prompt_tokens and 0 < t.cached_tokens < borrower.lend_n


def test_a_short_prompt_is_not_held_behind_a_long_ones_chunks(model):
    """Chunks go to the prompts with the fewest tokens left: a question submitted after a long
    document (16-token chunks) has its first token long before the document is in; a prompt
    passed over max_defer steps goes first, so the document is not starved by a stream of
    questions."""
    document = " ".join([SYSTEM] * 4)
    with Engine(model, max_batch=8, token_budget=16) as e:
        with scheduler_held(e):
            a = e.submit(document, max_tokens=1, temperature=0)
            b = e.submit(QUESTIONS[0], max_tokens=1, temperature=0)
        ra, rb = a.result(60), b.result(60)
    assert ra.prompt_tokens > 8 * 16 and rb.prompt_tokens <= 16
    assert b.prefilled < a.prefilled
    # A stream of 40 questions behind it, each about one chunk: by the fewest-left rule alone
    # the document gets a chunk only when no question is left; passed over two steps at a
    # time, it gets every third chunk and is in well before the stream ends.
    stream = [f"{q} {q}" for q in QUESTIONS * 3][:40]
    done_last = {}
    for max_defer in (10**6, 2):
        with Engine(model, max_batch=8, token_budget=16, max_defer=max_defer) as e:
            with scheduler_held(e):
                a = e.submit(document, max_tokens=1, temperature=0)
                questions = [e.submit(q, max_tokens=1, temperature=0) for q in stream]
            a.result(60)
            for h in questions:
                h.result(60)
        done_last[max_defer] = a.prefilled > max(h.prefilled for h in questions)
    assert done_last == {10**6: True, 2: False}


def test_first_sample_and_cache_timings(model):
    with Engine(model) as e:
        c = e.submit(PROMPTS[1], max_tokens=4, temperature=0).result(60)
    t = c.timings
    assert 0 < t.first_sample_s <= t.sample_s and t.ttft_s is not None and t.ttft_s >= t.first_sample_s
    assert t.cached_tokens == 0 and t.prompt_tokens == c.prompt_tokens


EXIT_WHILE_RUNNING = """
import sys, threading, time
from pyinfer import Engine, Model
m = Model.load(sys.argv[1], n_ctx=512)
e = Engine(m)
h = e.submit("Tell me a long story", max_tokens=400, logit_bias={t: float("-inf") for t in m.tokenizer.eot_ids})
threading.Thread(target=lambda: m.generate("Once upon a time", max_tokens=400), daemon=True).start()
next(h)
time.sleep(0.1)  # both threads are in forward passes when the interpreter exits
print("exiting", flush=True)
"""


def test_the_interpreter_exits_cleanly_while_threads_are_in_forward_passes(default_model, tmp_path):
    """A script that ends (or is interrupted) while an Engine or a daemon thread is decoding
    exits with its own status: the threads that come back from a kernel after the atexit hook
    wait for the process to end instead of being torn down from inside C++ (an abort)."""
    import subprocess
    import sys

    script = tmp_path / "exit_while_running.py"
    script.write_text(EXIT_WHILE_RUNNING)
    for _ in range(3):
        p = subprocess.run([sys.executable, str(script), str(default_model)], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0 and p.stdout == "exiting\n", (p.returncode, p.stderr[-2000:])
        assert "terminate" not in p.stderr and "Fatal" not in p.stderr, p.stderr[-2000:]


def test_a_handle_read_by_several_readers_ends_for_all_of_them(model):
    """Readers of one handle share its chunks (each goes to one of them); when one takes the
    last, the others stop too, and result() is the whole completion whoever read what."""
    with Engine(model) as e:
        alone = e.submit(PROMPTS[1], max_tokens=40, temperature=0).result(60)
        h = e.submit(PROMPTS[1], max_tokens=40, temperature=0)
        results: list = []
        read: list = []
        threads = [threading.Thread(target=lambda: results.append(h.result(60))),
                   threading.Thread(target=lambda: read.extend(h)),
                   threading.Thread(target=lambda: read.extend(h))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert results[0].token_ids == alone.token_ids and h.finished
        assert list(h) == [] and h.result().token_ids == alone.token_ids

        async def two_readers() -> list:
            h2 = e.submit(PROMPTS[1], max_tokens=40, temperature=0)

            async def drain() -> list:
                return [c async for c in h2]

            got = await asyncio.wait_for(asyncio.gather(drain(), drain(), h2.aresult()), 60)
            return [got[2], sum(len(g) for g in got[:2])]

        whole, n_read = asyncio.run(two_readers())
        assert whole.token_ids == alone.token_ids and n_read >= 1

        # An error the request ends with reaches every reader, not just the one that took it.
        bad = e.submit(PROMPTS[1], max_tokens=40, temperature=0)
        bad._channel.put(RuntimeError("the model failed"))  # as the scheduler does on a failure
        with pytest.raises(RuntimeError, match="the model failed") as first:
            list(bad)
        with pytest.raises(RuntimeError, match="the model failed") as later:
            bad.result(10)
        # Later readers get a copy, caused by the original, whose traceback stays its own.
        assert later.value is not first.value and later.value.__cause__ is first.value


GROUNDED = [
    "Copy this list exactly: red, green, blue, yellow, purple, orange, pink, brown, red, green, blue, yellow, "
    "purple, orange, pink, brown. Again: red, green,",
    "Repeat the sentence twice: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n",
]


def test_drafted_steps_give_plain_decoding_bits_in_a_batch(model):
    """With speculative decoding a sequence brings guessed tokens into the shared step; the
    requests still give the tokens, log-probabilities and stops of plain decoding, greedy and
    sampled, alone and together, and their caches hold what they kept (a second turn from a
    drafted first one gives the cold bits)."""
    reqs = [(p, {"max_tokens": 40, "temperature": 0, "logprobs": 2}) for p in GROUNDED]
    reqs += [(p, {"max_tokens": 24, "temperature": 0.7, "seed": 9 + i, "logprobs": 1}) for i, p in enumerate(GROUNDED)]
    reqs += [(GROUNDED[0], {"max_tokens": 40, "temperature": 0, "stop": ["purple"]}), (PROMPTS[1], {**KW, "seed": 4})]
    with Engine(model, draft=0) as e:
        plain = [e.submit(p, **kw).result(60) for p, kw in reqs]
    with Engine(model, draft=8, token_budget=16) as e:
        e._costs = FlatCosts()  # every candidate is sent, whatever this machine's timings say
        together = [h.result(60) for h in [e.submit(p, **kw) for p, kw in reqs]]
        alone = [e.submit(p, **kw).result(60) for p, kw in reqs]
        # the first request's context, idle now, serves a follow-up that extends it
        follow = GROUNDED[0] + alone[0].text + " And once more:"
        warm = e.submit(follow, max_tokens=16, temperature=0).result(60)
    with Engine(model, draft=0, prefix_cache=False) as e:
        cold = e.submit(follow, max_tokens=16, temperature=0).result(60)
    assert outputs(together) == outputs(plain) and outputs(alone) == outputs(plain)
    assert together[-2].stop_reason == plain[-2].stop_reason == "purple"
    for run in (together, alone):
        t = [c.timings for c in run]
        assert all(x.draft_accepted <= x.draft_tokens for x in t)
        assert sum(x.draft_accepted for x in t[:3]) >= 30  # the copies were guessed
    assert all(c.timings.draft_tokens == 0 for c in plain)
    assert warm.timings.cached_tokens >= 32 and outputs([warm]) == outputs([cold])
    with pytest.raises(ValueError, match="draft must be an int"):
        Engine(model, draft=65)
