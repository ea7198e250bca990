"""`pyinfer serve` as a real process on loopback, driven by the official openai client: the
routes, streamed and whole, stop strings, logprobs, errors, the API key, concurrent streams
identical to the same requests one at a time, and a disconnect freeing its KV memory."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import openai
import pytest
from _serve import metrics as server_metrics
from _serve import serve

from pyinfer import Engine, Model, openai_types
from pyinfer.sampling import TokenLogprob

KEY = "sk-test-0123456789"
N_CTX = 512


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve(default_model, log, "--ctx", str(N_CTX), "--api-key", KEY, "--max-body-bytes", "65536",
               "--log-level", "warning") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(default_model):
    return Model.load(default_model, n_ctx=N_CTX)


def metrics(url: str) -> dict[str, float]:
    return server_metrics(url, KEY)


PROMPT = "The capital of France is"


def test_completion_whole_and_streamed(client, model):
    want = model.generate(PROMPT, max_tokens=8, temperature=0, logprobs=2)
    r = client.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    c = r.choices[0]
    assert c.text == want.text and c.finish_reason == "length"
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens == len(model.tokenize(PROMPT))
    assert c.logprobs.token_logprobs == [lp.logprob for lp in want.logprobs]
    assert all(len(top) >= 2 for top in c.logprobs.top_logprobs)
    t = r.model_extra["timings"]
    assert t["prompt_n"] == r.usage.prompt_tokens and t["predicted_n"] == 8 and t["cache_n"] == 0
    assert t["ttft_ms"] >= t["prompt_ms"] > 0 and t["queue_ms"] >= 0 and t["tokenize_ms"] >= 0

    chunks = list(client.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want.text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_chat_whole_and_streamed(client, model):
    messages = [{"role": "user", "content": "Name a colour."}]
    want = model.chat(messages, max_tokens=8, temperature=0)
    r = client.chat.completions.create(model="x", messages=messages, max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=1)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    assert len(r.choices[0].logprobs.content) == len(want.token_ids) == r.usage.completion_tokens
    assert r.model_extra["timings"]["predicted_n"] >= len(want.token_ids)

    chunks = list(client.chat.completions.create(model="x", messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [ch.choices[0].delta.content or "" for ch in chunks if ch.choices]
    assert "".join(content) == want.text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == want.finish_reason and all(f is None for f in finishes[:-1])
    assert "timings" in chunks[-2].model_extra
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_top_logprobs_as_openai_gives_them(client, server):
    messages = [{"role": "user", "content": "Name a colour."}]
    for n in (0, 3):
        r = client.chat.completions.create(model="x", messages=messages, max_tokens=4, temperature=0,
                                           logprobs=True, top_logprobs=n)
        content = r.choices[0].logprobs.content
        assert content and all(len(t.top_logprobs) == n for t in content), n
        assert all(bytes(t.bytes).decode("utf-8", errors="ignore") == t.token for t in content)
        if n:  # greedy: the token is the most likely alternative
            assert all(t.top_logprobs[0].logprob == t.logprob for t in content)
    r = httpx.post(f"{server}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"messages": messages, "max_tokens": 2, "top_logprobs": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
    assert "logprobs" in r.json()["error"]["message"]


class _Bytes:
    """A tokenizer's detokenize over a fixed table: ids 4 and 5 are the two halves of one
    character, which decode alike (to "")."""

    table = {3: b"a", 4: b"\xc3", 5: b"\xa9", 6: b"b"}

    def detokenize(self, ids, special=False):
        return b"".join(self.table[i] for i in ids)


def test_alternatives_that_decode_alike_are_kept_in_the_chat_shape_and_merged_in_the_legacy_one():
    tok = _Bytes()
    lps = [TokenLogprob(3, -0.1, ((3, -0.1), (4, -2.0), (5, -3.0), (6, -4.0))), TokenLogprob(5, -3.5, ())]
    chat = openai_types.chat_token_logprobs(tok, [3, 5], lps)
    first, second = chat["content"]
    assert [(t["token"], t["bytes"], t["logprob"]) for t in first["top_logprobs"]] == [
        ("a", [97], -0.1), ("", [0xC3], -2.0), ("", [0xA9], -3.0), ("b", [98], -4.0)]
    assert second["top_logprobs"] == [] and second["bytes"] == [0xA9] and second["logprob"] == -3.5
    legacy = openai_types.completion_logprobs(tok, [3, 5], lps, 0)
    assert legacy["top_logprobs"][0] == {"a": -0.1, "": -2.0, "b": -4.0}  # the higher of the two
    assert legacy["top_logprobs"][1] == {"": -3.5}  # logprobs=0: the sampled token's own


def test_a_shared_system_prompt_comes_from_the_prefix_cache(client, server, model):
    system = ("You answer questions about the solar system in one short sentence, for children, and say "
              "when you are not sure. Use simple words. Never use more than twenty words in an answer.")
    base = metrics(server).get("pyinfer:prefix_cache_hit_tokens_total", 0)
    replies = []
    for q in ("Which planet is the largest?", "Which planet is red?"):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        r = client.chat.completions.create(model="x", messages=messages, max_tokens=6, temperature=0)
        assert r.choices[0].message.content == model.chat(messages, max_tokens=6, temperature=0).text
        replies.append(r)
    first, second = (r.usage.prompt_tokens_details.cached_tokens for r in replies)
    assert first == 0 or first < second  # the first may find a prefix of an earlier test's
    assert second >= 32 and replies[1].model_extra["timings"]["cache_n"] == second
    t = replies[1].model_extra["timings"]
    assert t["prompt_n"] + second == replies[1].usage.prompt_tokens and t["first_sample_ms"] > 0
    assert metrics(server)["pyinfer:prefix_cache_hit_tokens_total"] >= base + second


def test_structured_output(client):
    import jsonschema

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "A city and its population, as JSON."}], max_tokens=60,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.completions.create(model="x", prompt="Is water wet? Answer:", max_tokens=5, temperature=1.0, seed=2,
                                  extra_body={"guided_choice": [" yes", " no"]})
    assert r.choices[0].text in (" yes", " no")
    streamed = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Give a JSON object with the keys colour and size for a small "
                             "red ball."}], max_tokens=120, temperature=0,
        response_format={"type": "json_object"}, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices)
    assert isinstance(json.loads(text), dict)
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       extra_body={"guided_regex": "(unclosed"})
    assert ei.value.body["param"] == "guided_regex" and "regex does not compile" in ei.value.body["message"]
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       response_format={"type": "json_object"}, extra_body={"guided_regex": "a"})
    assert "not several" in ei.value.body["message"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                                       "required": ["zone"], "additionalProperties": False}}}


def test_tool_calls(client):
    import jsonschema

    ask = [{"role": "user", "content": "What is the weather like in Paris?"}]
    r = client.chat.completions.create(model="x", messages=ask, tools=[WEATHER, TIME], tool_choice="required",
                                       max_tokens=80, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in ("get_weather", "get_time")
    schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    named = client.chat.completions.create(model="x", messages=ask, tools=[WEATHER, TIME], max_tokens=80,
                                           temperature=0.9, seed=4,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME["function"]["parameters"])
    # Streamed: the call arrives as tool_calls deltas, then finish_reason "tool_calls".
    chunks = list(client.chat.completions.create(model="x", messages=ask, tools=[WEATHER], tool_choice="required",
                                                 max_tokens=80, temperature=0, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # "auto" and "none": a plain question gets text.
    for choice in ("auto", "none"):
        r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say hello."}],
                                           tools=[WEATHER], tool_choice=choice, max_tokens=8, temperature=0)
        assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    for kw, field in (({"tools": [{"type": "function"}]}, "tools"),
                      ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                       "tool_choice"),
                      ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": "get_weather"}},
                       "tool_choice"),
                      ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": None}}, "tool_choice"),
                      ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": ["x"]}}},
                       "tool_choice"),
                      ({"tool_choice": "required"}, "tool_choice")):
        with pytest.raises(openai.BadRequestError) as ei:
            client.chat.completions.create(model="x", messages=ask, max_tokens=4, **kw)
        assert ei.value.body["param"] == field, ei.value.body


def test_a_streamed_tool_call_keeps_its_logprobs(client):
    # Held back until it is known to be a call, its text's tokens kept their logprobs only for
    # the last chunk: the stream must carry every token's, as the whole reply does.
    kw = {"model": "x", "messages": [{"role": "user", "content": "What is the weather like in Paris?"}],
          "tools": [WEATHER], "tool_choice": "required", "max_tokens": 80, "temperature": 0, "logprobs": True,
          "top_logprobs": 2}
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].finish_reason == "tool_calls"
    want = [(t.token, t.logprob) for t in whole.choices[0].logprobs.content]
    assert len(want) == whole.usage.completion_tokens > 1
    chunks = list(client.chat.completions.create(**kw, stream=True))
    got = [(t.token, t.logprob) for c in chunks if c.choices and c.choices[0].logprobs
           for t in c.choices[0].logprobs.content]
    assert got == want


def test_a_tool_schema_that_does_not_compile_names_tools(client):
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/nope"}}}}}
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], tools=[bad],
                                       tool_choice="required", max_tokens=4)
    assert ei.value.body["param"] == "tools", ei.value.body  # not json_schema, which the client never sent


def test_embeddings(client, model):
    import numpy as np

    texts = ["The cat sat on the mat.", "A kitten rested on the rug."]
    r = client.embeddings.create(model="x", input=texts)  # the client asks for base64 and decodes it
    got = np.array([d.embedding for d in r.data], np.float32)
    np.testing.assert_allclose(got, model.embed(texts), rtol=0, atol=1e-6)
    assert r.usage.prompt_tokens == sum(len(model.tokenize(t)) for t in texts)
    one = client.embeddings.create(model="x", input=texts[0], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, got[0], atol=1e-6)
    with pytest.raises(openai.BadRequestError) as ei:
        client.embeddings.create(model="x", input="word " * 600)
    assert ei.value.body["param"] == "input" and "n_ctx" in ei.value.body["message"]
    for bad in ("word " * 600, ""):  # named by its place in the input, whichever job it falls in
        with pytest.raises(openai.BadRequestError) as ei:
            client.embeddings.create(model="x", input=["word " * 500, "short", bad])
        assert ei.value.body["param"] == "input" and "input[2]" in ei.value.body["message"], ei.value.body
    with pytest.raises(openai.BadRequestError) as ei:
        client.embeddings.create(model="x", input=[])
    assert ei.value.body["param"] == "input"


def test_a_big_embeddings_request_does_not_hold_up_the_running_sequences(model, monkeypatch):
    # Its texts are embedded about a forward pass at a time, a scheduler step between two: as
    # one job, the running sequences waited for all of it (a minute for 256 texts of 300 tokens).
    import numpy as np
    from starlette.testclient import TestClient

    from pyinfer.server import create_app

    texts = [f"{i} " + "word " * 200 for i in range(6)]  # about 200 tokens each: two per pass of 512
    want = model.embed(texts)
    steps = []
    embed = model.embed

    def spy(*args, **kwargs):
        steps.append(engine.stats().steps)
        return embed(*args, **kwargs)

    monkeypatch.setattr(model, "embed", spy)
    with Engine(model) as engine, TestClient(create_app(engine, model_name="m")) as tc:
        banned = {t: float("-inf") for t in model.tokenizer.eot_ids}
        h = engine.submit(PROMPT, max_tokens=None, temperature=0, logit_bias=banned)
        next(h)  # running until the context is full
        r = tc.post("/v1/embeddings", json={"input": texts, "encoding_format": "float"})
        assert r.status_code == 200
        assert not h.finished
        h.cancel()
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert len(steps) == 3 and steps[0] < steps[1] < steps[2], steps


def test_an_embeddings_client_that_gives_up_drops_the_rest_of_its_texts(server):
    # Some 20 s of embedding; the client waits 1 s. The jobs not run yet are dropped, so a
    # completion after it decodes at full speed, not one job of embedding per token.
    auth = {"Authorization": f"Bearer {KEY}"}
    texts = [" ".join(f"word{j}" for j in range(100)) + f" {i}" for i in range(80)]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/embeddings", json={"input": texts}, headers=auth, timeout=httpx.Timeout(30, read=1.0))
    time.sleep(1.5)  # the server checks the connection every 0.25 s; the job running then ends
    sent = time.monotonic()
    r = httpx.post(f"{server}/v1/completions", headers=auth, timeout=120,
                   json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    took = time.monotonic() - sent
    t = r.json()["timings"]
    assert took < 5, took  # not after the rest of the embedding
    assert t["predicted_ms"] / (t["predicted_n"] - 1) < 100, t  # nor a job between two steps (~500 ms)


def test_stop_strings(client):
    full = client.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    words = re.findall(r"[A-Za-z]{3,}", full)
    assert len(words) >= 2, full
    stop = words[1]
    want = full[: full.index(stop)]
    r = client.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop, "@@@"])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=0, stop=stop,
                                              stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == want
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_streamed_text_offsets_count_the_held_text(client):
    # A token whose last character may begin a stop string is sent without it; the next
    # chunk's offsets counted from the text sent, one short of where its tokens' text starts.
    full = client.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0)
    tokens = full.choices[0].logprobs.tokens
    k = next(i for i, t in enumerate(tokens[:-1]) if len(t) >= 2)
    kw = {"model": "x", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 0,
          "stop": [tokens[k][-1] + "\u2603"]}  # held after token k, released by the next
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == whole.logprobs.text_offset


def test_a_logit_bias_that_bans_every_allowed_token_is_the_requests_fault(server):
    # -1e400 is valid JSON for -inf (a ban); with the only token the choice allows banned,
    # nothing can be sampled: a 400 naming logit_bias, where it was a 500.
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    (a,) = httpx.post(f"{server}/tokenize", json={"content": "a"}, headers=auth).json()["tokens"]
    body = f'{{"prompt": "{PROMPT}", "max_tokens": 4, "guided_choice": ["a"], "logit_bias": {{"{a}": -1e400}}'
    r = httpx.post(f"{server}/v1/completions", content=body + "}", headers=auth, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
    assert "bans every token" in r.json()["error"]["message"]
    r = httpx.post(f"{server}/v1/completions", content=body + ', "stream": true}', headers=auth, timeout=60)
    err = json.loads(r.text.strip().split("\n\n")[-1].removeprefix("data: "))["error"]
    assert err["param"] == "logit_bias" and err["type"] == "invalid_request_error", err


def test_tokenize_and_detokenize_run_off_the_event_loop(model, monkeypatch):
    # A long text takes seconds to tokenize: on the event loop, every stream and /health waits.
    from starlette.testclient import TestClient

    from pyinfer.server import create_app

    def on_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    seen = []

    def spy(f):
        def call(*args, **kwargs):
            seen.append(on_loop())
            return f(*args, **kwargs)
        return call

    tok = model.tokenizer
    for name in ("tokenize", "detokenize"):
        monkeypatch.setattr(tok, name, spy(getattr(tok, name)))
    with Engine(model) as engine, TestClient(create_app(engine, model_name="m")) as tc:
        ids = tc.post("/tokenize", json={"content": "Hello there", "with_pieces": True}).json()["tokens"]
        assert tc.post("/detokenize", json={"tokens": [t["id"] for t in ids]}).json()["content"] == "Hello there"
    assert seen and not any(seen)


def test_errors_are_openai_shaped(client, server):
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="x", prompt=[100] * 600, max_tokens=4)
    assert ei.value.status_code == 400
    assert "600" in ei.value.message and str(N_CTX) in ei.value.message
    assert ei.value.body["code"] == "context_length_exceeded" and ei.value.body["param"] == "prompt"
    assert "--ctx" in ei.value.message and "truncate" not in ei.value.message  # advice a client can follow
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "word " * 700}])
    assert ei.value.body["param"] == "messages" and str(N_CTX) in ei.value.message
    for kwargs, field in [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 2}, "top_p"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"logprobs": 99}, "logprobs"),
        ({"n": 2}, "n"),
        ({"stop": [""]}, "stop"),
        ({"stop": [str(i) for i in range(17)]}, "stop"),
        ({"stop": ["x" * 1025]}, "stop"),
        ({"extra_body": {"seed": "abc"}}, "seed"),
        ({"logit_bias": {"3": 1e308}}, "logit_bias"),
        ({"extra_body": {"top_k": 2**70}}, "top_k"),
        ({"extra_body": {"repeat_last_n": 2**63}}, "repeat_last_n"),
        ({"seed": 2**70}, "seed"),
        ({"max_tokens": 2**70}, "max_tokens"),
        ({"logit_bias": {str(2**70): 1.0}}, "logit_bias"),
        ({"logit_bias": {"1_0": 1.0}}, "logit_bias"),  # int() would read these as 10 and 3
        ({"logit_bias": {"\u0663": 1.0}}, "logit_bias"),
        ({"top_p": 10**400}, "top_p"),  # an int past float64's range: not a 500
        ({"presence_penalty": -(10**400)}, "presence_penalty"),
        ({"stream": True, "stream_options": {"include_usage": "y"}}, "stream_options"),
    ]:
        with pytest.raises(openai.BadRequestError) as ei:
            client.completions.create(model="x", prompt=PROMPT, **kwargs)
        assert ei.value.body["param"] == field, (kwargs, ei.value.body)
        assert ei.value.body["type"] == "invalid_request_error" and field in ei.value.message

    auth = {"Authorization": f"Bearer {KEY}"}
    # A constraint no text satisfies is refused at once; one the matcher cannot follow (its
    # automaton past its limit) fails at that token: 400 naming the field, or, once a stream's
    # status has gone out, its last event.
    for extra, field, words in (({"guided_regex": "a{1000000000}"}, "guided_regex", "too many"),
                                ({"grammar": "root ::= x\nx ::= x"}, "grammar", "admits no text"),
                                ({"response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "x", "schema": {"$ref": "#"}}}},
                                 "response_format", "admits no text")):
        with pytest.raises(openai.BadRequestError) as ei:
            client.completions.create(model="x", prompt=PROMPT, max_tokens=4, extra_body=extra)
        assert ei.value.body["param"] == field and words in ei.value.message, ei.value.body
        r = httpx.post(f"{server}/v1/completions", headers=auth,
                       json={"prompt": PROMPT, "max_tokens": 4, "stream": True, **extra})
        if r.status_code == 200:
            err = json.loads(r.text.strip().split("\n\n")[-1].removeprefix("data: "))["error"]
        else:
            err = r.json()["error"]
            assert r.status_code == 400
        assert err["param"] == field and words in err["message"] and err["type"] == "invalid_request_error", err
    r = httpx.post(f"{server}/v1/completions", content=b"{not json", headers=auth)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    for deep in (b"[" * 30000 + b"]" * 30000, b'{"a":' * 10000 + b"1" + b"}" * 10000):
        r = httpx.post(f"{server}/v1/completions", content=deep, headers=auth)
        assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    for prompt in ("", [""]):
        r = httpx.post(f"{server}/v1/completions", json={"prompt": prompt}, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.json()
        assert "empty" in r.json()["error"]["message"]
    # A lone surrogate (valid JSON, not valid Unicode text) in each route's text names that text.
    for path, body, field in (("/v1/completions", {"prompt": "a\ud800"}, "prompt"),
                              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udfff"}]},
                               "messages"),
                              ("/tokenize", {"content": "\ud800"}, "content"),
                              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [
                                  {"type": "function", "function": {"name": "f\udc80"}}]}, "tools"),
                              ("/v1/completions", {"prompt": "hi", "guided_regex": "a\ud800"}, "guided_regex"),
                              ("/v1/completions", {"prompt": "hi", "grammar": 'root ::= "\udc80"'}, "grammar"),
                              ("/v1/embeddings", {"input": ["ok", "b\udc80"]}, "input")):
        r = httpx.post(f"{server}{path}", content=json.dumps(body).encode(),  # ASCII: "\\ud800" escapes
                       headers={**auth, "Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (path, r.text)
        assert "lone surrogate" in r.json()["error"]["message"], (path, r.text)
    r = httpx.post(f"{server}/v1/completions", content=b"x" * 70000, headers=auth)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(f"{server}/v1/nothing", headers=auth)
    assert r.status_code == 404 and "message" in r.json()["error"]


def test_the_model_is_listed_and_retrieved(client):
    listed = client.models.list().data
    assert len(listed) == 1
    card = client.models.retrieve(listed[0].id)
    assert card.id == listed[0].id and card.object == "model"
    with pytest.raises(openai.NotFoundError) as ei:
        client.models.retrieve("no-such-model")
    assert ei.value.body["code"] == "model_not_found" and "no-such-model" in ei.value.message


def test_a_developer_message_is_a_system_message(client):
    def reply(role: str) -> str | None:
        r = client.chat.completions.create(model="x", max_tokens=6, temperature=0, messages=[
            {"role": role, "content": "Answer in one word."}, {"role": "user", "content": "Name a colour."}])
        return r.choices[0].message.content

    assert reply("developer") == reply("system")


def test_api_key_refused_and_accepted(server, client):
    bad = openai.OpenAI(base_url=f"{server}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as ei:
        bad.models.list()
    assert ei.value.status_code == 401 and ei.value.body["code"] == "invalid_api_key"
    assert httpx.get(f"{server}/metrics").status_code == 401
    assert httpx.post(f"{server}/tokenize", json={"content": "hi"}).status_code == 401
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}  # open to orchestrators
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):  # off with a key
        assert httpx.get(f"{server}{path}").status_code in (401, 404), path
        assert httpx.get(f"{server}{path}", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404, path
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct.Q4_1"]


def test_tokenize_and_detokenize(server, model):
    auth = {"Authorization": f"Bearer {KEY}"}
    text = "Hello, world! Ünïcode"
    r = httpx.post(f"{server}/tokenize", json={"content": text}, headers=auth).json()
    assert r["tokens"] == model.tokenize(text, add_bos=False, special=True)
    r2 = httpx.post(f"{server}/detokenize", json={"tokens": r["tokens"]}, headers=auth).json()
    assert r2["content"] == text
    bad = httpx.post(f"{server}/detokenize", json={"tokens": [10**9]}, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


PROMPTS = [f"Write one sentence about {w}:" for w in
           ("rivers", "owls", "copper", "tea", "winter", "bridges", "chess", "salt", "clocks", "bees", "maps",
            "rain")]


def test_concurrent_streams_equal_one_at_a_time(server):
    async def one(c: openai.AsyncOpenAI, i: int) -> tuple[str, list[float]]:
        text, lps = [], []
        stream = await c.chat.completions.create(
            model="x", messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=10, temperature=0.6,
            seed=1000 + i, logprobs=True, stream=True)
        async for ch in stream:
            if ch.choices:
                text.append(ch.choices[0].delta.content or "")
                if ch.choices[0].logprobs:
                    lps += [t.logprob for t in ch.choices[0].logprobs.content]
        return "".join(text), lps

    async def run(concurrent: bool) -> list[tuple[str, list[float]]]:
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120) as c:
            if concurrent:
                return list(await asyncio.gather(*(one(c, i) for i in range(len(PROMPTS)))))
            return [await one(c, i) for i in range(len(PROMPTS))]

    alone = asyncio.run(run(False))
    before = metrics(server)
    together = asyncio.run(run(True))
    after = metrics(server)
    assert together == alone
    assert len({t for t, _ in alone}) == len(PROMPTS) and all(lps for _, lps in alone)
    # They ran as a batch: many more sequence rows than decode steps.
    rows = after["pyinfer:decode_rows_total"] - before["pyinfer:decode_rows_total"]
    steps = after["pyinfer:scheduler_steps_total"] - before["pyinfer:scheduler_steps_total"]
    assert rows > 3 * steps
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] >= 10 * len(PROMPTS)
    assert after["llamacpp:requests_processing"] == 0 and after["pyinfer:context_bytes_in_use"] == 0


def test_disconnect_mid_stream_frees_the_sequence(server):
    base = metrics(server)
    assert base["pyinfer:context_bytes_in_use"] == 0
    cancelled = 'pyinfer:requests_total{finish_reason="cancelled"}'
    body = {"model": "x", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as h, h.stream("POST", f"{server}/v1/chat/completions", json=body,
                                                  headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        events = []
        for line in lines:
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
            if len(events) >= 4:
                break
        during = metrics(server)
        assert during["llamacpp:requests_processing"] == 1 and during["pyinfer:context_bytes_in_use"] > 0
    # The client has gone: the sequence ends and its reservation returns within a step.
    deadline = time.monotonic() + 10
    while True:
        m = metrics(server)
        if m["pyinfer:context_bytes_in_use"] == 0 and m["llamacpp:requests_processing"] == 0:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
    assert m.get(cancelled, 0) == base.get(cancelled, 0) + 1
    assert m["llamacpp:tokens_predicted_total"] - base["llamacpp:tokens_predicted_total"] < 100
    assert m["pyinfer:context_budget_bytes"] > 0 and m["pyinfer:batch_occupancy"] == 0

    # A client that gives up on a whole (not streamed) completion cancels it too. The reply
    # cannot end early (end-of-turn tokens banned) and runs to the end of the context, far
    # past the client's 0.3 s (sampled hot, so that it does not fall into a loop that drafts
    # would copy at many tokens per step).
    body.update(stream=False, max_tokens=2000, logit_bias={"0": -100, "2": -100}, temperature=1.5, seed=3)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=httpx.Timeout(10, read=0.3))
    deadline = time.monotonic() + 10
    while True:
        m = metrics(server)
        if m.get(cancelled, 0) == base.get(cancelled, 0) + 2:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
    assert m["pyinfer:context_bytes_in_use"] == 0 and m["llamacpp:requests_processing"] == 0


def test_overload_answers_503_and_the_server_keeps_serving(model):
    from starlette.testclient import TestClient

    from pyinfer.server import create_app

    with Engine(model) as probe:
        one = probe.context_bytes_for(256)
    engine = Engine(model, kv_budget_bytes=one + one // 2, max_queue=1)
    app = create_app(engine, model_name="m")
    with TestClient(app) as tc:
        # a runs to its max_tokens (end-of-turn tokens banned; greedy, it ends in about 30),
        # so b is still queued when the request below arrives, however slowly it is served.
        banned = {t: float("-inf") for t in model.tokenizer.eot_ids}
        a = engine.submit(PROMPT, max_tokens=200, temperature=0, logit_bias=banned)
        next(a)  # running, holding the whole budget
        b = engine.submit(PROMPT, max_tokens=4, temperature=0)  # queued
        r = tc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "overloaded"
        assert "llamacpp:requests_deferred 1.0" in tc.get("/metrics").text
        a.cancel()
        assert b.result(60).finish_reason == "length"
        r = tc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        # A request whose context alone is past the budget: a 400 naming max_tokens, not a 503.
        r = tc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 500})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    assert engine.closed  # the app's shutdown closed it


def test_docs_are_served_only_without_an_api_key(model):
    from starlette.testclient import TestClient

    from pyinfer.server import create_app

    for key, status in ((None, 200), ("k", 404)):
        with Engine(model) as engine, TestClient(create_app(engine, model_name="m", api_key=key)) as tc:
            for path in ("/docs", "/redoc", "/openapi.json"):
                assert tc.get(path).status_code == status, (key, path)
