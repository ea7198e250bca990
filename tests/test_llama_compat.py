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


def test_echo(llm, model):
    out = llm("The capital of France is", max_tokens=4, temperature=0, echo=True)
    want = model.generate("The capital of France is", max_tokens=4, temperature=0).text
    assert out["choices"][0]["text"] == "The capital of France is" + want
    streamed = "".join(
        c["choices"][0]["text"]
        for c in llm("The capital of France is", max_tokens=4, temperature=0, echo=True, stream=True)
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


# ---- fill-in-the-middle, vocab_only, chat formats, the parameters objects


def copy_gguf(src, dst, *, metadata=None, drop=(), tensors=True):
    """src rewritten to dst: its metadata with `metadata` (key -> (value, ValueType...)) set and
    the keys of `drop` left out; its tensors as they are, or none (a vocabulary-only file)."""
    from pyinfer.gguf import GGUFReader, GGUFWriter

    r = GGUFReader(src)
    w = GGUFWriter(dst, alignment=r.alignment)
    changes = metadata or {}
    for key, value in r.metadata.items():
        if key in drop or key == "general.alignment":
            continue
        new = changes.get(key)
        w.add(key, *(new if new is not None else (value, *r.metadata_types[key])))
    for key, new in changes.items():
        if key not in r.metadata:
            w.add(key, *new)
    if tensors:
        for name, t in r.tensors.items():
            w.add_raw_tensor(name, r.raw(name), t.shape, t.type)
    w.write()
    return dst


@pytest.fixture(scope="module")
def fim_file(default_model, tmp_path_factory):
    """The default model with three of its unused control tokens (<repo_name>, <reponame>,
    <file_sep>: ids 3, 4, 5) renamed to StarCoder's FIM tokens: the default model's own
    vocabulary has none."""
    from pyinfer.gguf import GGUFReader, ValueType

    tokens = list(GGUFReader(default_model).metadata["tokenizer.ggml.tokens"])
    assert not any("fim" in t for t in tokens)
    tokens[3:6] = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    return copy_gguf(default_model, tmp_path_factory.mktemp("fim") / "fim.gguf",
                     metadata={"tokenizer.ggml.tokens": (tokens, ValueType.ARRAY, ValueType.STRING)})


def test_fim_tokens_are_found_by_key_or_by_text():
    from pyinfer.llama_compat import FimTokens, fim_tokens

    base = ["a", "b", "c", "d", "e", "f", "g"]

    def vocab(**at):
        toks = list(base)
        for i, t in at.items():
            toks[int(i[1:])] = t
        return {"tokenizer.ggml.tokens": toks}

    assert fim_tokens(vocab()) is None
    assert fim_tokens(vocab(i1="<|fim_prefix|>", i2="<|fim_suffix|>", i3="<|fim_middle|>")) == FimTokens(1, 2, 3)
    assert fim_tokens(vocab(i4="<fim-prefix>", i5="<fim-suffix>", i6="<fim-middle>")) == FimTokens(4, 5, 6)
    bar = "\uff5c"  # DeepSeek's full-width vertical bar
    deepseek = vocab(i0=f"<{bar}fim\u2581begin{bar}>", i1=f"<{bar}fim\u2581hole{bar}>", i2=f"<{bar}fim\u2581end{bar}>")
    assert fim_tokens(deepseek) == FimTokens(0, 1, 2)
    assert fim_tokens(vocab(i0="\u2581<PRE>", i1="\u2581<SUF>", i2="\u2581<MID>")) == FimTokens(0, 1, 2)
    assert fim_tokens(vocab(i1="<fim_prefix>", i2="<fim_suffix>")) is None  # no middle token
    # Metadata keys win over texts; the older names count too; an id outside the vocabulary does not.
    md = {**vocab(i1="<fim_prefix>", i2="<fim_suffix>", i3="<fim_middle>"), "tokenizer.ggml.fim_pre_token_id": 6,
          "tokenizer.ggml.suffix_token_id": 5, "tokenizer.ggml.fim_mid_token_id": 99}
    assert fim_tokens(md) == FimTokens(6, 5, 3)


def test_fim_prompt_and_result(fim_file):
    llm = Llama(model_path=str(fim_file), n_ctx=128, verbose=False)
    tok = llm.tokenizer()
    before, after = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    out = llm(before, suffix=after, max_tokens=6, temperature=0)
    check_completion(out)
    pre, suf = [3, *tok.encode(before, add_bos=False)], [4, *tok.encode(after, add_bos=False)]
    want = pre + suf + [5]  # <fim_prefix> before <fim_suffix> after <fim_middle>
    assert out["usage"]["prompt_tokens"] == len(want)
    assert llm.input_ids[: len(want)].tolist() == want
    # The middle is what comes after that prompt, as a plain completion of its ids gives it;
    # the suffix is not appended (it is the text after the gap).
    plain = llm(want, max_tokens=6, temperature=0)["choices"][0]["text"]
    assert out["choices"][0]["text"] == plain
    streamed = "".join(c["choices"][0]["text"] for c in llm(before, suffix=after, max_tokens=6, temperature=0,
                                                           stream=True))
    assert streamed == plain
    # Suffix first with spm_infill; an empty suffix still makes a FIM prompt.
    spm = Llama(model_path=str(fim_file), n_ctx=128, spm_infill=True, verbose=False)
    spm(before, suffix=after, max_tokens=1, temperature=0)
    assert spm.input_ids[: len(want)].tolist() == suf + pre + [5]
    llm(before, suffix="", max_tokens=1, temperature=0)
    assert llm.input_ids[: len(pre) + 2].tolist() == pre + [4, 5]


def test_suffix_without_fim_tokens_is_an_error(llm):
    with pytest.raises(ValueError, match="has no FIM tokens"):
        llm("def add(a, b):", suffix="\n", max_tokens=4)
    llm("def add(a, b):", suffix=None, max_tokens=1)  # None is no suffix


def test_vocab_only_loads_the_tokenizer_alone(default_model, tmp_path, llm):
    from pyinfer.gguf import GGUFReader

    # A file with the vocabulary and no tensor at all (as llama.cpp's ggml-vocab-*.gguf): the
    # weights are not needed, so none is read.
    vocab = copy_gguf(default_model, tmp_path / "vocab.gguf", tensors=False)
    assert not GGUFReader(vocab).tensors
    with pytest.raises(ValueError, match=r"tensor token_embd\.weight is missing"):
        Llama(model_path=str(vocab), verbose=False)
    v = Llama(model_path=str(vocab), vocab_only=True, verbose=False)
    text = b"Hello World<|im_end|>"
    for kw in ({}, {"add_bos": False}, {"special": True}):
        assert v.tokenize(text, **kw) == llm.tokenize(text, **kw)
    ids = llm.tokenize(text, special=True)
    assert v.detokenize(ids) == llm.detokenize(ids) and v.detokenize(ids, special=True) == text
    assert (v.n_vocab(), v.n_embd(), v.token_bos(), v.token_eos()) == (llm.n_vocab(), llm.n_embd(), llm.token_bos(),
                                                                       llm.token_eos())
    assert v.n_ctx() == N_CTX and v.metadata == llm.metadata and v._ctx is None
    assert v.model_params.vocab_only and not llm.model_params.vocab_only
    for call in (lambda: v("Hello", max_tokens=1), lambda: v.eval(ids), lambda: v.embed("Hello"),
                 lambda: v.create_chat_completion([{"role": "user", "content": "Hi"}]), lambda: v.sample()):
        with pytest.raises(RuntimeError, match="vocab_only=True"):
            call()
    v.reset()  # nothing to empty, and no error
    from pyinfer.llama_compat import LlamaTokenizer

    t = LlamaTokenizer.from_ggml_file(vocab)
    assert t.encode("Hello World") == llm.tokenizer().encode("Hello World") and t.decode(ids[:2]) == "Hello World"


FORMAT_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name a colour."},
]

# What each format opens a reply with, and the markers its turns carry.
FORMAT_MARKS = {
    "chatml": ("<|im_start|>assistant\n",
               ["<|im_start|>system\nBe brief.<|im_end|>", "<|im_start|>user\nHi<|im_end|>"]),
    "llama-2": (" [/INST]", ["[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello!", "[INST] Name a colour."]),
    "llama-3": ("<|start_header_id|>assistant<|end_header_id|>\n\n",
                ["<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"]),
    "mistral-instruct": (" [/INST]", ["[INST] Be brief.\n\nHi [/INST]Hello!"]),
    "gemma": ("<start_of_turn>model\n", ["<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"]),
    "phi-3": ("<|assistant|>\n", ["<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n"]),
    "alpaca": ("### Response:\n", ["Be brief.\n\n### Instruction:\nHi\n\n### Response:\nHello!"]),
    "vicuna": ("ASSISTANT:", ["Be brief. USER: Hi ASSISTANT: Hello!</s>USER: Name a colour."]),
    "zephyr": ("<|assistant|>\n", ["<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>"]),
}


@pytest.mark.parametrize("name", sorted(FORMAT_MARKS))
def test_builtin_chat_formats(default_model, name):
    from pyinfer.chat import CHAT_FORMATS

    m = Llama(model_path=str(default_model), n_ctx=256, chat_format=name, verbose=False)
    prompt = m._chat_template.render(FORMAT_MESSAGES)
    opener, marks = FORMAT_MARKS[name]
    assert prompt.endswith(opener) and prompt.count("Name a colour.") == 1
    for mark in marks:
        assert mark in prompt
    # Llama 2 and 3, Mistral and Gemma open with the BOS token, where the file adds one (the
    # default model adds none).
    from pyinfer.chat import ChatTemplate

    with_bos = ChatTemplate(CHAT_FORMATS[name].template, bos_token="<s>", eos_token="</s>").render(FORMAT_MESSAGES)
    assert with_bos.startswith("<s>") == (name in ("llama-2", "llama-3", "mistral-instruct", "gemma"))
    assert m._chat_template.bos_token == "" and not prompt.startswith("<s>")
    out = m.create_chat_completion(FORMAT_MESSAGES, max_tokens=24, temperature=0)
    reply = check_chat(out)["message"]["content"]
    assert CHAT_FORMATS[name].stop not in reply  # the format's end of turn stops the reply
    ids = m.tokenize(prompt.encode(), add_bos=False, special=True)
    assert out["usage"]["prompt_tokens"] == len(ids)


def test_default_chat_format_is_the_files_template(default_model, llm):
    assert llm._chat_template.source == Model.load(default_model, n_ctx=64).chat_template.source
    with pytest.raises(ValueError, match="'chatml', 'gemma', 'llama-2', 'llama-3', 'mistral-instruct', 'phi-3'"):
        Llama(model_path=str(default_model), chat_format="llama2", verbose=False)


def test_parameters_and_accessors(default_model, llm):
    import pickle

    m = Llama(model_path=str(default_model), n_ctx=0, n_batch=64, rope_freq_base=0, verbose=False)
    assert m.context_params.n_ctx == m.n_ctx() == 8192 and m.context_params.n_batch == 64
    assert llm.context_params.n_ctx == N_CTX and llm.context_params.n_threads == llm.n_threads
    assert (llm.n_vocab(), llm.n_embd()) == (49152, 576) and llm.token_eos() == 2
    assert llm.tokenizer().decode(llm.tokenizer().encode("Hello World")) == "Hello World"
    assert llm.metadata["general.architecture"] == "llama" and llm.model_path == str(default_model)
    assert llm._is_recurrent is False and llm._is_hybrid is False
    again = pickle.loads(pickle.dumps(llm))
    assert again.n_ctx() == llm.n_ctx() and again is not llm
    assert again("The capital of France is", max_tokens=4, temperature=0)["choices"][0]["text"] == llm(
        "The capital of France is", max_tokens=4, temperature=0)["choices"][0]["text"]


def test_calls_from_several_threads_take_turns(default_model):
    """One Llama shared by threads (a thread-pool web handler, say): completions, chats and
    token-level generate() run one at a time on its context, each with the result it has
    alone, and a stream read in one thread while others call gives the same chunks."""
    import threading

    llm = Llama(model_path=str(default_model), n_ctx=N_CTX, verbose=False)
    prompts = [PLANETS, "The capital of France is", "def fibonacci(n):", "Once upon a time"]
    chat = [{"role": "user", "content": "Name a color."}]
    alone = [llm(p, max_tokens=12, temperature=0)["choices"][0]["text"] for p in prompts]
    chat_alone = llm.create_chat_completion(chat, max_tokens=8, temperature=0)["choices"][0]["message"]["content"]
    ids = llm.tokenize(b"One, two, three,")
    gen = llm.generate(ids, temp=0)
    tokens_alone = [next(gen) for _ in range(6)]
    gen.close()
    streamed_alone = "".join(c["choices"][0]["text"] for c in llm(prompts[0], max_tokens=12, temperature=0, stream=True))
    assert streamed_alone == alone[0]

    got: dict[tuple[str, int], object] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(kind: str) -> None:
        try:
            start.wait(10)
            for r in range(6):
                if kind == "completion":
                    got[kind, r] = [llm(p, max_tokens=12, temperature=0)["choices"][0]["text"] for p in prompts]
                elif kind == "chat":
                    out = llm.create_chat_completion(chat, max_tokens=8, temperature=0)
                    got[kind, r] = out["choices"][0]["message"]["content"]
                elif kind == "generate":
                    g = llm.generate(ids, temp=0)
                    got[kind, r] = [next(g) for _ in range(6)]
                    g.close()
                else:  # a plain call between two of another thread's stream items ends that stream
                    parts = [c["choices"][0]["text"] for c in llm(prompts[0], max_tokens=12, temperature=0,
                                                                   stream=True)]
                    got[kind, r] = "".join(parts)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in ("completion", "chat", "generate", "stream")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for r in range(6):
        assert got["completion", r] == alone
        assert got["chat", r] == chat_alone
        assert got["generate", r] == tokens_alone
        # A stream another thread's call ended is a prefix of the full text; none is longer.
        assert alone[0].startswith(got["stream", r]), (got["stream", r], alone[0])


def test_generate_goes_on_after_another_call_used_the_context(llm):
    ids = llm.tokenize(b"One, two, three,")
    g = llm.generate(ids, temp=0)
    alone = [next(g) for _ in range(6)]
    g.close()
    g = llm.generate(ids, temp=0)
    got = [next(g) for _ in range(3)]
    llm("The capital of France is", max_tokens=4, temperature=0)  # the context now holds another sequence
    llm.reset()
    got += [next(g) for _ in range(3)]
    assert got == alone


def test_a_hook_that_calls_back_into_its_llama_is_refused(llm):
    """The one context is in the middle of the completion while its hooks run: a call back
    into the same Llama from one is refused by name, and the object stays usable."""
    base = llm("The sky is", max_tokens=12, temperature=0)["choices"][0]["text"]

    def ask(ids, scores):
        llm("Cats", max_tokens=1, temperature=0)
        return scores

    def rewind(ids, logits):
        llm.eval([1, 2])
        return False

    with pytest.raises(RuntimeError, match=r"create_completion\(\) was called from a logits_processor"):
        llm("The sky is", max_tokens=12, temperature=0, logits_processor=ask)
    with pytest.raises(RuntimeError, match=r"eval\(\) was called from a logits_processor or stopping_criteria"):
        llm("The sky is", max_tokens=12, temperature=0, stopping_criteria=rewind)
    with pytest.raises(RuntimeError, match="called from a logits_processor"):
        list(llm("The sky is", max_tokens=12, temperature=0, logits_processor=ask, stream=True))
    with pytest.raises(RuntimeError, match="called from a logits_processor"):
        next(llm.generate(llm.tokenize(b"The sky is"), temp=0, logits_processor=ask))

    def gen(ids, scores):  # generate() read inside a hook: refused before it touches the context
        next(llm.generate(llm.tokenize(b"Cats"), temp=0))
        return scores

    for stream in (False, True):
        with pytest.raises(RuntimeError, match="a stream or generate.. of a Llama was read from a logits_processor"):
            out = llm("The sky is", max_tokens=12, temperature=0, logits_processor=gen, stream=stream)
            list(out) if stream else out
        assert llm.n_tokens == llm._ctx.n_past
    # Reading from the hook is fine: tokenize and the token rows.
    seen: list[int] = []

    def look(ids, scores):
        seen.append(len(llm.tokenize(b"x")) + llm.n_tokens)
        return scores

    assert llm("The sky is", max_tokens=12, temperature=0, logits_processor=look)["choices"][0]["text"] == base
    assert len(seen) == 12
    assert llm("The sky is", max_tokens=12, temperature=0)["choices"][0]["text"] == base


def test_a_call_waits_one_chunk_of_a_stream_read_in_a_tight_loop(default_model):
    """Turns are handed over in order: a thread reading a stream as fast as it can does not
    take the lock back ahead of another thread's call, which ends the stream."""
    import threading

    llm = Llama(model_path=str(default_model), n_ctx=N_CTX, verbose=False)
    banned = {t: -1e9 for t in llm.model.tokenizer.eot_ids}
    read: list[str] = []
    at_call: list[int] = []
    started = threading.Event()

    def reader() -> None:
        for c in llm("Once upon a time", max_tokens=300, temperature=0, logit_bias=banned, stream=True):
            read.append(c["choices"][0]["text"])
            if len(read) == 5:
                started.set()

    def caller() -> None:
        started.wait(60)
        at_call.append(len(read))
        llm.reset()
        at_call.append(len(read))

    threads = [threading.Thread(target=reader), threading.Thread(target=caller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    # The chunk being made when the call took its turn, and one or two more that the reader can
    # make before the caller's thread runs again to take it (it reads the count first); with a
    # lock that is not handed over in order the reader went on for hundreds.
    assert at_call[1] - at_call[0] <= 4, at_call
    assert len(read) < 300 and len(read) <= at_call[1] + 1  # the reset ended the stream


def test_bad_sample_rows_embed_inputs_and_response_formats_are_named(default_model):
    from pyinfer.errors import ParameterTypeError

    llm = Llama(model_path=str(default_model), n_ctx=64, verbose=False)
    llm.eval(llm.tokenize(b"hello there"))
    last = llm.n_tokens - 1
    assert llm.sample(idx=last, temp=0) == llm.sample(temp=0)
    for idx in (last + 3, -1, 0):  # rows never written, or not kept without logits_all
        with pytest.raises(ValueError, match=f"idx={idx}: the scores hold row {last}"):
            llm.sample(idx=idx, temp=0)
    with pytest.raises(ParameterTypeError, match="idx must be an int"):
        llm.sample(idx=1.0, temp=0)
    for bad, where in ((None, "input must be"), (5, "input must be"), ([1.5], r"input\[0\]"), (["a", 3], r"input\[1\]")):
        with pytest.raises(ParameterTypeError, match=where):
            llm.embed(bad)
    with pytest.raises(ContextOverflowError, match="an input of 101 tokens is longer than n_ctx 64"):
        llm.embed("word " * 100, truncate=False)
    assert len(llm.embed("word " * 100)) == llm.n_embd()  # truncated to n_ctx by default
    assert llm.embed([np.array([1, 2, 3])[:].tolist(), [np.int64(1), np.int32(2), 3]]) == llm.embed([[1, 2, 3], [1, 2, 3]])
    with pytest.raises(ParameterTypeError, match="response_format must be a dict"):
        llm.create_chat_completion([{"role": "user", "content": "hi"}], response_format="json")


def test_n_ctx_0_on_a_file_with_a_huge_context_length_names_it(tmp_path):
    from pyinfer.bench.synthetic import Shape, write_synthetic_llama
    from pyinfer.gguf_types import GGMLType

    shape = Shape(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=260, n_ctx=2**32 - 1)
    path = write_synthetic_llama(tmp_path / "m.gguf", shape, GGMLType.F32, seed=1)
    with pytest.raises(ValueError, match="n_ctx=0 asks for the file's context_length, 4294967295 tokens"):
        Llama(model_path=str(path), n_ctx=0, verbose=False)
    assert Llama(model_path=str(path), n_ctx=32, verbose=False).n_ctx() == 32


def test_llama_size_arguments_are_checked_by_name(default_model):
    from pyinfer.errors import ParameterTypeError

    with pytest.raises(ValueError, match=r"last_n_tokens_size must be in \[0, 2147483647\], got 1000000000000"):
        Llama(model_path=str(default_model), n_ctx=64, last_n_tokens_size=10**12, verbose=False)
    with pytest.raises(ParameterTypeError, match="n_ubatch must be an int, not str"):
        Llama(model_path=str(default_model), n_ctx=64, n_ubatch="x", verbose=False)
    with pytest.raises(ValueError, match="n_ubatch must be >= 1, got 0"):
        Llama(model_path=str(default_model), n_ctx=64, n_ubatch=0, verbose=False)
    # Checked before either kind of load, so a tokenizer-only Llama refuses it too.
    with pytest.raises(ValueError, match=r"n_threads must be a positive integer, 0 or None \(the default\), got -4"):
        Llama(model_path=str(default_model), vocab_only=True, n_threads=-4, verbose=False)
