"""Generation on the real default model: greedy continuations against float32 transformers,
chat prompts against llama.cpp's ids, streaming, stop conditions, seeds, threads."""

from __future__ import annotations

import threading

import pytest

from pyinfer.errors import ContextOverflowError
from pyinfer.generate import CancelToken, context_pool
from pyinfer.model import Model

from _reference import load

HF = load("gen_hf.json")["cases"]
LLAMA = load("gen_llamacpp.json")["cases"]


@pytest.fixture(scope="module")
def exact(default_model):
    return Model.load(default_model, precision="exact", n_ctx=512)


@pytest.fixture(scope="module")
def fast(default_model):
    return Model.load(default_model, n_ctx=512)


@pytest.mark.parametrize("i", range(len(HF)))
def test_exact_greedy_reproduces_transformers(exact, i):
    case = HF[i]
    want = case["greedy_ids"]
    c = exact.generate(case["prompt_ids"], max_tokens=len(want), temperature=0)
    got = c.token_ids + ([c.stop_reason] if c.finish_reason == "stop" else [])
    assert got == want
    assert c.text == exact.detokenize(c.token_ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("case", [c for c in LLAMA if c["kind"] == "chat"], ids=lambda c: c["prompt"][:20] if isinstance(c["prompt"], str) else "chat")
def test_chat_prompt_ids_match_llama_cpp(fast, case):
    messages = case.get("messages") or case["prompt"]
    assert fast.chat_template.encode(fast.tokenizer, messages, add_generation_prompt=True) == case["prompt_ids"]


def test_stream_matches_completion_and_returns_its_context(fast):
    whole = fast.generate("Once upon a time", max_tokens=24, temperature=0)
    chunks = list(fast.generate("Once upon a time", max_tokens=24, temperature=0, stream=True))
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    assert chunks[-1].finish_reason == whole.finish_reason == "length"
    idle = len(context_pool(fast))
    it = fast.generate("Once upon a time", max_tokens=24, temperature=0, stream=True)
    next(it)
    it.close()
    assert len(context_pool(fast)) == idle


def test_stop_string_is_not_emitted(fast):
    whole = fast.generate("The capital of France is", max_tokens=20, temperature=0).text
    assert "." in whole
    c = fast.generate("The capital of France is", max_tokens=20, temperature=0, stop=["."])
    assert c.finish_reason == "stop" and c.stop_reason == "."
    assert c.text == whole[: whole.index(".")]


def test_seed_reproduces_sampling(fast):
    a = fast.generate("Write a word:", max_tokens=16, temperature=1.0, seed=1234)
    b = fast.generate("Write a word:", max_tokens=16, temperature=1.0, seed=1234)
    assert a.token_ids == b.token_ids
    runs = {tuple(fast.generate("Write a word:", max_tokens=16, temperature=1.5, top_k=0, top_p=1.0,
                                min_p=0.0).token_ids) for _ in range(4)}
    assert len(runs) > 1  # seed=None draws a fresh seed each call


def test_prompt_longer_than_context(default_model):
    m = Model.load(default_model, n_ctx=16)
    long = " ".join(["word"] * 40)
    with pytest.raises(ContextOverflowError, match=r"the prompt has \d+ tokens.*n_ctx = 16"):
        m.generate(long, max_tokens=4)
    c = m.generate(long, max_tokens=4, temperature=0, truncate="left")
    assert c.truncated_tokens > 0 and c.prompt_tokens + len(c.token_ids) <= 16
    full = m.generate("Hello", max_tokens=None, temperature=0, logit_bias={2: float("-inf")})
    assert full.finish_reason == "length"  # the context filled up: no error mid-stream


def test_concurrent_generations_match_sequential(fast):
    prompts = ["The capital of France is", "def add(a, b):", "Once upon a time", "Water boils at"]
    expected = [fast.generate(p, max_tokens=16, temperature=0).token_ids for p in prompts]
    got: dict[int, list[int]] = {}

    def run(i: int) -> None:
        got[i] = fast.generate(prompts[i], max_tokens=16, temperature=0).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(prompts))] == expected


def test_cancel_from_another_thread(fast):
    cancel = CancelToken()
    no_end = {t: float("-inf") for t in fast.tokenizer.eot_ids}
    stream = fast.generate("Tell me a long story.", max_tokens=None, temperature=0, stream=True, cancel=cancel,
                           logit_bias=no_end)
    n = 0
    for chunk in stream:
        n += 1
        if n == 3:
            threading.Thread(target=cancel.cancel).start()
        last = chunk
    assert last.finish_reason == "cancelled" and n < 10
