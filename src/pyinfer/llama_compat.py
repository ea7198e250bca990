"""`pyinfer.Llama`: the part of llama-cpp-python's `Llama` class most applications use, with
its signatures, defaults and OpenAI-shaped result dicts, running on pyinfer's model.

An application written against llama-cpp-python 0.3 switches by changing its import:

    from pyinfer import Llama          # was: from llama_cpp import Llama
    llm = Llama(model_path="model.gguf", n_ctx=2048, seed=1337)
    out = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"])
    print(out["choices"][0]["text"])

What matches llama-cpp-python:

- `create_completion` / `__call__` and `create_chat_completion` take the same arguments with
  the same defaults, and return the same dicts ("text_completion", "chat.completion") or
  stream the same chunks ("chat.completion.chunk": a first delta {"role": "assistant"}, then
  {"content": ...}, then {} with the finish_reason).
- A text prompt is tokenized with special=True and the file's BOS rule; a prompt of n_ctx
  tokens or more raises ValueError("Requested tokens (N) exceed context window of M")
  (`pyinfer.ContextOverflowError`, a ValueError); max_tokens None or <= 0 generates until the
  context is full.
- `tokenize(bytes, add_bos=True, special=False)`: as in llama.cpp, add_bos=True adds the BOS
  token only when the file asks for one (`tokenizer.ggml.add_bos_token`).
- One context belongs to the object: `eval(tokens)` appends to it (from position `n_tokens`,
  which a caller may lower to rewind), `reset()` empties it, `input_ids` [n_ctx] holds its
  tokens and `scores` [n_ctx, n_vocab] float32 their logits: every evaluated row with
  logits_all=True, else the row of the last token evaluated. Completions run in the same
  context and, like llama-cpp-python, reuse the longest common prefix of the previous
  sequence and the new prompt: only the rest of the prompt is evaluated.
- Seeds: `Llama(seed=s)` with s >= 0 makes a run of calls reproducible (each call without a
  seed derives the next seed from the previous one, as llama-cpp-python does); a per-call
  `seed` fixes that call. seed=-1 or LLAMA_DEFAULT_SEED (the default) means random.

Where it differs (pyinfer runs on CPUs only, and some features are not implemented):

- Keyword arguments that only place or tune work on other hardware (`n_gpu_layers`,
  `use_mmap`, `use_mlock`, `n_ubatch`, `flash_attn`, ... see IGNORED_KWARGS) are accepted
  and ignored. Those that would change results and are not implemented (`lora_path`,
  `kv_overrides`, `draft_model`, ...) raise NotImplementedError unless left
  at their default. An unknown keyword raises TypeError (llama-cpp-python ignores it).
- Constraints: `grammar=LlamaGrammar.from_string(gbnf)` / `.from_json_schema(text)`,
  `response_format` {"type": "json_object"} (with an optional "schema") and forced
  `tool_choice` / `function_call` (returned as "tool_calls") go through pyinfer.constraint
  (llguidance); a forced call is not streamed.
- Sampling: `typical_p` other than 1 and `mirostat_mode` other than 0 raise
  NotImplementedError. Temperature is applied before top-k/top-p/
  min-p (see pyinfer.sampling), and the repetition penalties look at the prompt as well as
  the generated tokens (llama-cpp-python: the generated ones only), so sampled (not greedy) text
  differs from llama-cpp-python's for the same seed; the random generators differ anyway.
  A character left unfinished when max_tokens ends a completion comes out as U+FFFD
  (llama-cpp-python drops its bytes).
- `logprobs` works without logits_all=True, and with echo the prompt tokens' log-probabilities
  are those of the tokens themselves (llama-cpp-python pairs each with the next position's
  row). Values are Python floats (llama-cpp-python returns NumPy float32s).
- Chat: `chat_format` may be None (the file's template), "chat_template.default",
  "chat_template.<name>" for a named template in the file, or one of the built-in formats
  (pyinfer.chat.CHAT_FORMATS: chatml, llama-2, llama-3, mistral-instruct, gemma, phi-3,
  alpaca, vicuna, zephyr; llama-cpp-python's others are not provided, and vicuna has no
  default system prompt). `logprobs=True` without `top_logprobs` gives the tokens' own
  log-probabilities (llama-cpp-python gives none).
- `suffix` makes a fill-in-the-middle prompt from the vocabulary's FIM tokens (fim_tokens:
  the file's tokenizer.ggml.fim_*_token_id keys, else tokens named like <|fim_prefix|>), and
  the reply is the middle; on a vocabulary without them it raises ValueError
  (llama-cpp-python appends the suffix to the text). `echo` also works when streaming (the
  prompt is the first chunk).
- `vocab_only=True` reads the file's header alone: tokenize/detokenize and the accessors
  work, and everything that evaluates raises RuntimeError. `context_params` and
  `model_params` show the settings as llama-cpp-python's objects do; a Llama pickles as its
  constructor's arguments.
- The object has one context, so a call made while a stream is still open ends that stream
  (llama-cpp-python lets both go on evaluating into the same context). Calls from several
  threads take turns (a lock per object; a stream or generate() holds it for each item, not
  between them), where llama-cpp-python's race on the shared context. For requests served
  side by side, use pyinfer.Engine (or `pyinfer serve`).
- `create_embedding` and `embed` pool the final hidden states by their mean (Model.embed);
  `embedding=True` is accepted and not needed.
- `logits_processor` / `stopping_criteria` (LogitsProcessorList, StoppingCriteriaList, or
  plain functions), the token-level `generate()` and `sample()`, `save_state` / `load_state`
  (a LlamaState: in memory it carries a copy of the KV cache; pickled, its tokens, evaluated
  again on loading) and `set_cache(LlamaRAMCache())` work as in llama-cpp-python.
- Not provided: from_pretrained (pyinfer loads no weights from a hub at run time), nor the
  low-level C API (llama_cpp.llama_* functions, ctypes structures, llama_cpp._internals).
  `.model` is the pyinfer Model (a C pointer in llama-cpp-python), `_ctx` its Context.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import secrets
import sys
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, ParamSpec, TypeVar, Union

import numpy as np

from pyinfer import _C, openai_types
from pyinfer.chat import CHAT_FORMATS, ChatTemplate, builtin_template
from pyinfer.constraint import Constraint, constraint_from
from pyinfer.errors import ContextOverflowError, ParameterTypeError
from pyinfer.generate import CompletionChunk, generate
from pyinfer.gguf import GGUFReader
from pyinfer.model import MAX_TOKENS, Context, Model, default_threads
from pyinfer.registry import resolve_model
from pyinfer.request import common_prefix
from pyinfer.sampling import Sampler, SamplingParams, TokenLogprob, log_softmax
from pyinfer.tokenizer import Tokenizer
from pyinfer.tools import parse_tool_call, parse_tools, tool_call_schema

# llama.cpp's "pick a random seed" value, llama-cpp-python's default seed.
LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# Constructor keywords of llama-cpp-python that only place or tune work on hardware pyinfer
# does not use (GPUs, NUMA, memory locking) or pick what is already fixed here (the physical
# batch, flash attention, the KV cache type): accepted and ignored, so code written for
# llama-cpp-python runs unchanged.
IGNORED_KWARGS = frozenset(
    {
        "n_gpu_layers",
        "split_mode",
        "main_gpu",
        "tensor_split",
        "use_mmap",
        "use_mlock",
        "n_ubatch",
        "n_threads_batch",
        "rope_scaling_type",
        "pooling_type",
        "attention_type",
        "yarn_ext_factor",
        "yarn_attn_factor",
        "yarn_beta_fast",
        "yarn_beta_slow",
        "yarn_orig_ctx",
        "offload_kqv",
        "flash_attn",
        "op_offload",
        "swa_full",
        "no_perf",
        "lora_scale",
        "numa",
        "type_k",
        "type_v",
        "embedding",  # embeddings need no mode: create_embedding / embed work on any Llama
    }
)

# Constructor keywords that would change results and are not implemented: accepted only at
# the value that means "off" (llama-cpp-python's default).
UNSUPPORTED_KWARGS: dict[str, Any] = {
    "kv_overrides": None,
    "lora_base": None,
    "lora_path": None,
    "chat_handler": None,
    "draft_model": None,
    "tokenizer": None,
}

# Keywords of older llama-cpp-python releases, with no meaning now: accepted with a warning
# (once per keyword and process), as wrappers written against those releases still pass them.
LEGACY_KWARGS = frozenset({"n_parts", "f16_kv", "low_vram", "mul_mat_q", "n_gqa", "rms_norm_eps", "mmq"})
_warned: set[str] = set()

# pyinfer's own constructor keywords, beyond llama-cpp-python's.
PYINFER_KWARGS = frozenset({"precision", "kv_dtype"})

# llama-cpp-python's sampling defaults, part of its API and kept as they are here, apart
# from llama.cpp's (SamplingParams' own): create_chat_completion's temperature is lower, and
# either set may move on its own. last_n_tokens_size defaults to repeat_last_n.
COMPLETION_DEFAULTS = SamplingParams(
    temperature=0.8,
    top_k=40,
    top_p=0.95,
    min_p=0.05,
    repeat_penalty=1.0,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    repeat_last_n=64,
)
CHAT_DEFAULTS = dataclasses.replace(COMPLETION_DEFAULTS, temperature=0.2)


StopArg = Optional[Union[str, list[str]]]


def _metadata_strings(metadata: Mapping[str, Any]) -> dict[str, str]:
    """GGUF metadata as llama.cpp reports it through llama-cpp-python: every scalar as a
    string (booleans "true"/"false", floats "%f"); arrays are left out."""
    out: dict[str, str] = {}
    for key, value in metadata.items():
        if isinstance(value, (list, tuple, np.ndarray)):
            continue
        if isinstance(value, (bool, np.bool_)):
            out[key] = "true" if value else "false"
        elif isinstance(value, (float, np.floating)):
            out[key] = f"{float(value):f}"
        elif isinstance(value, (int, np.integer)):
            out[key] = str(int(value))
        else:
            out[key] = str(value)
    return out


def _token_list(tokens: Any, what: str) -> list[int]:
    if isinstance(tokens, (str, bytes, bytearray)):
        raise ParameterTypeError(
            f"{what} must be a sequence of token ids, not {type(tokens).__name__}"
        )
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ParameterTypeError(
                f"{what} must be a 1-D integer array, got {tokens.dtype} {tokens.shape}"
            )
        return tokens.tolist()
    out = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise ParameterTypeError(f"{what} must hold ints, not {type(t).__name__}")
        out.append(int(t))
    return out


def _not_implemented(name: str, value: Any, default: Any) -> None:
    """Refuse a value other than the default (off) for a feature pyinfer does not have."""
    differs = value is not None if default is None else value != default
    if differs:
        raise NotImplementedError(
            f"{name}={value!r} is not supported by pyinfer.Llama (only {default!r})"
        )


class LlamaGrammar:
    """llama-cpp-python's grammar object: a GBNF grammar (`from_string`, `from_file`) or a
    JSON schema (`from_json_schema`), constraining a completion through `grammar=`. It holds
    the source; each completion compiles its own pyinfer.constraint.Constraint (llguidance)."""

    def __init__(self, *, _kind: str, _source: str) -> None:
        self._kind, self._source = _kind, _source

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        if not isinstance(grammar, str):
            raise ParameterTypeError(f"grammar must be a str, not {type(grammar).__name__}")
        return cls(_kind="gbnf", _source=grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        return cls.from_string(Path(file).read_text(encoding="utf-8"), verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> LlamaGrammar:
        if not isinstance(json_schema, str):
            raise ParameterTypeError(f"json_schema must be a JSON str, not {type(json_schema).__name__}")
        return cls(_kind="json_schema", _source=json_schema)

    def constraint(self, tokenizer: Tokenizer) -> Constraint:
        if self._kind == "gbnf":
            return Constraint.gbnf(tokenizer, self._source)
        return Constraint.json_schema(tokenizer, self._source)


def _grammar_constraint(grammar: object, tokenizer: Tokenizer) -> Constraint | None:
    if grammar is None:
        return None
    if isinstance(grammar, Constraint):
        return grammar
    if not isinstance(grammar, LlamaGrammar):
        raise ParameterTypeError(f"grammar must be a LlamaGrammar, not {type(grammar).__name__}")
    return grammar.constraint(tokenizer)


class LogitsProcessorList(list):
    """Functions f(input_ids, scores) -> scores applied in turn to each row before sampling
    (input_ids: the tokens so far, prompt included; scores: the row, float32 [n_vocab])."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for f in self:
            scores = f(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Functions f(input_ids, logits) -> bool asked after each token: any true stops."""

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return any(f(input_ids, logits) for f in self)


def _hook_list(value: Any, kind: type, name: str) -> Any:
    if value is None:
        return None
    if isinstance(value, kind):
        return value
    if isinstance(value, (list, tuple)):
        return kind(value)
    if callable(value):
        return kind([value])
    raise ParameterTypeError(f"{name} must be a {kind.__name__}, a list of functions or a function")


@dataclasses.dataclass
class LlamaState:
    """A Llama's sequence, to restore into a Llama of the same model: the tokens, the logits
    rows kept, the seed chain, and a copy of the KV cache. Pickled, it leaves the KV copy
    behind: restoring it then evaluates the tokens again (the cache rebuilt is the saved one
    bit for bit on the fast path); in memory, restoring copies the cache back."""

    input_ids: np.ndarray
    scores: np.ndarray
    n_tokens: int
    seed: int
    model_path: str
    kv: Any = None  # a pyinfer Context holding the first n_tokens positions

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "kv": None}


class LlamaRAMCache:
    """States by their tokens, kept in memory up to capacity_bytes (least recently used
    dropped first); `cache[ids]` is the state sharing the longest prefix with ids, and
    `Llama.set_cache(cache)` makes completions start from it when it shares more of the
    prompt than the context holds."""

    def __init__(self, capacity_bytes: int = 2 << 30) -> None:
        self.capacity_bytes = int(capacity_bytes)
        self._states: dict[tuple[int, ...], LlamaState] = {}

    @property
    def cache_size(self) -> int:
        return sum(st.scores.nbytes + st.input_ids.nbytes + (st.kv.kv_nbytes if st.kv is not None else 0)
                   for st in self._states.values())

    def _longest(self, key: Sequence[int]) -> tuple[int, ...] | None:
        """The cached key sharing the longest prefix with key (None: none shares a token)."""
        best, best_n = None, 0
        for k in self._states:
            n = common_prefix(k, key)
            if n > best_n:
                best, best_n = k, n
        return best

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        k = self._longest(key)
        if k is None:
            raise KeyError("no cached state shares a prefix with this key")
        st = self._states.pop(k)
        self._states[k] = st  # most recently used last
        return st

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._longest(key) is not None

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        self._states.pop(tuple(key), None)
        self._states[tuple(key)] = value
        while self._states and self.cache_size > self.capacity_bytes:
            del self._states[next(iter(self._states))]


# Fill-in-the-middle: the metadata keys that name the three tokens (llama.cpp's, then those of
# older converters), and the token texts llama.cpp recognises when a file names none (Qwen
# and CodeGemma, OpenCoder, StarCoder and Granite, DeepSeek with its full-width bars and the
# ASCII spelling some conversions have, CodeLlama, GLM-4.5, Falcon-H1).
FIM_KEYS = {
    "prefix": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suffix": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "middle": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
}
FIM_TEXTS = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim▁begin\uff5c>", "<|fim▁begin|>", "<PRE>",
               "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim▁hole\uff5c>", "<|fim▁hole|>", "<SUF>",
               "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim▁end\uff5c>", "<|fim▁end|>", "<MID>",
               "▁<MID>", "<|code_middle|>", "<|middle|>"),
}


@dataclasses.dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int


def fim_tokens(metadata: Mapping[str, Any]) -> FimTokens | None:
    """The vocabulary's fill-in-the-middle tokens, or None when it lacks any of the three: each
    from its metadata key when the file has one, else the first token whose text is one of
    FIM_TEXTS[part] (in that list's order)."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    n = len(tokens) if tokens is not None else 0
    index: dict[str, int] | None = None
    found: dict[str, int] = {}
    for part in ("prefix", "suffix", "middle"):
        ids = [metadata[k] for k in FIM_KEYS[part] if k in metadata]
        valid = [int(i) for i in ids if isinstance(i, (int, np.integer)) and 0 <= int(i) < n]
        if valid:
            found[part] = valid[0]
            continue
        if index is None:
            wanted = {t for texts in FIM_TEXTS.values() for t in texts}
            index = {}
            for i, t in enumerate(tokens if tokens is not None else []):
                if t in wanted and t not in index:
                    index[t] = i
        hit = next((index[t] for t in FIM_TEXTS[part] if t in index), None)
        if hit is None:
            return None
        found[part] = hit
    return FimTokens(**found)


class LlamaTokenizer:
    """What `Llama.tokenizer()` returns, as in llama-cpp-python: tokenize/detokenize on bytes,
    encode/decode on str, through the Llama's vocabulary."""

    def __init__(self, llama: Llama) -> None:
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        return self._llama.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: list[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str | os.PathLike[str]) -> LlamaTokenizer:
        """The tokenizer of a GGUF file alone (its weights are not loaded)."""
        return cls(Llama(model_path=path, vocab_only=True, verbose=False))


@dataclasses.dataclass
class ModelParams:
    """The loading settings as llama-cpp-python's `Llama.model_params` shows them (on a CPU
    the GPU ones only echo what was passed)."""

    vocab_only: bool = False
    n_gpu_layers: int = 0
    split_mode: int = 1
    main_gpu: int = 0
    use_mmap: bool = True
    use_mlock: bool = False


@dataclasses.dataclass
class ContextParams:
    """The context's settings as llama-cpp-python's `Llama.context_params` shows them: n_ctx is
    the context's real size (the model's training context when 0 was asked for); rope_freq_base
    and rope_freq_scale are what was passed (0: the file's)."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    n_threads_batch: int
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    embeddings: bool = False
    offload_kqv: bool = True
    flash_attn: bool = False
    no_perf: bool = False


class _Sequence:
    """The Llama's context as generate() sees it: a sequence that starts empty, although the
    first `cached` prompt tokens are already in the KV cache from an earlier call and are
    skipped instead of evaluated again. Positions are the real ones, so generate()'s checks
    against n_ctx hold."""

    def __init__(self, llama: Llama, cached: int, n_prompt: int, prompt_rows: bool) -> None:
        self._llama = llama
        self._cached = cached
        self._n_prompt = n_prompt
        self._prompt_rows = prompt_rows  # keep every prompt row in scores (echo + logprobs)
        self.n_ctx = llama._n_ctx
        self.n_past = 0

    def eval(self, ids: list[int]) -> np.ndarray:
        start = self.n_past
        self.n_past = start + len(ids)
        if self.n_past <= self._cached:
            # generate() only uses the logits of the last prompt chunk, which always has a
            # token to evaluate (the cached prefix stops one short of the prompt).
            return self._llama.scores[0]
        skip = max(0, self._cached - start)
        rows = self._prompt_rows and start < self._n_prompt
        return self._llama._eval(ids[skip:], all_rows=rows)

    def reset(self) -> None:
        self._llama._context.reset()
        self._llama.n_tokens = 0
        self._cached = 0
        self.n_past = 0


_P = ParamSpec("_P")
_R = TypeVar("_R")


class _TurnLock:
    """A re-entrant lock handed over in the order threads asked for it (a ticket each), so a
    thread reading a stream in a tight loop cannot take it back ahead of another thread's
    call waiting for it. A waiter interrupted (KeyboardInterrupt) gives its turn up."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._next = 0  # the next ticket to give out
        self._serving = 0  # the ticket whose turn it is
        self._given_up: set[int] = set()
        self.in_hook = 0  # the owner is running a user's logits_processor or stopping_criteria

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            ticket = self._next
            self._next += 1
            try:
                self._cond.wait_for(lambda: self._owner is None and self._serving == ticket)
            except BaseException:
                self._given_up.add(ticket)
                self._advance()
                raise
            self._owner, self._depth = me, 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._serving += 1
                self._advance()

    def _advance(self) -> None:
        """Past the turns given up, then wake the waiters (with the condition's lock held)."""
        while self._owner is None and self._serving in self._given_up:
            self._given_up.remove(self._serving)
            self._serving += 1
        self._cond.notify_all()


def _refuse_in_hook(lock: _TurnLock, what: str) -> None:
    """RuntimeError if the lock's owner is inside one of its Llama's hooks: the one context is in
    the middle of that completion (what: the call refused, as the sentence's subject)."""
    if lock.in_hook:
        raise RuntimeError(
            f"{what} from a logits_processor or stopping_criteria of the same Llama, whose one context "
            "is in the middle of that completion: use another Llama (or a pyinfer.Model) inside a hook"
        )


def _one_at_a_time(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A Llama method run under the object's lock: the context and its token and logit rows
    are shared state, so calls from several threads take turns (re-entrant: the methods call
    one another)."""

    @functools.wraps(method)
    def locked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with args[0]._lock:  # type: ignore[attr-defined]
            _refuse_in_hook(args[0]._lock, f"Llama.{method.__name__}() was called")  # type: ignore[attr-defined]
            return method(*args, **kwargs)

    return locked


def _in_turns(method: Callable[_P, Iterator[_R]]) -> Callable[_P, Iterator[_R]]:
    """A Llama generator method whose items are each made under the object's lock (_Turns)."""

    @functools.wraps(method)
    def turns(*args: _P.args, **kwargs: _P.kwargs) -> Iterator[_R]:
        return _Turns(args[0]._lock, method(*args, **kwargs))  # type: ignore[attr-defined]

    return turns


class _Turns(Iterator[_R]):
    """An iterator over a Llama's context (a stream, generate()'s tokens) that takes the
    object's lock for each item: another thread's call runs between two items, and ends the
    iterator where it ends a stream (close(), also under the lock)."""

    def __init__(self, lock: _TurnLock, inner: Iterator[_R]) -> None:
        self._lock = lock
        self._inner: Iterator[_R] | None = inner

    def __next__(self) -> _R:
        with self._lock:
            if self._inner is None:
                raise StopIteration
            _refuse_in_hook(self._lock, "a stream or generate() of a Llama was read")
            try:
                return next(self._inner)
            except BaseException:
                self._inner = None  # ended or failed: later calls stop
                raise

    def close(self) -> None:
        with self._lock:
            inner, self._inner = self._inner, None
            if inner is not None:
                inner.close()  # type: ignore[attr-defined]


class Llama:
    """A GGUF model and one context on it, with llama-cpp-python's `Llama` interface.

    >>> llm = Llama(model_path="SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=512, verbose=False)
    >>> llm("The capital of France is", max_tokens=4, temperature=0)["choices"][0]["text"]
    ' Paris.\\n\\n'
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None,
        *,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_threads: int | None = None,
        seed: int = LLAMA_DEFAULT_SEED,
        logits_all: bool = False,
        verbose: bool = True,
        chat_format: str | None = None,
        last_n_tokens_size: int = COMPLETION_DEFAULTS.repeat_last_n,
        **kwargs: Any,
    ) -> None:
        """Load `model_path` (a GGUF file; None: pyinfer's default model).

        n_ctx: tokens the context holds (0: the model's training context). n_batch: prompt
        tokens per forward call. n_threads: None uses every core this process may run on.
        seed: see the module's docstring. logits_all: keep the logits of every evaluated token
        in `scores` (perplexity). last_n_tokens_size: how many recent tokens the repetition
        penalties look at. chat_format: which chat template create_chat_completion uses.
        pyinfer's own keywords: precision ("fast" or "exact"), kv_dtype ("float32",
        "float16" or "q8_0"). Other llama-cpp-python keywords: see IGNORED_KWARGS / UNSUPPORTED_KWARGS.
        """
        self._lock = _TurnLock()  # calls from several threads take turns (_one_at_a_time)
        t0 = time.perf_counter()
        # Pickling a Llama (llama-cpp-python's __getstate__) loads it again from these.
        self._init_kwargs: dict[str, Any] = dict(
            model_path=model_path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, seed=seed,
            logits_all=logits_all, verbose=verbose, chat_format=chat_format,
            last_n_tokens_size=last_n_tokens_size, **kwargs)
        extra: dict[str, Any] = {}
        passed = dict(kwargs)
        vocab_only = bool(passed.pop("vocab_only", False))
        self.spm_infill = bool(passed.pop("spm_infill", False))
        for name, value in passed.items():
            if name in IGNORED_KWARGS:
                continue
            if name in LEGACY_KWARGS:
                if name not in _warned:
                    _warned.add(name)
                    warnings.warn(f"Llama: {name} is a keyword of older llama-cpp-python releases and is ignored",
                                  DeprecationWarning, stacklevel=2)
                continue
            if name in ("rope_freq_base", "rope_freq_scale"):
                # 0 (llama-cpp-python's default): the file's value; else an override.
                if value:
                    extra[name] = value
                continue
            if name in UNSUPPORTED_KWARGS:
                _not_implemented(name, value, UNSUPPORTED_KWARGS[name])
            elif name in PYINFER_KWARGS:
                extra[name] = value
            else:
                raise TypeError(f"Llama.__init__() got an unexpected keyword argument {name!r}")
        for name, v in (
            ("n_ctx", n_ctx),
            ("n_batch", n_batch),
            ("last_n_tokens_size", last_n_tokens_size),
        ):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ParameterTypeError(f"{name} must be an int, not {type(v).__name__}")
        if n_ctx < 0:
            raise ValueError(f"n_ctx must be >= 0 (0: the model's training context), got {n_ctx}")
        if n_batch < 1:
            raise ValueError(f"n_batch must be >= 1, got {n_batch}")
        if not 0 <= last_n_tokens_size <= MAX_TOKENS:
            raise ValueError(f"last_n_tokens_size must be in [0, {MAX_TOKENS}], got {last_n_tokens_size}")
        n_ubatch = kwargs.get("n_ubatch", 512)
        if isinstance(n_ubatch, bool) or not isinstance(n_ubatch, (int, np.integer)):
            raise ParameterTypeError(f"n_ubatch must be an int, not {type(n_ubatch).__name__}")
        if n_ubatch < 1:
            raise ValueError(f"n_ubatch must be >= 1, got {n_ubatch}")
        if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer))
                                      or n_threads < 0):
            raise ValueError(f"n_threads must be a positive integer, 0 or None (the default), got {n_threads!r}")
        if model_path is None:
            path = resolve_model(None)
        else:
            path = Path(os.fspath(model_path))
            if not path.is_file():
                raise ValueError(f"Model path does not exist: {model_path}")

        self.verbose = bool(verbose)
        self.model_path = str(path) if model_path is None else os.fspath(model_path)
        self.set_seed(seed)
        self.last_n_tokens_size = int(last_n_tokens_size)
        self._logits_all = bool(logits_all)
        # llama-cpp-python's flags for recurrent and hybrid (attention + recurrent) models:
        # every architecture pyinfer runs is a transformer with a KV cache.
        self._is_recurrent = False
        self._is_hybrid = False

        self.model: Model | None
        if vocab_only:
            # The tokenizer alone: the header is parsed (its pages are all that is read) and the
            # file unmapped again; no weight is touched, nor any context made.
            with GGUFReader(path) as reader:
                md = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in reader.metadata.items()}
            self.model = None
            self._md: Mapping[str, Any] = md
            self._tokenizer = Tokenizer(md)
            arch = md.get("general.architecture", "")
            n_train = md.get(f"{arch}.context_length")
            self._n_ctx = int(n_ctx) if n_ctx else int(n_train) if isinstance(n_train, (int, np.integer)) else 0
            self.n_batch = min(self._n_ctx, int(n_batch)) if self._n_ctx else int(n_batch)
            self.n_threads = int(n_threads) if n_threads else default_threads()
            self._ctx_obj: Context | None = None
            self._n_vocab = len(md["tokenizer.ggml.tokens"])
            self.scores = np.empty((0, self._n_vocab), dtype=np.single)
            desc = f"vocabulary only ({self._n_vocab} tokens)"
        else:
            self.model = Model.load(path, n_threads=n_threads, **extra)
            config = self.model.config
            self._md = self.model.reader.metadata
            self._n_ctx = int(n_ctx) if n_ctx else config.n_ctx_train
            if not n_ctx and self._n_ctx > MAX_TOKENS:
                raise ValueError(f"n_ctx=0 asks for the file's context_length, {self._n_ctx} tokens, more than "
                                 f"a context can hold ({MAX_TOKENS}): pass n_ctx")
            self.n_batch = min(self._n_ctx, int(n_batch))
            self.n_threads = self.model.n_threads
            self._ctx_obj = self.model.context(self._n_ctx, n_batch=self.n_batch)
            self._tokenizer = self.model.tokenizer
            self._n_vocab = config.n_vocab
            # np.empty commits memory only for the rows written.
            self.scores = np.empty((self._n_ctx, self._n_vocab), dtype=np.single)
            desc = (f"{config.architecture}, {config.n_layer} layers, vocab {config.n_vocab}) "
                    f"n_ctx={self._n_ctx} n_batch={self.n_batch} n_threads={self.n_threads} "
                    f"precision={self.model.precision} isa={_C.get_isa()}")
        self.metadata: dict[str, str] = _metadata_strings(self._md)
        self._fim = fim_tokens(self._md)
        self.model_params = ModelParams(
            vocab_only=vocab_only, n_gpu_layers=int(kwargs.get("n_gpu_layers", 0) or 0),
            use_mmap=bool(kwargs.get("use_mmap", True)), use_mlock=bool(kwargs.get("use_mlock", False)))
        self.context_params = ContextParams(
            n_ctx=self._n_ctx, n_batch=self.n_batch, n_ubatch=min(self.n_batch, int(n_ubatch)),
            n_threads=self.n_threads, n_threads_batch=self.n_threads,
            rope_freq_base=float(kwargs.get("rope_freq_base", 0.0) or 0.0),
            rope_freq_scale=float(kwargs.get("rope_freq_scale", 0.0) or 0.0),
            embeddings=bool(kwargs.get("embedding", False)), flash_attn=bool(kwargs.get("flash_attn", False)))

        # Like llama-cpp-python's.
        self.n_tokens = 0
        self.input_ids: np.ndarray = np.zeros(self._n_ctx, dtype=np.intc)
        self._stream: Iterator[Any] | None = None  # an open completion stream
        self.cache: LlamaRAMCache | None = None  # set_cache

        self.chat_format = chat_format
        self._chat_stops: list[str] = []
        self._chat_template = self._resolve_chat_format(chat_format)

        if self.verbose:
            print(f"pyinfer: loaded {self.model_path} ({desc} in {time.perf_counter() - t0:.2f} s",
                  file=sys.stderr)

    def _user_hooks(self, value: Any, kind: type, name: str) -> Callable[..., Any] | None:
        """A logits_processor or stopping_criteria as one function that marks, while it runs,
        that this Llama is inside a user's hook (a call back into it is refused there)."""
        hooks = _hook_list(value, kind, name)
        if hooks is None:
            return None

        def call(*args: Any) -> Any:
            self._lock.in_hook += 1
            try:
                return hooks(*args)
            finally:
                self._lock.in_hook -= 1

        return call

    def _need_model(self, what: str) -> Model:
        """The model, or a clear error on a Llama loaded with vocab_only=True."""
        if self.model is None:
            raise RuntimeError(f"Llama.{what}() needs the model's weights, but {self.model_path} was loaded "
                               "with vocab_only=True (tokenize/detokenize only): load it without vocab_only")
        return self.model

    @property
    def _context(self) -> Context:
        if self._ctx_obj is None:
            self._need_model("eval")
        assert self._ctx_obj is not None
        return self._ctx_obj

    @property
    def _ctx(self) -> Context | None:
        """The context (a pyinfer Context; llama-cpp-python's wraps llama.cpp's), None with
        vocab_only."""
        return self._ctx_obj

    def __getstate__(self) -> dict[str, Any]:
        # As llama-cpp-python: a pickled Llama is its constructor's arguments, loaded again
        # when unpickled (the sequence in the context is not kept: save_state keeps that).
        return dict(self._init_kwargs)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    # -- chat formats --

    def _resolve_chat_format(self, chat_format: str | None) -> ChatTemplate | None:
        """The template for chat_format, or None when the file has none (an error at the
        first chat call, not at load: a model may be used for completions only)."""
        md = self._md
        if chat_format is not None and not isinstance(chat_format, str):
            raise ParameterTypeError(f"chat_format must be a str or None, not {type(chat_format).__name__}")
        if chat_format is None and builtin_template(md) is not None:
            return ChatTemplate.from_metadata(md)  # the architecture's built-in turns (Gemma's)
        if chat_format is None or chat_format == "chat_template.default":
            if "tokenizer.chat_template" not in md:
                if chat_format is not None:
                    raise ValueError(
                        "chat_format='chat_template.default': the file has no chat template"
                    )
                return None
            return self.model.chat_template if self.model is not None else ChatTemplate.from_metadata(md)
        if chat_format in CHAT_FORMATS:
            fmt = CHAT_FORMATS[chat_format]
            self._chat_stops = [fmt.stop]
            tmpl = ChatTemplate.from_metadata(md, template=fmt.template)
            if not self._tokenizer.add_bos:
                tmpl.bos_token = ""  # the BOS a format opens with, only where the file adds one (llama.cpp's rule)
            return tmpl
        if chat_format.startswith("chat_template."):
            name = chat_format[len("chat_template.") :]
            if f"tokenizer.chat_template.{name}" in md:
                return ChatTemplate.from_metadata(md, name=name)
        named = sorted(
            k[len("tokenizer.") :] for k in md if k.startswith("tokenizer.chat_template.")
        )
        choices = ["chat_template.default"] if "tokenizer.chat_template" in md else []
        raise ValueError(
            f"chat_format {chat_format!r} is not available: use None (the file's template), "
            f"{', '.join(map(repr, choices + named + sorted(CHAT_FORMATS)))}"
        )

    # -- embeddings --

    def embed(self, input: str | list[str] | list[int] | list[list[int]], normalize: bool = False,
              truncate: bool = True, return_count: bool = False) -> Any:
        """Embedding of a text (a list of floats), or of each text of a list (a list of
        lists): the mean of the final hidden states, scaled to unit length with normalize.
        truncate: a text longer than n_ctx keeps its first n_ctx tokens (else ValueError).
        return_count: also return the number of tokens embedded."""
        model = self._need_model("embed")
        one = isinstance(input, str) or (isinstance(input, list) and bool(input) and isinstance(input[0], int))
        if not isinstance(input, (str, list, tuple)):
            raise ParameterTypeError(f"input must be a str, a list of str or token ids, not {type(input).__name__}")
        items: list[Any] = [input] if one else list(input)
        ids: list[list[int]] = []
        for i, t in enumerate(items):
            if isinstance(t, str):
                ids.append(self._tokenizer.tokenize(t))
            elif isinstance(t, (list, tuple)) and all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in t
            ):
                ids.append([int(v) for v in t])
            else:
                raise ParameterTypeError(f"input[{i}] must be a str or a list of token ids, not {type(t).__name__}")
        limit = min(self._n_ctx, model.n_ctx)  # the model's own cap applies to embeddings too
        if truncate:
            ids = [t[:limit] for t in ids]
        elif any(len(t) > limit for t in ids):
            n = max(map(len, ids))
            raise ContextOverflowError(f"an input of {n} tokens is longer than n_ctx {limit}: pass truncate=True "
                                       "to embed its first n_ctx tokens", n, limit)
        # Evaluated together, in contexts of their own (Model.embed), not in this Llama's.
        rows = model.embed(ids, normalize=normalize).tolist() if ids else []
        out = rows[0] if one else rows
        return (out, sum(map(len, ids))) if return_count else out

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        """The OpenAI "list" of "embedding" objects for a text or a list of texts."""
        texts = [input] if isinstance(input, str) else list(input)
        rows, n = self.embed(texts, normalize=True, return_count=True)
        return {"object": "list", "model": model if model is not None else self.model_path,
                "data": [{"object": "embedding", "embedding": r, "index": i} for i, r in enumerate(rows)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    # -- tokens --

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of UTF-8 `text`. add_bos=True adds the BOS token when the model's file
        asks for one (llama.cpp's rule); special=True matches control-token texts
        ("<|im_start|>") as their ids."""
        if isinstance(text, str):
            raise TypeError(
                "Llama.tokenize() takes UTF-8 bytes, not str: pass text.encode('utf-8')"
            )
        if not isinstance(text, (bytes, bytearray, memoryview)):
            raise TypeError(f"Llama.tokenize() takes bytes, not {type(text).__name__}")
        s = bytes(text).decode("utf-8", errors="replace")
        return self._tokenizer.tokenize(
            s, add_bos=None if add_bos else False, special=bool(special)
        )

    def detokenize(
        self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False
    ) -> bytes:
        """The bytes of `tokens`; control tokens are written only with special=True.
        prev_tokens is accepted for compatibility (byte-level BPE needs no offset mapping)."""
        ids = _token_list(tokens, "tokens")
        out = self._tokenizer.detokenize(ids, special=bool(special))
        # llama-cpp-python drops a space that follows a leading BOS (SentencePiece's prefix).
        if ids and ids[0] == self.token_bos() and out[:1] == b" ":
            out = out[1:]
        return out

    def n_ctx(self) -> int:
        return self._n_ctx

    def n_vocab(self) -> int:
        return self._n_vocab

    def n_embd(self) -> int:
        if self.model is not None:
            return self.model.config.n_embd
        n = self._md.get(f"{self._md.get('general.architecture', '')}.embedding_length")
        return int(n) if isinstance(n, (int, np.integer)) else 0

    def tokenizer(self) -> LlamaTokenizer:
        """The vocabulary as a tokenizer object (encode/decode on str, tokenize/detokenize on bytes)."""
        return LlamaTokenizer(self)

    def token_bos(self) -> int:
        """The BOS id, -1 when the vocabulary has none."""
        bos = self._tokenizer.bos_id
        return -1 if bos is None else bos

    def token_eos(self) -> int:
        """The EOS id, -1 when the vocabulary has none."""
        eos = self._tokenizer.eos_id
        return -1 if eos is None else eos

    def token_nl(self) -> int:
        """The id of the newline token."""
        ids = self._tokenizer.tokenize("\n", add_bos=False)
        return ids[0] if len(ids) == 1 else -1

    # -- the context --

    @_one_at_a_time
    def set_seed(self, seed: int) -> None:
        """The seed of the next completion that passes none (-1 or LLAMA_DEFAULT_SEED: random)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ParameterTypeError(f"seed must be an int, not {type(seed).__name__}")
        if seed < -1 or seed >= 2**64:
            raise ValueError(f"seed must be in [0, 2**64), or -1 for random, got {seed}")
        self._seed = int(seed)

    def _call_seed(self, seed: int | None) -> int | None:
        """The sampler's seed for one completion (None: random), advancing the chain."""
        if seed is not None:
            self.set_seed(seed)
            s = self._seed
        elif self._seed in (-1, LLAMA_DEFAULT_SEED):
            s = secrets.randbits(32)
        else:
            # llama-cpp-python's chain: each call's seed comes from the previous one.
            s = random.Random(self._seed).randint(0, 2**32)
            self._seed = s
        return None if s in (-1, LLAMA_DEFAULT_SEED) else s

    def _close_stream(self) -> None:
        # The context has one sequence: a new call ends a stream still open on it.
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()  # type: ignore[attr-defined]

    @_one_at_a_time
    def reset(self) -> None:
        """Empty the context (n_tokens = 0)."""
        self._close_stream()
        self.n_tokens = 0
        if self._ctx_obj is not None:
            self._ctx_obj.reset()

    @_one_at_a_time
    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens at positions n_tokens.. (a caller may lower n_tokens to rewind),
        storing them in input_ids and their logits in scores (every row with logits_all,
        else the last one's)."""
        self._need_model("eval")
        self._close_stream()
        ids = _token_list(tokens, "tokens")
        if not ids:
            return
        self._eval(ids, all_rows=self._logits_all)

    def _eval(self, ids: list[int], *, all_rows: bool) -> np.ndarray:
        ctx = self._context
        n0 = self.n_tokens
        if not 0 <= n0 <= ctx.n_past:
            raise ValueError(f"n_tokens is {n0}, but the context holds {ctx.n_past} tokens")
        if n0 + len(ids) > self._n_ctx:
            raise ContextOverflowError(
                f"Requested tokens ({n0 + len(ids)}) exceed context window of {self._n_ctx}",
                n0 + len(ids),
                self._n_ctx,
            )
        if n0 < ctx.n_past:
            ctx.truncate(n0)
        n1 = n0 + len(ids)
        if all_rows or self._logits_all:
            self.scores[n0:n1] = ctx.eval(ids, all_logits=True)
        else:
            self.scores[n1 - 1] = ctx.eval(ids)
        self.input_ids[n0:n1] = ids
        self.n_tokens = n1
        return self.scores[n1 - 1]

    @property
    def eval_tokens(self) -> deque[int]:
        return deque(self.input_ids[: self.n_tokens].tolist(), maxlen=self._n_ctx)

    @property
    def eval_logits(self) -> deque[list[float]]:
        rows = (
            self.scores[: self.n_tokens]
            if self._logits_all
            else self.scores[max(0, self.n_tokens - 1) : self.n_tokens]
        )
        return deque(rows.tolist(), maxlen=self._n_ctx if self._logits_all else 1)

    # -- token-level generation and state

    @_one_at_a_time
    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
               mirostat_eta: float = 0.1, mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor: Any = None, grammar: Any = None, idx: int | None = None) -> int:
        """A token sampled from the logits of the last token evaluated (or of row idx, with
        logits_all), the repetition penalties looking at the tokens evaluated."""
        _not_implemented("typical_p", typical_p, 1.0)
        _not_implemented("mirostat_mode", mirostat_mode, 0)
        _not_implemented("grammar", grammar, None)
        self._need_model("sample")
        if self.n_tokens == 0:
            raise ValueError("nothing evaluated yet: eval() tokens before sample()")
        if idx is not None:
            if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
                raise ParameterTypeError(f"idx must be an int or None, not {type(idx).__name__}")
            last = self.n_tokens - 1
            first = 0 if self._logits_all else self.n_tokens - 1
            if not first <= idx <= last:
                rows = f"rows 0..{last}" if self._logits_all else f"row {last} (without logits_all, the last only)"
                raise ValueError(f"idx={idx}: the scores hold {rows}")
        row = self.scores[self.n_tokens - 1 if idx is None else int(idx)].copy()
        hist = self.input_ids[: self.n_tokens]
        proc = self._user_hooks(logits_processor, LogitsProcessorList, "logits_processor")
        if proc is not None:
            row = np.ascontiguousarray(proc(hist.copy(), row), np.float32)
        greedy = temp <= 0
        params = SamplingParams(temperature=max(temp, 0.0), top_k=0 if top_k < 0 else top_k, top_p=top_p,
                                min_p=min_p, repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, repeat_last_n=self.last_n_tokens_size,
                                seed=None if greedy else self._call_seed(None))
        return Sampler(params, self.n_vocab()).sample(row, hist.tolist())

    @_in_turns
    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: Any = None, stopping_criteria: Any = None,
                 grammar: Any = None) -> Iterator[int]:
        """Evaluate tokens, then sample and yield one token at a time for ever (the caller
        stops: a context that fills raises ContextOverflowError). With reset, the context
        keeps the longest common prefix of what it holds and tokens, evaluating the rest. A
        call in between two tokens (from any thread) does not change what comes next: the
        generator's sequence is evaluated again where the other call changed the context."""
        self._need_model("generate")
        ids = _token_list(tokens, "tokens")
        stopping = self._user_hooks(stopping_criteria, StoppingCriteriaList, "stopping_criteria")
        if reset:
            self._close_stream()
            keep = min(common_prefix(self.input_ids[: self.n_tokens], ids), len(ids) - 1)
            self.n_tokens = max(keep, 0)
            ids = ids[self.n_tokens:]
        seq: np.ndarray | None = None  # what the context holds after this generator's last step
        while True:
            if seq is not None and (self.n_tokens != len(seq) or not np.array_equal(self.input_ids[: len(seq)], seq)):
                # Another call has used the context since the last token: back to the longest
                # prefix it still shares with this sequence, the rest evaluated again.
                self.n_tokens = common_prefix(self.input_ids[: self.n_tokens], seq)
                ids = seq[self.n_tokens :].tolist() + ids
            self.eval(ids)
            seq = self.input_ids[: self.n_tokens].copy()
            tok = self.sample(top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp,
                              repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                              presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
                              logits_processor=logits_processor, grammar=grammar)
            if stopping is not None and stopping(self.input_ids[: self.n_tokens].copy(),
                                                 self.scores[self.n_tokens - 1]):
                return
            yield tok
            ids = [tok]

    @_one_at_a_time
    def save_state(self) -> LlamaState:
        """The sequence now (tokens, logits rows kept, the seed chain, the KV cache)."""
        self._close_stream()
        n = self.n_tokens
        rows = self.scores[:n].copy() if self._logits_all else self.scores[max(0, n - 1) : n].copy()
        kv = None
        if n:
            kv = self._need_model("save_state").context(n_ctx=n, n_batch=1)
            kv.copy_prefix(self._context, n)
        return LlamaState(self.input_ids[:n].copy(), rows, n, self._seed, self.model_path, kv)

    @_one_at_a_time
    def load_state(self, state: LlamaState) -> None:
        """Continue from a saved state (of a Llama of the same model file): its tokens are
        evaluated into this context."""
        self._need_model("load_state")
        if not isinstance(state, LlamaState):
            raise ParameterTypeError(f"state must be a LlamaState, not {type(state).__name__}")
        if Path(state.model_path).name != Path(self.model_path).name:
            raise ValueError(f"the state is of {state.model_path}, not {self.model_path}")
        if state.n_tokens > self._n_ctx:
            raise ContextOverflowError(f"the state holds {state.n_tokens} tokens, more than n_ctx {self._n_ctx}",
                                       state.n_tokens, self._n_ctx)
        self.reset()
        n = state.n_tokens
        if n and state.kv is not None and state.kv.model is self.model:
            self._context.copy_prefix(state.kv, n)
            self.input_ids[:n] = state.input_ids[:n]
            self.scores[n - len(state.scores) : n] = state.scores
            self.n_tokens = n
        elif n:
            self.eval(state.input_ids[:n].tolist())
        self._seed = state.seed

    def set_cache(self, cache: LlamaRAMCache | None) -> None:
        """Completions look up (and store) their prompt's state in cache."""
        if cache is not None and not isinstance(cache, LlamaRAMCache):
            raise ParameterTypeError(f"cache must be a LlamaRAMCache, not {type(cache).__name__}")
        self.cache = cache

    @staticmethod
    def logits_to_logprobs(logits: Any, axis: int = -1) -> np.ndarray:
        """log-softmax along axis, in float32 like llama-cpp-python."""
        return log_softmax(logits, axis)

    @_one_at_a_time
    def close(self) -> None:
        """End an open stream and empty the context."""
        self._close_stream()
        if self._ctx_obj is not None:
            self._ctx_obj.reset()
        self.n_tokens = 0

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- completions --

    def _prompt_ids(self, prompt: str | list[int]) -> tuple[list[int], str]:
        """Token ids and text of a prompt: text is tokenized as llama-cpp-python does (the
        file's BOS rule, control-token texts matched); ids are taken as they are."""
        tok = self._tokenizer
        if isinstance(prompt, str):
            ids = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
            if prompt:
                ids += tok.tokenize(prompt, add_bos=False, special=True)
            return ids, prompt
        if isinstance(prompt, (list, tuple, np.ndarray)):
            ids = _token_list(prompt, "prompt")
            bad = [t for t in ids if not 0 <= t < self._n_vocab]
            if bad:
                raise ValueError(
                    f"prompt token id {bad[0]} is outside the vocabulary [0, {self._n_vocab})"
                )
            return ids, tok.detokenize(ids, special=False).decode("utf-8", errors="ignore")
        raise ParameterTypeError(
            f"prompt must be a str or a list of token ids, not {type(prompt).__name__}"
        )

    def _fim_prompt(self, prompt: str | list[int], ids: list[int], suffix: str) -> list[int]:
        """The fill-in-the-middle prompt for a text before (prompt) and after (suffix) the gap:
        [BOS] <prefix> prompt <suffix> suffix <middle>, llama.cpp's order (with spm_infill:
        <suffix> suffix <prefix> prompt <middle>), the model writing the middle next. Texts are
        tokenized without matching control-token texts; a prompt of ids is used as it is."""
        f = self._fim
        if f is None:
            raise ValueError(
                f"suffix is given, which asks for fill-in-the-middle, but the vocabulary of {self.model_path} has "
                "no FIM tokens (none named by tokenizer.ggml.fim_pre_token_id / fim_suf_token_id / "
                "fim_mid_token_id, nor tokens such as <|fim_prefix|> or <fim_prefix>): leave suffix out"
            )
        tok = self._tokenizer
        if isinstance(prompt, str):
            bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
            before = tok.tokenize(prompt, add_bos=False, special=False) if prompt else []
        else:
            bos, before = [], ids
        after = tok.tokenize(suffix, add_bos=False, special=False) if suffix else []
        pre, suf = [f.prefix, *before], [f.suffix, *after]
        return bos + (suf + pre if self.spm_infill else pre + suf) + [f.middle]

    def _prompt_logprobs(self, ids: list[int], n_top: int) -> list[TokenLogprob | None]:
        """Each prompt token's log-probability given the tokens before it, from the rows the
        prompt left in scores; the first has none."""
        out: list[TokenLogprob | None] = [None]
        if len(ids) > 1:
            lp = self.logits_to_logprobs(self.scores[: len(ids) - 1]).astype(np.float64)
            for p in range(1, len(ids)):
                row = lp[p - 1]
                best: Any = []
                if n_top:
                    best = np.argpartition(-row, n_top - 1)[:n_top]
                    best = best[np.argsort(-row[best], kind="stable")]
                out.append(
                    TokenLogprob(
                        ids[p], float(row[ids[p]]), tuple((int(i), float(row[i])) for i in best)
                    )
                )
        return out

    @_one_at_a_time
    def create_completion(
        self,
        prompt: str | list[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = COMPLETION_DEFAULTS.temperature,
        top_p: float = COMPLETION_DEFAULTS.top_p,
        min_p: float = COMPLETION_DEFAULTS.min_p,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: StopArg = [],  # noqa: B006  (llama-cpp-python's default; never mutated)
        frequency_penalty: float = COMPLETION_DEFAULTS.frequency_penalty,
        presence_penalty: float = COMPLETION_DEFAULTS.presence_penalty,
        repeat_penalty: float = COMPLETION_DEFAULTS.repeat_penalty,
        top_k: int = COMPLETION_DEFAULTS.top_k,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: Any = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: dict[int, float] | None = None,
    ) -> openai_types.TextCompletion | Iterator[openai_types.TextCompletion]:
        """Continue `prompt` (text, or token ids): an OpenAI "text_completion" dict, or with
        stream=True an iterator of chunks whose last one has text "" and the finish_reason.

        max_tokens None or <= 0: until an end-of-turn token or a full context. stop: strings
        that end the text (not returned). temperature 0 is greedy. logprobs: how many
        alternatives to report with each token's log-probability. echo: start the text with
        the prompt. tfs_z, mirostat_tau and mirostat_eta are accepted and unused (tfs_z is
        gone from llama.cpp; mirostat is not implemented).
        """
        self._need_model("create_completion")
        self._close_stream()
        if suffix is not None and not isinstance(suffix, str):
            raise ParameterTypeError(f"suffix must be a str or None, not {type(suffix).__name__}")
        _not_implemented("typical_p", typical_p, 1.0)
        _not_implemented("mirostat_mode", mirostat_mode, 0)
        constraint = _grammar_constraint(grammar, self._tokenizer)
        processor = self._user_hooks(logits_processor, LogitsProcessorList, "logits_processor")
        stopping = self._user_hooks(stopping_criteria, StoppingCriteriaList, "stopping_criteria")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer))
        ):
            raise ParameterTypeError(
                f"max_tokens must be an int or None, not {type(max_tokens).__name__}"
            )

        ids, prompt_text = self._prompt_ids(prompt)
        if suffix is not None:
            ids = self._fim_prompt(prompt, ids, suffix)
        if not ids:
            raise ValueError(
                "the prompt is empty (and this model adds no BOS token): nothing to continue"
            )
        n_ctx = self._n_ctx
        if len(ids) >= n_ctx:
            raise ContextOverflowError(
                f"Requested tokens ({len(ids)}) exceed context window of {n_ctx}", len(ids), n_ctx
            )
        room = n_ctx - len(ids)
        max_new = room if max_tokens is None or max_tokens <= 0 else min(int(max_tokens), room)

        stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        if logit_bias is not None and not isinstance(logit_bias, Mapping):
            raise ParameterTypeError(
                f"logit_bias must be a dict of token id -> bias, not {type(logit_bias).__name__}"
            )
        try:
            bias = {int(k): float(v) for k, v in (logit_bias or {}).items()}
        except (TypeError, ValueError) as e:
            raise ParameterTypeError(f"logit_bias must map token ids to numbers: {e}") from None
        if isinstance(top_k, (int, np.integer)) and not isinstance(top_k, bool) and top_k < 0:
            top_k = 0  # llama.cpp: top_k <= 0 keeps every token
        if (
            isinstance(temperature, (int, float))
            and not isinstance(temperature, bool)
            and temperature < 0
        ):
            # llama.cpp: a negative temperature samples the plain softmax, no filters.
            temperature, top_k, top_p, min_p = 1.0, 0, 1.0, 0.0
        params = SamplingParams(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            repeat_penalty=repeat_penalty,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            repeat_last_n=self.last_n_tokens_size,
            logit_bias=bias,
            seed=None,
            logprobs=logprobs,
        )
        # The seed chain moves on every call, greedy ones included, as in llama-cpp-python.
        call_seed = self._call_seed(seed)
        if not params.greedy:
            params = dataclasses.replace(params, seed=call_seed)

        # Reuse the KV cache for the longest common prefix, but evaluate at least the prompt's
        # last token (its logits pick the first new token). Echoed logprobs need every prompt
        # row, which only logits_all keeps for the cached part.
        prompt_rows = bool(echo) and logprobs is not None
        if self.cache is not None and ids in self.cache:
            st = self.cache[ids]
            here = common_prefix(self.input_ids[: self.n_tokens], ids)
            if common_prefix(st.input_ids, ids) > here:
                self.load_state(st)
        cached = min(common_prefix(self.input_ids[: self.n_tokens], ids), len(ids) - 1)
        if prompt_rows and not self._logits_all:
            cached = 0
        self.n_tokens = cached
        self._context.truncate(cached)
        seq = _Sequence(self, cached, len(ids), prompt_rows)

        cid = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        name = model if model is not None else self.model_path
        chunks = generate(
            seq,
            self._tokenizer,
            ids,
            params,
            max_tokens=max_new,
            stop=stops,
            stream=True,
            n_batch=self.n_batch,
            constraint=constraint,
            logits_processor=processor,
            stopping_criteria=stopping,
        )

        def shape(
            text: str, lp: openai_types.CompletionLogprobs | None, finish: str | None
        ) -> openai_types.TextCompletion:
            return openai_types.text_completion(cid, created, name, text, lp, finish)

        if stream:
            it = _Turns(self._lock, self._stream_completion(chunks, ids, prompt_text, bool(echo), logprobs, shape))
            self._stream = it
            return it

        text_parts: list[str] = []
        out_ids: list[int] = []
        out_lps: list[TokenLogprob | None] = []
        last = CompletionChunk("", [])
        for last in chunks:
            text_parts.append(last.text)
            out_ids += last.token_ids
            out_lps += last.logprobs or []
        text = "".join(text_parts)
        if self.cache is not None and self.n_tokens:
            self.cache[self.input_ids[: self.n_tokens].tolist()] = self.save_state()
        lp_dict: openai_types.CompletionLogprobs | None = None
        if logprobs is not None:
            if echo:
                # the prefill has left every prompt row in scores
                echoed, echoed_lps = self._echo_logprobs(ids, logprobs)
                lp_dict = openai_types.completion_logprobs(
                    self._tokenizer, echoed + out_ids, echoed_lps + out_lps, 0
                )
            else:
                lp_dict = openai_types.completion_logprobs(
                    self._tokenizer, out_ids, out_lps, len(prompt_text)
                )
        if echo:
            text = prompt_text + text
        self._report(last)
        result = shape(text, lp_dict, "stop" if last.finish_reason == "stop" else "length")
        result["usage"] = openai_types.usage(len(ids), len(out_ids))
        return result

    def _stream_completion(
        self,
        chunks: Iterator[CompletionChunk],
        ids: list[int],
        prompt_text: str,
        echo: bool,
        logprobs: int | None,
        shape: Callable[
            [str, openai_types.CompletionLogprobs | None, str | None], openai_types.TextCompletion
        ],
    ) -> Iterator[openai_types.TextCompletion]:
        """The stream of create_completion: a chunk per piece of text generate() emits, the
        prompt first with echo, then an empty chunk with the finish_reason."""
        offset = len(prompt_text)
        finish = "length"
        try:
            for i, ch in enumerate(chunks):
                if i == 0 and echo:
                    lp = None
                    if logprobs is not None:  # the prefill has run: the prompt rows are in
                        echoed, echoed_lps = self._echo_logprobs(ids, logprobs)
                        lp = openai_types.completion_logprobs(
                            self._tokenizer, echoed, echoed_lps, 0
                        )
                    yield shape(prompt_text, lp, None)
                if ch.text:
                    lp = None
                    if logprobs is not None:
                        lp = openai_types.completion_logprobs(
                            self._tokenizer, ch.token_ids, list(ch.logprobs or []), offset
                        )
                    offset += len(ch.text)
                    yield shape(ch.text, lp, None)
                if ch.finish_reason is not None:
                    finish = "stop" if ch.finish_reason == "stop" else "length"
                    self._report(ch)
            yield shape("", None, finish)
        finally:
            chunks.close()  # type: ignore[attr-defined]

    def _echo_logprobs(
        self, ids: list[int], n_top: int
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """The echoed prompt tokens (a leading BOS left out, as llama-cpp-python does) and
        their log-probabilities; the first has none (OpenAI's convention)."""
        skip = 1 if ids and ids[0] == self.token_bos() else 0
        lps = self._prompt_logprobs(ids, n_top)
        return ids[skip:], [None] + lps[skip + 1 :]

    def _report(self, chunk: CompletionChunk) -> None:
        if self.verbose and chunk.timings is not None:
            t = chunk.timings
            print(
                f"pyinfer: prompt {t.prompt_tokens} tokens in {t.prefill_s * 1e3:.1f} ms "
                f"({t.prefill_tokens_per_s:.1f} tok/s), {t.sampled_tokens} sampled "
                f"({t.decode_tokens_per_s:.1f} tok/s), total {t.total_s * 1e3:.1f} ms",
                file=sys.stderr,
            )

    __call__ = create_completion  # llama-cpp-python's __call__ takes the same arguments

    # -- chat --

    @_one_at_a_time
    def create_chat_completion(
        self,
        messages: list[dict[str, Any]],
        functions: list[dict[str, Any]] | None = None,
        function_call: Any = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        temperature: float = CHAT_DEFAULTS.temperature,
        top_p: float = CHAT_DEFAULTS.top_p,
        top_k: int = CHAT_DEFAULTS.top_k,
        min_p: float = CHAT_DEFAULTS.min_p,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: StopArg = [],  # noqa: B006
        seed: int | None = None,
        response_format: dict[str, Any] | None = None,
        max_tokens: int | None = None,
        presence_penalty: float = CHAT_DEFAULTS.presence_penalty,
        frequency_penalty: float = CHAT_DEFAULTS.frequency_penalty,
        repeat_penalty: float = CHAT_DEFAULTS.repeat_penalty,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: dict[int, float] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
    ) -> openai_types.ChatCompletion | Iterator[openai_types.ChatCompletionChunk]:
        """Reply to `messages` with the model's chat template: an OpenAI "chat.completion"
        dict, or with stream=True "chat.completion.chunk" dicts (a first delta with the
        role, then the content, then an empty delta with the finish_reason).

        tools are passed to the template; with tool_choice / function_call forcing a call
        ("required" or a named function) the reply is constrained to one and returned as
        "tool_calls" (with "auto", a reply that is a JSON call of a known function is too). A
        JSON response_format or a grammar constrains the reply.
        """
        self._need_model("create_chat_completion")
        if self._chat_template is None:
            raise ValueError(
                f"{self.model_path} has no chat template (tokenizer.chat_template): pass "
                "chat_format='chatml' or use create_completion"
            )
        if functions is not None and tools is None:
            tools = [{"type": "function", "function": f} for f in functions]
            if isinstance(function_call, Mapping):
                tool_choice = {"type": "function", "function": {"name": function_call.get("name")}}
            elif function_call is not None:
                tool_choice = function_call
        spec = parse_tools(tools, tool_choice)
        given = [n for n, v in (("grammar", grammar), ("response_format", response_format)) if v is not None]
        if response_format is not None and not isinstance(response_format, Mapping):
            raise ParameterTypeError(
                'response_format must be a dict such as {"type": "json_object"}, '
                f"not {type(response_format).__name__}"
            )
        if response_format is not None and response_format.get("type", "text") != "text":
            grammar = constraint_from(self._tokenizer, response_format=response_format)
        if spec is not None and spec.forced is not None:
            if given:
                raise ValueError(f"a forced tool call cannot be combined with {given[0]}")
            if stream:
                raise NotImplementedError("a forced tool call is not streamed by pyinfer.Llama: pass stream=False")
            grammar = Constraint.json_schema(self._tokenizer, tool_call_schema(spec))
        render_kwargs = {"tools": tools} if tools is not None else {}
        ids = self._chat_template.encode(
            self._tokenizer, messages, add_generation_prompt=True, **render_kwargs
        )

        stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        if self._chat_template.eos_token:
            stops.append(self._chat_template.eos_token)
        stops += [s for s in self._chat_stops if s not in stops]  # a built-in chat_format's end of turn
        n_top = None
        if logprobs:
            n_top = top_logprobs or 0
        result = self.create_completion(
            ids,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            logprobs=n_top,
            stop=stops,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            repeat_penalty=repeat_penalty,
            top_k=top_k,
            stream=stream,
            seed=seed,
            tfs_z=tfs_z,
            mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta,
            model=model,
            logits_processor=logits_processor,
            grammar=grammar,
            logit_bias=logit_bias,
        )
        if not stream:
            assert isinstance(result, dict)
            out = openai_types.chat_completion(result)
            call = parse_tool_call(out["choices"][0]["message"]["content"] or "", spec) if spec else None
            if call is not None:
                out["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call.as_openai()]}
                out["choices"][0]["finish_reason"] = "tool_calls"
            return out
        assert not isinstance(result, dict)
        it = _Turns(self._lock, openai_types.chat_chunks(result))
        self._stream = it
        return it
