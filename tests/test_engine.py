"""The serving engine: batched requests give the bits they give alone, cancellation frees
their memory within a step, admission waits for memory (a context counted whole: KV cache and
scratch) and overload is refused."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from pyinfer import Engine, Model, OverloadedError
from pyinfer.errors import ContextOverflowError

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
        threading.Thread(target=h.cancel).start()  # from another thread
        steps_at_cancel = e.stats().steps
        rest = list(h)
        after = e.stats()
        assert rest[-1].finish_reason == "cancelled"
        assert after.context_bytes_in_use == 0 and after.running == 0
        assert after.steps - steps_at_cancel <= 2
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
        a = e.submit(PROMPTS[0], max_tokens=200, temperature=0)
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


def test_a_reservation_counts_the_context_scratch_not_only_its_kv_cache(model):
    probe = Engine(model)
    need = probe.context_bytes_for(256)
    probe.close()
    kv = model.context(256, n_batch=256).kv_nbytes
    assert need == model.context_nbytes(256, 256) > kv  # the scratch is counted
    # Room for the KV caches of two short requests, not for two whole contexts.
    with Engine(model, kv_budget_bytes=need + kv, max_queue=4) as e:
        assert need + kv < 2 * need
        a = e.submit(PROMPTS[0], max_tokens=200, temperature=0)
        next(a)
        b = e.submit(PROMPTS[3], max_tokens=5, temperature=0)
        time.sleep(0.2)  # several scheduler steps: b stays queued
        st = e.stats()
        assert st.running == 1 and st.waiting == 1
        assert st.context_bytes_in_use == need and st.context_budget_bytes == need + kv
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
