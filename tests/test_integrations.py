"""Wrappers written for llama-cpp-python run on pyinfer through the `llama_cpp` alias
(`import pyinfer.as_llama_cpp`): LangChain's LlamaCpp (invoke, stream, a GBNF grammar) and
ChatLlamaCpp (invoke, stream), with the keywords they pass (rope_freq_base, n_parts, f16_kv),
and llama-index's LlamaCPP (complete, stream_complete, chat, stream_chat)."""

from __future__ import annotations

import os
import sys

import pytest

import pyinfer.as_llama_cpp  # the alias, before LangChain or llama-index imports llama_cpp
from pyinfer import Llama, Model

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # langchain-community's own notice; legacy keywords
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
]


def test_the_alias_is_pyinfer():
    import llama_cpp

    from pyinfer.llama_compat import Llama

    assert sys.modules["llama_cpp"] is pyinfer.as_llama_cpp and llama_cpp.Llama is Llama


def test_langchain_llamacpp(default_model):
    from langchain_community.llms import LlamaCpp

    # rope_freq_base as the file has it, so the output is the model's own.
    base = Model.load(default_model, n_ctx=64).config.rope_base
    llm = LlamaCpp(model_path=str(default_model), n_ctx=512, temperature=0, max_tokens=8, rope_freq_base=base,
                   verbose=False)
    # LangChain's sampling defaults: a repetition penalty of 1.1 over the last 64 tokens.
    want = Model.load(default_model, n_ctx=512).generate("The capital of France is", max_tokens=8, temperature=0,
                                                         repeat_penalty=1.1, repeat_last_n=64)
    assert llm.invoke("The capital of France is") == want.text
    assert "".join(llm.stream("The capital of France is")) == want.text
    yes_no = LlamaCpp(model_path=str(default_model), n_ctx=512, temperature=0.9, max_tokens=4, verbose=False,
                      grammar='root ::= " yes" | " no"')
    assert yes_no.invoke("Is the sea salty? Answer:") in (" yes", " no")


def test_langchain_chat_llamacpp(default_model):
    from langchain_community.chat_models import ChatLlamaCpp

    base = Model.load(default_model, n_ctx=64).config.rope_base
    chat = ChatLlamaCpp(model_path=str(default_model), n_ctx=512, temperature=0, max_tokens=8, rope_freq_base=base,
                        verbose=False)
    # What the wrapper asks of llama_cpp.Llama, asked of pyinfer.Llama directly.
    direct = Llama(model_path=str(default_model), n_ctx=512, last_n_tokens_size=64, verbose=False)
    want = direct.create_chat_completion([{"role": "user", "content": "Name a colour."}], max_tokens=8,
                                         temperature=0, top_p=0.95, top_k=40, repeat_penalty=1.1)
    text = want["choices"][0]["message"]["content"]
    assert text and chat.invoke([("user", "Name a colour.")]).content == text
    assert "".join(ch.content for ch in chat.stream([("user", "Name a colour.")])) == text


def test_keywords_old_wrappers_pass(default_model):
    import pyinfer.llama_compat as lc

    lc._warned.clear()
    with pytest.warns(DeprecationWarning, match="n_parts is a keyword of older"):
        Llama(model_path=str(default_model), n_ctx=64, n_parts=-1, f16_kv=True, verbose=False)
    base = Model.load(default_model, n_ctx=64)
    moved = Model.load(default_model, n_ctx=64, rope_freq_base=base.config.rope_base / 10)
    assert moved.config.rope_base == base.config.rope_base / 10
    ids = base.tokenize("The capital of France is")
    assert not (moved.logits(ids)[-1] == base.logits(ids)[-1]).all()  # the override is honoured
    with pytest.raises(ValueError, match="rope_freq_base must be a number > 1"):
        Model.load(default_model, n_ctx=64, rope_freq_base=-1.0)


def test_llama_index_llamacpp(default_model):
    # llama-index-llms-llama-cpp depends on llama-cpp-python, which pyinfer stands in for, so it
    # is installed without its dependencies (`pip install --no-deps
    # "llama-index-llms-llama-cpp==0.7.0"`, as CI does; llama-index-core comes with the test
    # extra). Without it the test skips, except in CI, where it must run.
    try:
        from llama_index.llms.llama_cpp import LlamaCPP
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip('llama-index-llms-llama-cpp is not installed: pip install --no-deps '
                    '"llama-index-llms-llama-cpp==0.7.0"')
    from llama_index.core.llms import ChatMessage

    llm = LlamaCPP(model_path=str(default_model), temperature=0, max_new_tokens=8, context_window=512,
                   verbose=False)
    assert llm.metadata.context_window == 512 and llm.metadata.num_output == 8
    # What the wrapper asks of llama_cpp.Llama, asked of pyinfer.Llama directly.
    direct = Llama(model_path=str(default_model), n_ctx=512, verbose=False)

    def want(prompt: str) -> str:
        return direct(prompt=prompt, temperature=0, max_tokens=8)["choices"][0]["text"]

    text = want(llm.completion_to_prompt("The capital of France is"))
    assert text and llm.complete("The capital of France is").text == text
    deltas = [r.delta for r in llm.stream_complete("The capital of France is")]
    assert len(deltas) > 1 and "".join(deltas) == text
    messages = [ChatMessage(role="system", content="Answer in one word."),
                ChatMessage(role="user", content="Name a colour.")]
    reply = want(llm.messages_to_prompt(messages))
    assert reply and llm.chat(messages).message.content == reply
    assert "".join(r.delta or "" for r in llm.stream_chat(messages)) == reply
