"""The OpenAI API's result shapes (text_completion, chat.completion, chat.completion.chunk,
usage, both logprobs shapes) as TypedDicts, and the functions that build them: shared by
`pyinfer.Llama` and an HTTP server, so both send the same JSON.

Fields and their order follow the OpenAI API (and llama-cpp-python, which follows it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypedDict

from pyinfer.request import Timings
from pyinfer.sampling import TokenLogprob
from pyinfer.tokenizer import Tokenizer

# ---- shapes


class PromptTokensDetails(TypedDict):
    cached_tokens: int


class _Counts(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Usage(_Counts, total=False):
    prompt_tokens_details: PromptTokensDetails


class ServerTimings(TypedDict):
    """Where a request's time went, in llama.cpp's server's `timings` names (milliseconds)
    plus the parts before prefill: queue_ms (waiting for admission), tokenize_ms, and
    ttft_ms from arrival to the first token, first_sample_ms (the sampler on the first
    token's logits). cache_n: prompt tokens taken from the prefix cache, not evaluated
    (prompt_n counts the evaluated ones). predicted_n counts every token sampled, an
    end-of-turn token included. draft_n: tokens guessed by speculative decoding,
    draft_n_accepted of them kept."""

    prompt_n: int
    prompt_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    cache_n: int
    queue_ms: float
    tokenize_ms: float
    first_sample_ms: float
    draft_n: int
    draft_n_accepted: int
    ttft_ms: float | None


class CompletionLogprobs(TypedDict):
    """Per token: its text, where that text starts in the completion, its log-probability
    and the most likely alternatives (text -> log-probability; None for the first echoed
    prompt token)."""

    tokens: list[str]
    text_offset: list[int]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class _TextCompletionBase(TypedDict):
    id: str
    object: str  # "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]


class TextCompletion(_TextCompletionBase, total=False):
    usage: Usage  # in a whole completion, not in stream chunks
    timings: ServerTimings  # from the server: in a whole completion and a stream's last chunk


class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TypedDict):
    token: str
    bytes: list[int] | None
    logprob: float | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(TypedDict):
    content: list[ChatTokenLogprob]
    refusal: None


class _ChatMessageBase(TypedDict):
    role: str
    content: str | None  # None when the reply is a tool call


class ChatMessage(_ChatMessageBase, total=False):
    tool_calls: list[dict[str, Any]]


class ChatChoice(TypedDict):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class _ChatCompletionBase(TypedDict):
    id: str
    object: str  # "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatCompletion(_ChatCompletionBase, total=False):
    timings: ServerTimings  # from the server


class ChatDelta(TypedDict, total=False):
    role: str
    content: str
    tool_calls: list[dict[str, Any]]


class ChatChunkChoice(TypedDict):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class _ChatCompletionChunkBase(TypedDict):
    id: str
    model: str
    created: int
    object: str  # "chat.completion.chunk"
    choices: list[ChatChunkChoice]  # empty in the usage chunk that ends a stream


class ChatCompletionChunk(_ChatCompletionChunkBase, total=False):
    usage: Usage  # only in the last chunk, when the stream was asked to include usage
    timings: ServerTimings  # from the server, in the chunk with the finish_reason


# ---- builders


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> Usage:
    """prompt_tokens: the whole prompt; cached_tokens of it from the prefix cache, given by
    the server (OpenAI's prompt_tokens_details), left out by Llama (llama-cpp-python's shape)."""
    u: Usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return u


def server_timings(t: Timings) -> ServerTimings:
    """A request's Timings in the server's shape."""
    decode_ms = t.decode_s * 1e3
    return {
        "prompt_n": t.prompt_tokens,
        "prompt_ms": t.prefill_s * 1e3,
        "prompt_per_second": t.prefill_tokens_per_s,
        "predicted_n": t.sampled_tokens,
        "predicted_ms": decode_ms,
        "predicted_per_second": t.decode_tokens_per_s,
        "cache_n": t.cached_tokens,
        "queue_ms": t.queue_s * 1e3,
        "tokenize_ms": t.tokenize_s * 1e3,
        "first_sample_ms": t.first_sample_s * 1e3,
        "draft_n": t.draft_tokens,
        "draft_n_accepted": t.draft_accepted,
        "ttft_ms": None if t.ttft_s is None else t.ttft_s * 1e3,
    }


def text_completion(
    cid: str,
    created: int,
    model: str,
    text: str,
    logprobs: CompletionLogprobs | None,
    finish_reason: str | None,
) -> TextCompletion:
    """A "text_completion" with one choice: a whole completion (add "usage") or a chunk."""
    return {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
        ],
    }


def completion_logprobs(
    tokenizer: Tokenizer, ids: Sequence[int], lps: Sequence[TokenLogprob | None], offset: int,
    prefix: bytes = b"",
) -> CompletionLogprobs:
    """The completion logprobs of tokens whose text starts at character `offset`, after the
    bytes `prefix` (the tokens before them: a stream's earlier chunks); an entry of None in
    lps gives null values (the first echoed prompt token)."""
    tokens: list[str] = []
    offsets: list[int] = []
    token_lps: list[float | None] = []
    top: list[dict[str, float] | None] = []
    done = prefix
    for tok, lp in zip(ids, lps):
        offsets.append(offset + len(done.decode("utf-8", errors="ignore")))
        piece = tokenizer.detokenize([tok], special=False)
        done += piece
        text = piece.decode("utf-8", errors="ignore")
        tokens.append(text)
        if lp is None:
            token_lps.append(None)
            top.append(None)
            continue
        token_lps.append(lp.logprob)
        # This shape keys the alternatives by their text, so tokens that decode alike (two
        # halves of a character both give "") share one key: it keeps the higher logprob, the
        # sampled token's own included (the chat shape, a list, keeps every alternative).
        alts: dict[str, float] = {}
        for i, v in (*lp.top, (tok, lp.logprob)):
            t = tokenizer.detokenize([i], special=False).decode("utf-8", errors="ignore")
            if t not in alts or v > alts[t]:
                alts[t] = v
        top.append(alts)
    return {
        "tokens": tokens,
        "text_offset": offsets,
        "token_logprobs": token_lps,
        "top_logprobs": top,
    }


def chat_token_logprobs(
    tokenizer: Tokenizer, ids: Sequence[int], lps: Sequence[TokenLogprob]
) -> ChatLogprobs:
    """The chat shape built from the tokens themselves, as the OpenAI API gives it: per token
    its text, bytes and logprob, and top_logprobs the n most likely alternatives, every one
    of them (tokens that decode to the same text included), so an empty list for n = 0."""

    def entry(i: int, v: float) -> TopLogprob:
        piece = tokenizer.detokenize([i], special=False)
        return {"token": piece.decode("utf-8", errors="ignore"), "logprob": v, "bytes": list(piece)}

    content: list[ChatTokenLogprob] = []
    for tok, lp in zip(ids, lps):
        e = entry(tok, lp.logprob)
        content.append({"token": e["token"], "bytes": e["bytes"], "logprob": lp.logprob,
                        "top_logprobs": [entry(i, v) for i, v in lp.top]})
    return {"content": content, "refusal": None}


def chat_logprobs(lp: CompletionLogprobs | None) -> ChatLogprobs | None:
    """Completion logprobs in the chat shape ({"content": [...], "refusal": None}), as
    llama-cpp-python derives it (alternatives that shared a text key stay merged; the
    server builds the shape from the tokens with chat_token_logprobs)."""
    if lp is None:
        return None
    content: list[ChatTokenLogprob] = [
        {
            "token": tok,
            "bytes": None,
            "logprob": value,
            "top_logprobs": [
                {"token": t, "logprob": v, "bytes": None} for t, v in (top or {}).items()
            ],
        }
        for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])
    ]
    return {"content": content, "refusal": None}


def chat_completion(result: TextCompletion) -> ChatCompletion:
    """A whole text completion (with usage) as a "chat.completion" with the assistant's
    message."""
    choice = result["choices"][0]
    out: ChatCompletion = {
        "id": "chat" + result["id"],
        "object": "chat.completion",
        "created": result["created"],
        "model": result["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": choice["text"]},
                "logprobs": chat_logprobs(choice["logprobs"]),
                "finish_reason": choice["finish_reason"],
            }
        ],
        "usage": result["usage"],
    }
    if "timings" in result:
        out["timings"] = result["timings"]
    return out


def chat_chunks(chunks: Iterator[TextCompletion]) -> Iterator[ChatCompletionChunk]:
    """Text-completion chunks as "chat.completion.chunk"s: a first delta with the role,
    then one per piece of content, then an empty delta with the finish_reason. Closing
    this stream closes `chunks`."""
    try:
        for i, ch in enumerate(chunks):
            cid, model, created = "chat" + ch["id"], ch["model"], ch["created"]
            c = ch["choices"][0]
            if i == 0:
                yield chat_chunk(cid, model, created, {"role": "assistant"}, None, None)
            delta: ChatDelta = {"content": c["text"]} if c["finish_reason"] is None else {}
            yield chat_chunk(
                cid, model, created, delta, chat_logprobs(c["logprobs"]), c["finish_reason"]
            )
    finally:
        close: Any = getattr(chunks, "close", None)
        if close is not None:
            close()


def chat_chunk(
    cid: str,
    model: str,
    created: int,
    delta: ChatDelta,
    logprobs: ChatLogprobs | None,
    finish_reason: str | None,
) -> ChatCompletionChunk:
    """One "chat.completion.chunk" with one choice."""
    return {
        "id": cid,
        "model": model,
        "created": created,
        "object": "chat.completion.chunk",
        "choices": [
            {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        ],
    }
