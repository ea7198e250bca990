"""pyinfer.Llama on the real default model: code written against llama-cpp-python's documented
API (its README's examples, a perplexity loop, a llama-bench-style timing loop) run as is, the
result dicts checked key by key, and the numbers checked against pyinfer.Model."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from pyinfer import (
    ContextOverflowError,
    Llama,  # the one line an application changes: was `from llama_cpp import Llama`
)
from pyinfer.model import Model

N_CTX = 512
PLANETS = "Q: Name the planets in the solar system? A: "
TEXT = (
    "The quick brown fox jumps over the lazy dog. Perplexity measures how well a language "
    "model predicts a sample of text: the lower it is, the less surprised the model is by "
    "each next token. It is the exponential of the mean negative log-likelihood."
)


@pytest.fixture(scope="module")
def llm(default_model) -> Llama:
    return Llama(model_path=str(default_model), n_ctx=N_CTX, seed=1337, verbose=False)


@pytest.fixture(scope="module")
def llm_all(default_model) -> Llama:
    return Llama(model_path=str(default_model), n_ctx=N_CTX, logits_all=True, verbose=False)


@pytest.fixture(scope="module")
def model(default_model) -> Model:
    return Model.load(default_model, n_ctx=N_CTX)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


# ---- the shapes of the results


def check_completion(out: dict, *, usage: bool = True) -> dict:
    """A text_completion dict as llama-cpp-python returns it; returns its choice."""
    assert set(out) == (
        {"id", "object", "created", "model", "choices", "usage"}
        if usage
        else {"id", "object", "created", "model", "choices"}
    )
    assert isinstance(out["id"], str) and out["id"].startswith("cmpl-")
    assert out["object"] == "text_completion"
    assert isinstance(out["created"], int)
    assert isinstance(out["model"], str)
    assert isinstance(out["choices"], list) and len(out["choices"]) == 1
    choice = out["choices"][0]
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"}
    assert isinstance(choice["text"], str)
    assert choice["index"] == 0
    if usage:
        u = out["usage"]
        assert set(u) == {"prompt_tokens", "completion_tokens", "total_tokens"}
        assert all(isinstance(v, int) for v in u.values())
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert choice["finish_reason"] in ("stop", "length")
    return choice


def check_logprobs(lp: dict, n: int, n_top: int) -> None:
    assert set(lp) == {"tokens", "text_offset", "token_logprobs", "top_logprobs"}
    assert all(len(lp[k]) == n for k in lp)
    assert all(isinstance(t, str) for t in lp["tokens"])
    assert all(isinstance(o, int) for o in lp["text_offset"])
    assert lp["text_offset"] == sorted(lp["text_offset"])
    for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        if value is None:
            assert top is None
            continue
        assert isinstance(value, float) and value <= 0.0
        assert isinstance(top, dict) and tok in top and top[tok] == value
        assert len(top) <= n_top + 1
        assert all(isinstance(k, str) and isinstance(v, float) for k, v in top.items())


def check_chat(out: dict) -> dict:
    assert set(out) == {"id", "object", "created", "model", "choices", "usage"}
    assert out["id"].startswith("chatcmpl-")
    assert out["object"] == "chat.completion"
    assert isinstance(out["created"], int) and isinstance(out["model"], str)
    choice = out["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length")
    assert set(choice["message"]) == {"role", "content"}
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert set(out["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    return choice


# ---- the README's examples


def test_readme_completion(llm, model):
    output = llm(PLANETS, max_tokens=32, stop=["Q:", "\n"], echo=True, temperature=0)
    choice = check_completion(output)
    assert choice["text"].startswith(PLANETS)
    assert "\n" not in choice["text"] and "Q:" not in choice["text"][len(PLANETS) :]
    assert choice["logprobs"] is None
    want = model.generate(PLANETS, max_tokens=32, stop=["Q:", "\n"], temperature=0)
    assert choice["text"] == PLANETS + want.text
    assert choice["finish_reason"] == ("stop" if want.finish_reason == "stop" else "length")
    assert output["usage"]["prompt_tokens"] == len(model.tokenize(PLANETS))
    assert output["usage"]["completion_tokens"] == len(want.token_ids)
    assert output["model"] == llm.model_path


def test_readme_completion_with_default_sampling_is_well_formed(llm):
    output = llm(PLANETS, max_tokens=32, stop=["Q:", "\n"], echo=True)
    choice = check_completion(output)
    assert choice["text"].startswith(PLANETS)
    assert output["usage"]["completion_tokens"] <= 32


@pytest.mark.parametrize(
    "prompt", ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
)
def test_greedy_equals_model_generate(llm, model, prompt):
    out = llm.create_completion(prompt, max_tokens=24, temperature=0)
    want = model.generate(prompt, max_tokens=24, temperature=0)
    assert out["choices"][0]["text"] == want.text
    assert out["usage"]["completion_tokens"] == len(want.token_ids)
    # the context now holds the prompt and the tokens evaluated after it
    ids = model.tokenize(prompt) + want.token_ids
    assert llm.input_ids[: llm.n_tokens].tolist() == ids[: llm.n_tokens]


def test_token_id_prompt(llm, model):
    ids = model.tokenize("The capital of France is")
    out = llm(ids, max_tokens=8, temperature=0)
    assert out["choices"][0]["text"] == model.generate(ids, max_tokens=8, temperature=0).text
    assert out["usage"]["prompt_tokens"] == len(ids)


def test_prefix_reuse_gives_the_same_result(llm):
    a = llm("Once upon a time there was a", max_tokens=12, temperature=0)["choices"][0]["text"]
    llm.reset()
    llm("Once upon a time", max_tokens=4, temperature=0)  # shares a prefix with the next call
    b = llm("Once upon a time there was a", max_tokens=12, temperature=0)["choices"][0]["text"]
    llm("Once upon a time there was a", max_tokens=12, temperature=0)  # the whole prompt cached
    c = llm("Once upon a time there was a", max_tokens=12, temperature=0)["choices"][0]["text"]
    assert a == b == c


def test_streaming_loop(llm):
    whole = llm(PLANETS, max_tokens=24, stop=["Q:"], temperature=0)
    text = ""
    chunks = list(llm(PLANETS, max_tokens=24, stop=["Q:"], temperature=0, stream=True))
    for chunk in chunks[:-1]:
        choice = check_completion(chunk, usage=False)
        assert choice["finish_reason"] is None and choice["logprobs"] is None
        text += choice["text"]
    last = check_completion(chunks[-1], usage=False)
    assert last["text"] == "" and last["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert text == whole["choices"][0]["text"]
    assert len({c["id"] for c in chunks}) == 1


def test_stream_stop_string_is_held_back(llm):
    whole = llm("List: 1. apples\n2.", max_tokens=40, stop=["\n"], temperature=0)
    pieces = [
        c["choices"][0]["text"]
        for c in llm("List: 1. apples\n2.", max_tokens=40, stop=["\n"], temperature=0, stream=True)
    ]
    assert "".join(pieces) == whole["choices"][0]["text"]
    assert all("\n" not in p for p in pieces)


def test_breaking_out_of_a_stream_leaves_the_object_usable(llm, model):
    for i, _chunk in enumerate(llm("Once upon a time", max_tokens=32, stream=True)):
        if i == 2:
            break
    it = llm("Once upon a time", max_tokens=32, stream=True)
    next(it)  # left open: the next call ends it
    out = llm("The capital of France is", max_tokens=8, temperature=0)
    assert (
        out["choices"][0]["text"]
        == model.generate("The capital of France is", max_tokens=8, temperature=0).text
    )
    assert list(it) == []


def test_echo_and_suffix(llm, model):
    out = llm("The capital of France is", max_tokens=4, temperature=0, echo=True, suffix=" [end]")
    want = model.generate("The capital of France is", max_tokens=4, temperature=0).text
    assert out["choices"][0]["text"] == "The capital of France is" + want + " [end]"
    streamed = "".join(
        c["choices"][0]["text"]
        for c in llm(
            "The capital of France is",
            max_tokens=4,
            temperature=0,
            echo=True,
            suffix=" [end]",
            stream=True,
        )
    )
    assert streamed == out["choices"][0]["text"]


# ---- max_tokens and the context


def test_max_tokens_none_or_nonpositive_runs_until_the_context_is_full(default_model):
    small = Llama(model_path=str(default_model), n_ctx=32, verbose=False)
    ban = {t: -math.inf for t in small._tokenizer.eot_ids}  # no end of turn: fill the context
    for max_tokens in (None, 0, -1):
        out = small("Once upon a time", max_tokens=max_tokens, temperature=0, logit_bias=ban)
        assert out["choices"][0]["finish_reason"] == "length"
        assert out["usage"]["total_tokens"] == 32
    assert small("Once upon a time", max_tokens=3, temperature=0)["usage"]["completion_tokens"] == 3


def test_prompt_longer_than_the_context_is_a_value_error(llm):
    ids = [100] * N_CTX
    with pytest.raises(
        ValueError, match=rf"Requested tokens \({N_CTX}\) exceed context window of {N_CTX}"
    ) as e:
        llm(ids)  # n_ctx tokens: no room left to generate, as in llama-cpp-python
    assert isinstance(e.value, ContextOverflowError)
    n = len(llm.tokenize(b" x" * 1000))
    with pytest.raises(ValueError, match=rf"\({n}\) exceed context window of {N_CTX}"):
        llm.create_completion(" x" * 1000)
    with pytest.raises(ContextOverflowError):
        llm.reset()
        llm.eval([100] * (N_CTX + 1))
    llm.reset()


# ---- logprobs


def test_logprobs(llm, model):
    prompt = "The capital of France is"
    out = llm(prompt, max_tokens=6, temperature=0, logprobs=3)
    choice = check_completion(out)
    lp = choice["logprobs"]
    check_logprobs(lp, out["usage"]["completion_tokens"], 3)
    assert lp["text_offset"][0] == len(prompt)
    assert "".join(lp["tokens"]) == choice["text"]
    ids = model.tokenize(prompt)
    gen = model.generate(prompt, max_tokens=6, temperature=0).token_ids
    rows = log_softmax(model.logits(ids + gen)[len(ids) - 1 :])
    for i, tok in enumerate(gen):
        assert lp["token_logprobs"][i] == pytest.approx(rows[i][tok], abs=2e-3)
        best = [model.detokenize([t]).decode("utf-8", "ignore") for t in np.argsort(-rows[i])[:3]]
        assert set(best) <= set(lp["top_logprobs"][i])


def test_echo_logprobs_cover_the_prompt(llm_all, llm, model):
    prompt = "The capital of France is"
    ids = model.tokenize(prompt)
    rows = log_softmax(model.logits(ids))
    for m in (llm_all, llm):  # with logits_all and without
        out = m(prompt, max_tokens=2, temperature=0, logprobs=2, echo=True)
        lp = out["choices"][0]["logprobs"]
        check_logprobs(lp, len(ids) + out["usage"]["completion_tokens"], 2)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["text_offset"][: len(ids)] == [
            len(model.detokenize(ids[:i])) for i in range(len(ids))
        ]
        for p in range(1, len(ids)):
            assert lp["token_logprobs"][p] == pytest.approx(rows[p - 1][ids[p]], abs=2e-3)
    streamed = list(
        llm_all(prompt, max_tokens=2, temperature=0, logprobs=2, echo=True, stream=True)
    )
    assert streamed[0]["choices"][0]["text"] == prompt
    assert streamed[0]["choices"][0]["logprobs"]["tokens"] == lp["tokens"][: len(ids)]


def test_stream_logprobs(llm):
    whole = llm("The capital of France is", max_tokens=6, temperature=0, logprobs=2)
    lp = whole["choices"][0]["logprobs"]
    tokens, values = [], []
    for chunk in llm(
        "The capital of France is", max_tokens=6, temperature=0, logprobs=2, stream=True
    ):
        c = chunk["choices"][0]
        if c["finish_reason"] is None:
            check_logprobs(c["logprobs"], len(c["logprobs"]["tokens"]), 2)
            tokens += c["logprobs"]["tokens"]
            values += c["logprobs"]["token_logprobs"]
    assert tokens == lp["tokens"]
    assert values == pytest.approx(lp["token_logprobs"])


# ---- chat


MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name the planets in the solar system."},
]


def test_chat_completion(llm, model):
    out = llm.create_chat_completion(messages=MESSAGES, temperature=0, max_tokens=48)
    choice = check_chat(out)
    assert choice["logprobs"] is None
    want = model.chat(MESSAGES, temperature=0, max_tokens=48)
    assert choice["message"]["content"] == want.text
    ids = model.chat_template.encode(model.tokenizer, MESSAGES, add_generation_prompt=True)
    assert out["usage"]["prompt_tokens"] == len(ids)
    assert out["usage"]["completion_tokens"] == len(want.token_ids)


def test_chat_default_max_tokens_stops_at_end_of_turn(llm):
    out = llm.create_chat_completion(
        messages=[{"role": "user", "content": "Say hi."}], temperature=0
    )
    choice = check_chat(out)
    assert choice["finish_reason"] == "stop"
    assert "<|im_end|>" not in choice["message"]["content"]


def test_chat_streaming_loop(llm):
    whole = llm.create_chat_completion(messages=MESSAGES, temperature=0, max_tokens=24)
    chunks = list(
        llm.create_chat_completion(messages=MESSAGES, temperature=0, max_tokens=24, stream=True)
    )
    for chunk in chunks:
        assert set(chunk) == {"id", "model", "created", "object", "choices"}
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"].startswith("chatcmpl-")
        assert set(chunk["choices"][0]) == {"index", "delta", "logprobs", "finish_reason"}
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant"}
    assert (
        deltas[-1] == {}
        and chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    )
    assert all(set(d) == {"content"} for d in deltas[1:-1])
    content = "".join(d["content"] for d in deltas[1:-1])
    assert content == whole["choices"][0]["message"]["content"]


def test_chat_logprobs(llm):
    out = llm.create_chat_completion(
        messages=MESSAGES, temperature=0, max_tokens=5, logprobs=True, top_logprobs=2
    )
    lp = check_chat(out)["logprobs"]
    assert set(lp) == {"content", "refusal"} and lp["refusal"] is None
    assert len(lp["content"]) == out["usage"]["completion_tokens"]
    for entry in lp["content"]:
        assert set(entry) == {"token", "bytes", "logprob", "top_logprobs"}
        assert isinstance(entry["logprob"], float)
        assert all(set(t) == {"token", "logprob", "bytes"} for t in entry["top_logprobs"])
        assert 1 <= len(entry["top_logprobs"]) <= 3


def test_chatml_format(default_model, llm):
    m = Llama(model_path=str(default_model), n_ctx=N_CTX, chat_format="chatml", verbose=False)
    out = m.create_chat_completion(messages=MESSAGES, temperature=0, max_tokens=8)
    check_chat(out)
    # no default system prompt: shorter than the file's template's prompt would be
    user_only = [MESSAGES[1]]
    a = m.create_chat_completion(messages=user_only, temperature=0, max_tokens=1)["usage"][
        "prompt_tokens"
    ]
    b = llm.create_chat_completion(messages=user_only, temperature=0, max_tokens=1)["usage"][
        "prompt_tokens"
    ]
    assert a < b


# ---- seeds


def test_seeds_are_reproducible(default_model, llm):
    def run(m: Llama) -> list[str]:
        return [
            m("Once upon a time", max_tokens=8, temperature=1.0)["choices"][0]["text"]
            for _ in range(3)
        ]

    a = Llama(model_path=str(default_model), n_ctx=128, seed=42, verbose=False)
    b = Llama(model_path=str(default_model), n_ctx=128, seed=42, verbose=False)
    ra, rb = run(a), run(b)
    assert ra == rb  # the same seed, the same sequence of calls
    assert len(set(ra)) > 1  # but each call has its own seed
    x = llm("Once upon a time", max_tokens=8, temperature=1.0, seed=7)["choices"][0]["text"]
    y = llm("Once upon a time", max_tokens=8, temperature=1.0, seed=7)["choices"][0]["text"]
    z = llm("Once upon a time", max_tokens=8, temperature=1.0, seed=8)["choices"][0]["text"]
    assert x == y != z
    llm.set_seed(7)
    s = llm("Once upon a time", max_tokens=8, temperature=1.0)["choices"][0]["text"]
    llm.set_seed(7)
    assert llm("Once upon a time", max_tokens=8, temperature=1.0)["choices"][0]["text"] == s


def test_default_seed_is_random(default_model):
    m = Llama(model_path=str(default_model), n_ctx=128, verbose=False)
    texts = {
        m("Once upon a time", max_tokens=8, temperature=1.0)["choices"][0]["text"] for _ in range(4)
    }
    assert len(texts) > 1


# ---- the low-level API: tokens, eval, scores


def test_tokenize_and_detokenize(llm, model):
    tok = model.tokenizer
    assert llm.tokenize(b"Hello world") == model.tokenize("Hello world", add_bos=None)
    # add_bos=True adds BOS only when the file asks for it (SmolLM2's does not), as llama.cpp
    assert llm.tokenize(b"Hello world", add_bos=True) == (
        [tok.bos_id] if tok.add_bos else []
    ) + model.tokenize("Hello world", add_bos=False)
    assert llm.tokenize(b"Hello world", add_bos=False) == model.tokenize(
        "Hello world", add_bos=False
    )
    assert (
        llm.tokenize(b"<|im_start|>hi", special=True)[0]
        == tok.tokenize("<|im_start|>", special=True)[0]
    )
    assert len(llm.tokenize(b"<|im_start|>hi", special=False)) > 2
    text = "Grüße, 世界! <b>ok</b>".encode()
    assert llm.detokenize(llm.tokenize(text)) == text
    im_start = tok.tokenize("<|im_start|>", special=True)
    assert llm.detokenize(im_start + llm.tokenize(b"hi")) == b"hi"
    assert llm.detokenize(im_start + llm.tokenize(b"hi"), special=True) == b"<|im_start|>hi"
    assert llm.n_vocab() == 49152 and llm.n_ctx() == N_CTX and llm.n_embd() == 576
    assert llm.token_bos() == tok.bos_id and llm.token_eos() == tok.eos_id
    assert llm.detokenize([llm.token_nl()]) == b"\n"


def test_metadata(llm):
    md = llm.metadata
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in md.items())
    assert md["general.architecture"] == "llama"
    assert md["llama.block_count"] == "30"
    assert md["tokenizer.ggml.add_bos_token"] in ("true", "false")
    assert "tokenizer.ggml.tokens" not in md  # arrays are left out, as llama.cpp does
    assert md["tokenizer.chat_template"].startswith("{%")


def test_perplexity_loop(llm_all, model):
    tokens = llm_all.tokenize(TEXT.encode("utf-8"), add_bos=False)
    n = len(tokens)
    llm_all.reset()
    llm_all.eval(tokens)
    assert llm_all.n_tokens == n
    assert llm_all.input_ids[:n].tolist() == tokens
    assert llm_all.scores.shape == (N_CTX, llm_all.n_vocab()) and llm_all.scores.dtype == np.float32
    # the same forward on the same tokens in one call: the same numbers
    np.testing.assert_array_equal(llm_all.scores[:n], model.logits(tokens))
    # the loop a perplexity script runs over scores
    nll = 0.0
    for i in range(n - 1):
        logits = llm_all.scores[i].astype(np.float64)
        nll += -(
            logits[tokens[i + 1]] - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        )
    ppl = math.exp(nll / (n - 1))
    assert ppl == pytest.approx(model.perplexity(TEXT, window=n), rel=1e-4)


def test_eval_in_pieces_and_rewind(llm_all, llm, model):
    tokens = llm.tokenize(TEXT.encode("utf-8"))
    want = model.logits(tokens)
    llm_all.reset()
    # in pieces: a kernel may sum in another order for another batch size, hence a tolerance
    for start in range(0, len(tokens), 7):
        llm_all.eval(tokens[start : start + 7])
    np.testing.assert_allclose(llm_all.scores[: len(tokens)], want, rtol=0, atol=1e-4)
    # lowering n_tokens rewinds: the next eval overwrites from there
    llm_all.n_tokens = 5
    llm_all.eval(tokens[5:9])
    assert llm_all.n_tokens == 9
    np.testing.assert_allclose(llm_all.scores[:9], want[:9], rtol=0, atol=1e-4)
    # without logits_all only the last evaluated row is kept
    llm.reset()
    llm.eval(tokens[:10])
    llm.eval(tokens[10:])
    np.testing.assert_allclose(llm.scores[len(tokens) - 1], want[-1], rtol=0, atol=1e-4)
    assert llm.eval_tokens == deque(tokens)
    assert len(llm.eval_logits) == 1
    llm.eval([])  # nothing to do
    assert llm.n_tokens == len(tokens)
    llm.reset()
    assert llm.n_tokens == 0


def test_bench_style_timing_loop(llm, model):
    prompt = llm.tokenize(b"The capital of France is")
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(12):  # tg: one token at a time, greedy from the last row
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(tok)
        llm.eval([tok])
    want = model.generate(prompt, max_tokens=12, temperature=0)
    assert out[: len(want.token_ids)] == want.token_ids


# ---- construction and bad arguments


def test_ignored_and_unknown_keywords(default_model, capsys):
    m = Llama(
        model_path=str(default_model),
        n_ctx=64,
        n_gpu_layers=-1,
        use_mmap=False,
        use_mlock=True,
        n_ubatch=128,
        flash_attn=True,
        n_threads_batch=2,
        offload_kqv=False,
        type_k=1,
        numa=False,
        verbose=True,
    )
    assert "pyinfer: loaded" in capsys.readouterr().err
    assert m.n_ctx() == 64
    with pytest.raises(TypeError, match="n_gpu_layer"):
        Llama(model_path=str(default_model), n_gpu_layer=0, verbose=False)
    with pytest.raises(NotImplementedError, match="lora_path"):
        Llama(model_path=str(default_model), lora_path="adapter.gguf", verbose=False)
    with pytest.raises(ValueError, match="Model path does not exist"):
        Llama(model_path="/nonexistent/model.gguf")
    with pytest.raises(ValueError, match="chat_format"):
        Llama(model_path=str(default_model), chat_format="no-such-format", verbose=False)


def test_n_ctx_zero_uses_the_models_context(default_model):
    m = Llama(model_path=str(default_model), n_ctx=0, n_batch=64, verbose=False)
    assert m.n_ctx() == 8192 and m.n_batch == 64


def test_bad_arguments(llm):
    with pytest.raises(TypeError, match="bytes"):
        llm.tokenize("Hello")
    with pytest.raises(TypeError):
        llm("Hi", temperature="hot")
    with pytest.raises(ValueError, match="top_p"):
        llm("Hi", top_p=2.0)
    with pytest.raises(TypeError, match="max_tokens"):
        llm("Hi", max_tokens="10")
    with pytest.raises(ValueError, match="stop"):
        llm("Hi", stop=[""])
    with pytest.raises(NotImplementedError, match="mirostat_mode"):
        llm("Hi", mirostat_mode=2)
    with pytest.raises(NotImplementedError, match="typical_p"):
        llm("Hi", typical_p=0.5)
    with pytest.raises(TypeError, match="grammar must be a LlamaGrammar"):
        llm("Hi", grammar=object())
    with pytest.raises(ValueError, match="vocabulary"):
        llm([1, 10**6])
    with pytest.raises(ValueError, match="empty"):
        llm("")
    with pytest.raises(ValueError):
        llm.eval([llm.n_vocab()])
    with pytest.raises(TypeError):
        llm.eval("some text")
    with pytest.raises(ValueError, match="role"):
        llm.create_chat_completion(messages=[{"role": "wizard", "content": "Hi"}])
    with pytest.raises(ValueError, match=r"response_format\.type must be"):
        llm.create_chat_completion(messages=MESSAGES, response_format={"type": "yaml"})
    with pytest.raises(ValueError, match="seed"):
        llm("Hi", seed=-5)
    llm.reset()


def test_grammars_response_format_and_tool_calls(llm):
    """llama-cpp-python's constrained paths: LlamaGrammar (GBNF and JSON schema), JSON
    response_format, and forced tool calls returned as tool_calls."""
    import json

    import jsonschema

    from pyinfer.llama_compat import LlamaGrammar

    g = LlamaGrammar.from_string('root ::= "yes" | "no"')
    assert llm("Is water wet? Answer: ", grammar=g, max_tokens=4, temperature=0.9)["choices"][0]["text"] in (
        "yes", "no")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    out = llm("A number as JSON: ", grammar=LlamaGrammar.from_json_schema(json.dumps(schema)), max_tokens=20)
    jsonschema.validate(json.loads(out["choices"][0]["text"]), schema)
    r = llm.create_chat_completion(messages=MESSAGES, response_format={"type": "json_object", "schema": schema},
                                   max_tokens=20)
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
    tool = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}}
    r = llm.create_chat_completion(messages=[{"role": "user", "content": "Add 2 and 3."}], tools=[tool],
                                   tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=40)
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
    call = ch["message"]["tool_calls"][0]
    assert call["function"]["name"] == "add"
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])


def test_hooks_token_level_generation_and_state(default_model):
    """llama-cpp-python's logits_processor / stopping_criteria, generate() and sample(),
    save_state / load_state (in memory and pickled) and LlamaRAMCache."""
    import pickle

    from pyinfer.llama_compat import LlamaRAMCache, LogitsProcessorList, StoppingCriteriaList

    llm = Llama(model_path=str(default_model), n_ctx=N_CTX, seed=7, verbose=False)
    banned = llm.tokenize(b" Paris", add_bos=False)[0]

    def ban(ids, scores):
        scores[banned] = -np.inf
        return scores

    out = llm("The capital of France is", max_tokens=6, temperature=0, logits_processor=LogitsProcessorList([ban]))
    assert "Paris" not in out["choices"][0]["text"]
    plain = llm("The capital of France is", max_tokens=6, temperature=0)["choices"][0]["text"]
    assert "Paris" in plain
    seen = []
    stop_after_3 = StoppingCriteriaList([lambda ids, logits: seen.append(len(ids)) or len(seen) >= 3])
    out = llm("Once upon a time", max_tokens=20, temperature=0, stopping_criteria=stop_after_3)
    assert out["choices"][0]["finish_reason"] == "stop" and len(seen) == 3

    prompt = llm.tokenize(b"The capital of France is")
    gen = llm.generate(prompt, temp=0)
    toks = [next(gen) for _ in range(5)]
    gen.close()
    assert llm.detokenize(toks).decode() == plain[: len(llm.detokenize(toks).decode())]
    llm.reset()
    llm.eval(prompt)
    assert llm.sample(temp=0) == toks[0]

    state = llm.save_state()
    want = llm.sample(temp=0)
    other = Llama(model_path=str(default_model), n_ctx=N_CTX, verbose=False)
    restored = pickle.loads(pickle.dumps(state))
    assert restored.kv is None
    other.load_state(restored)  # evaluated again
    assert other.n_tokens == len(prompt) and other.sample(temp=0) == want
    llm.reset()
    llm.load_state(state)  # copied back
    np.testing.assert_array_equal(llm.scores[llm.n_tokens - 1], other.scores[other.n_tokens - 1])

    cache = LlamaRAMCache(capacity_bytes=1 << 30)
    llm.set_cache(cache)
    first = llm("A short poem about rain:", max_tokens=4, temperature=0)["choices"][0]["text"]
    assert cache.cache_size > 0 and llm.tokenize(b"A short poem about rain:") in cache
    llm.reset()
    assert llm("A short poem about rain:", max_tokens=4, temperature=0)["choices"][0]["text"] == first
