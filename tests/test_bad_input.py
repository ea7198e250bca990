"""One table of hostile inputs across the public surface (Model.load, Model.context, generate,
chat, tokenize/detokenize, Engine.submit, the CLI): each row must raise the stated exception
type with a message naming what was wrong, and the model must answer the next call exactly as
it did before (no state corrupted by the refusal)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyinfer import Model
from pyinfer.arch.base import UnsupportedModelError
from pyinfer.chat import ChatTemplate
from pyinfer.cli import main as cli_main
from pyinfer.engine import Engine
from pyinfer.errors import ChatTemplateError, ContextOverflowError, GGUFError, ParameterTypeError
from pyinfer.gguf import GGUFReader, GGUFWriter
from pyinfer.gguf_types import GGMLType
from pyinfer.model import Batch
from pyinfer.registry import ModelNotFoundError

PROMPT = "The capital of France is"


@dataclass
class Env:
    model: Model
    engine: Engine
    files: dict[str, Path]
    tmp: Path


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Env], Any]
    exc: type[BaseException]
    match: str  # a regex the message must contain: the parameter or file, and what is wrong with it


def _drain(result: Any) -> Any:
    """Run a streaming result to its end, so that an error raised late is seen too."""
    if isinstance(result, Iterator):
        return list(result)
    return result


def gen(**kw: Any) -> Callable[[Env], Any]:
    return lambda e: _drain(e.model.generate(kw.pop("prompt", PROMPT), max_tokens=kw.pop("max_tokens", 2), **kw))


def chat(messages: Any, **kw: Any) -> Callable[[Env], Any]:
    return lambda e: _drain(e.model.chat(messages, max_tokens=2, **kw))


def submit(prompt: Any = PROMPT, **kw: Any) -> Callable[[Env], Any]:
    return lambda e: e.engine.submit(prompt, max_tokens=kw.pop("max_tokens", 2), **kw).result(timeout=60)


USER = {"role": "user", "content": "Hello"}

CASES = [
    # -- loading
    Case("load: missing file", lambda e: Model.load(e.tmp / "nope.gguf"), ModelNotFoundError,
         r"no such GGUF file: .*nope\.gguf"),
    Case("load: a directory", lambda e: Model.load(e.tmp), ModelNotFoundError,
         r"is not a GGUF file: it is a directory"),
    Case("load: a FIFO", lambda e: Model.load(e.files["fifo"]), ModelNotFoundError,
         r"fifo.* is not a GGUF file: it is not a regular file"),
    Case("reader: a FIFO (does not block)", lambda e: GGUFReader(e.files["fifo"]), GGUFError,
         r"fifo.*: not a GGUF file: it is a FIFO"),
    Case("load: not a GGUF file", lambda e: Model.load(e.files["text"]), GGUFError,
         r"notes\.gguf: malformed GGUF file: magic at byte 0: expected b'GGUF'"),
    Case("load: tensor data past the end", lambda e: Model.load(e.files["truncated"]), GGUFError,
         r"truncated\.gguf: malformed GGUF file: tensor 'blob' .* lies outside the file"),
    Case("load: no architecture", lambda e: Model.load(e.files["no_arch"]), UnsupportedModelError,
         r"no_arch\.gguf: architecture None is not supported \(supported: .*llama"),
    Case("load: n_ctx=0", lambda e: Model(e.model.reader, n_ctx=0), ValueError,
         r"n_ctx must be a positive integer, got 0"),
    Case("load: n_ctx a str", lambda e: Model(e.model.reader, n_ctx="8"), ValueError, r"n_ctx .* got '8'"),
    Case("load: n_ctx a float", lambda e: Model(e.model.reader, n_ctx=8.5), ValueError, r"n_ctx .* got 8\.5"),
    Case("load: n_ctx=2**70", lambda e: Model(e.model.reader, n_ctx=2**70), ValueError,
         r"n_ctx must be in \[1, 2147483647\], got 1180591620717411303424"),
    Case("load: n_batch=2**63", lambda e: Model(e.model.reader, n_batch=2**63), ValueError,
         r"n_batch must be in \[1, 2147483647\]"),
    Case("load: n_threads=-1", lambda e: Model(e.model.reader, n_threads=-1), ValueError, r"n_threads .* got -1"),
    Case("load: precision", lambda e: Model(e.model.reader, precision="fp8"), ValueError,
         r"precision must be one of 'fast', 'exact', got 'fp8'"),
    Case("load: kv_dtype", lambda e: Model(e.model.reader, kv_dtype="int8"), ValueError, r"kv_dtype .* got 'int8'"),
    Case("load: repack a str", lambda e: Model(e.model.reader, repack="no"), ParameterTypeError,
         r"repack must be True, False or None .* not 'no'"),
    Case("load: memory_limit=0", lambda e: Model(e.model.reader, memory_limit=0), ValueError,
         r"memory_limit must be a positive integer, got 0"),
    Case("load: rope_freq_base past float32", lambda e: Model(e.model.reader, rope_freq_base=1e39), ValueError,
         r"rope_freq_base must be a number > 1 that fits a float32, got 1e\+39"),
    Case("load: rope_freq_scale below float32", lambda e: Model(e.model.reader, rope_freq_scale=1e-40), ValueError,
         r"rope_freq_scale must be a number > 0 that fits a float32, got 1e-40"),
    Case("load: unknown keyword", lambda e: Model.load(e.model.reader.path, n_gpu_layers=1), TypeError,
         r"n_gpu_layers"),
    # -- contexts and raw evaluation
    Case("context: n_ctx=2**40", lambda e: e.model.context(n_ctx=2**40), ValueError,
         r"n_ctx must be in \[1, 2147483647\]"),
    Case("context: too large for memory", lambda e: Model(e.model.reader, memory_limit=10**6).context(n_ctx=4096),
         MemoryError, r"n_ctx=4096 .* needs [\d,.]+ MB .* over the 1\.0 MB limit"),
    Case("batch: too large for memory", lambda e: Batch(Model(e.model.reader, memory_limit=10**6), 4096),
         MemoryError, r"a batch of n_rows=4096 needs [\d,.]+ MB for its scratch, over the 1\.0 MB limit"),
    Case("batch: n_rows=2**64", lambda e: Batch(e.model, 2**64), ValueError, r"n_rows must be in \[1, 2147483647\]"),
    Case("context: n_batch=0", lambda e: e.model.context(n_ctx=8, n_batch=0), ValueError, r"n_batch .* got 0"),
    Case("eval: id past the vocabulary", lambda e: e.model.context(8).eval([1, 49152]), ValueError,
         r"token id 49152 is outside the vocabulary \[0, 49152\)"),
    Case("eval: floats", lambda e: e.model.context(8).eval([1.5]), ValueError, r"ids must be a non-empty 1-D"),
    Case("eval: past n_ctx", lambda e: e.model.context(4).eval([1] * 5), ValueError,
         r"context full: 0 \+ 5 tokens exceed n_ctx 4"),
    Case("truncate: negative", lambda e: e.model.context(4).truncate(-1), ValueError, r"truncate .* >= 0, got -1"),
    Case("truncate: a str", lambda e: e.model.context(4).truncate("2"), ParameterTypeError, r"truncate .* not str"),
    Case("logits: no ids", lambda e: e.model.logits([]), ValueError, r"ids must not be empty"),
    Case("perplexity: window=1", lambda e: e.model.perplexity("a b c", window=1), ValueError,
         r"window must be at least 2"),
    Case("decode_batch: ids per context", lambda e: e.model.decode_batch([e.model.context(8)], [1, 2]), ValueError,
         r"ids must be 1 integers, one per context"),
    Case("decode_batch: a foreign object", lambda e: e.model.decode_batch(["ctx"], [1]), ValueError,
         r"contexts\[0\] is not a context of this model"),
    Case("embed: float ids", lambda e: e.model.embed([[1.9, 2.9]]), ParameterTypeError,
         r"texts\[0\]\[0\] = 1\.9 is not a token id"),
    Case("embed: bytes", lambda e: e.model.embed(b"hello"), ParameterTypeError, r"texts must be a str .* not bytes"),
    Case("embed: ids not in a list", lambda e: e.model.embed([1, 2]), ParameterTypeError,
         r"texts\[0\] must be a str or a list of token ids, not int"),
    # -- generate
    Case("generate: prompt None", gen(prompt=None), ParameterTypeError, r"prompt must be a str .* not NoneType"),
    Case("generate: prompt bytes", gen(prompt=b"hi"), ParameterTypeError, r"prompt must be a str .* not bytes"),
    Case("generate: empty prompt", gen(prompt=""), ValueError, r"the prompt is empty"),
    Case("generate: id past the vocabulary", gen(prompt=[1, 10**9]), ValueError,
         r"prompt token 1 has id 1000000000, out of range for a vocabulary of 49152"),
    Case("generate: negative id", gen(prompt=[-1]), ValueError, r"prompt token 0 has id -1"),
    Case("generate: float ids", gen(prompt=[1.5]), ParameterTypeError, r"prompt_ids must be a sequence of ints"),
    Case("generate: 2-D ids", gen(prompt=np.ones((2, 2), np.int32)), ParameterTypeError,
         r"prompt_ids must be a 1-D integer array, got int32 with shape \(2, 2\)"),
    Case("generate: bool ids", gen(prompt=[True, False]), ParameterTypeError, r"not bools"),
    Case("generate: lone surrogate", gen(prompt="abc\ud800"), ValueError,
         r"character '\\ud800' in position 3: a lone surrogate"),
    Case("generate: too long for the context", gen(prompt=[1] * 5000), ContextOverflowError,
         r"the prompt has 5000 tokens, more than the context holds \(n_ctx = 4096\)"),
    Case("generate: max_tokens=-1", gen(max_tokens=-1), ValueError,
         r"max_tokens must be in \[0, 2147483647\].* got -1"),
    Case("generate: max_tokens a str", gen(max_tokens="3"), ParameterTypeError, r"max_tokens must be an int, not str"),
    Case("generate: temperature NaN", gen(temperature=float("nan")), ValueError, r"temperature must not be NaN"),
    Case("generate: an int past float's range", gen(top_p=10**400), ValueError, r"top_p is outside a float's range"),
    Case("generate: stream a str", gen(stream="yes"), ParameterTypeError, r"stream must be True or False, not 'yes'"),
    Case("generate: special a str", gen(special="yes"), ParameterTypeError, r"special must be True or False, not 'yes'"),
    Case("generate: temperature=-1", gen(temperature=-1), ValueError, r"temperature must be >= 0 .* got -1"),
    Case("generate: top_k=2**70", gen(top_k=2**70), ValueError,
         r"top_k must be in \[0, 2147483647\].* got 1180591620717411303424"),
    Case("generate: top_p=2", gen(top_p=2), ValueError, r"top_p must be in \[0, 1\], got 2"),
    Case("generate: min_p=inf", gen(min_p=float("inf")), ValueError, r"min_p"),
    Case("generate: repeat_penalty=0", gen(repeat_penalty=0), ValueError, r"repeat_penalty must be > 0"),
    Case("generate: seed=-1", gen(seed=-1), ValueError, r"seed must be in \[0, 18446744073709551615\]"),
    Case("generate: seed=2**64", gen(seed=2**64), ValueError, r"seed must be in \[0, 18446744073709551615\]"),
    Case("generate: misspelt keyword", gen(temprature=0), TypeError, r"generate\(\).*'temprature'"),
    Case("generate: stop an int", gen(stop=5), ParameterTypeError,
         r"stop must be a string or a list of strings, not int"),
    Case("generate: stop bytes", gen(stop=b"x"), ParameterTypeError,
         r"stop must be a string or a list of strings, not bytes"),
    Case("generate: stop too long", gen(stop=["x" * 5000]), ValueError, r"stop: a stop string has 5000 characters"),
    Case("generate: logit_bias id", gen(logit_bias={10**9: 1.0}), ValueError, r"logit_bias token id 1000000000"),
    Case("generate: logit_bias NaN", gen(logit_bias={1: float("nan")}), ValueError, r"logit_bias\[1\] must not be NaN"),
    Case("generate: logprobs past the vocabulary", gen(logprobs=10**6), ValueError,
         r"logprobs=1000000 exceeds the vocabulary \(49152\)"),
    Case("generate: truncate='right'", gen(truncate="right"), ValueError,
         r"truncate must be None or 'left', got 'right'"),
    Case("generate: streaming, bad temperature", gen(stream=True, temperature=-2), ValueError, r"temperature .* -2"),
    # -- chat
    Case("chat: a str", chat("hello"), ParameterTypeError, r"messages must be a list .* not str"),
    Case("chat: no messages", chat([]), ValueError, r"messages is empty"),
    Case("chat: a message not a dict", chat(["hi"]), ParameterTypeError, r"messages\[0\] must be a dict, not str"),
    Case("chat: no role", chat([{"content": "x"}]), ValueError, r"messages\[0\] has role None: it must be one of"),
    Case("chat: unknown role", chat([{"role": "wizard", "content": "x"}]), ValueError,
         r"messages\[0\] has role 'wizard'"),
    Case("chat: content an int", chat([USER, {"role": "user", "content": 5}]), ParameterTypeError,
         r"messages\[1\] \(user\): content must be a str, not int"),
    Case("chat: no content", chat([{"role": "user"}]), ValueError, r"messages\[0\] \(user\) has no 'content'"),
    Case("chat: lone surrogate", chat([{"role": "user", "content": "\udcff"}]), ValueError,
         r"character '\\udcff' in position \d+: a lone surrogate"),
    Case("chat: too long", chat([{"role": "user", "content": "x " * 6000}]), ContextOverflowError,
         r"the prompt has \d+ tokens, more than the context holds \(n_ctx = 4096\)"),
    Case("chat template: raise_exception", lambda e: _template("{{ raise_exception('no system role here') }}", e),
         ChatTemplateError, r"the chat template rejected the messages: no system role here"),
    Case("chat template: does not parse", lambda e: _template("{% for %}", e), ChatTemplateError, r"chat template"),
    Case("chat template: a loop without end", lambda e: _template("{% for i in range(10**9) %}{{ i }}{% endfor %}", e),
         ChatTemplateError, r"the chat template exceeded its limits"),
    Case("chat template: huge arithmetic", lambda e: _template("{{ (9 ** 9) ** (9 ** 9) }}", e), ChatTemplateError,
         r"the chat template exceeded its limits"),
    # -- tokenizer
    Case("tokenize: an int", lambda e: e.model.tokenize(5), TypeError, r"tokenize\(\) takes a str, not int"),
    Case("tokenize: bytes", lambda e: e.model.tokenize(b"hi"), TypeError, r"tokenize\(\) takes a str, not bytes"),
    Case("tokenize: lone surrogate", lambda e: e.model.tokenize("ok \udc80 ok"), ValueError,
         r"character '\\udc80' in position 3: a lone surrogate"),
    Case("tokenize: add_bos a str", lambda e: e.model.tokenize("hi", add_bos="no"), TypeError,
         r"add_bos must be True, False or None .* not 'no'"),
    Case("detokenize: id past the vocabulary", lambda e: e.model.detokenize([3, 49152]), ValueError,
         r"token id 49152 is out of range for a vocabulary of 49152"),
    Case("detokenize: a str", lambda e: e.model.detokenize("abc"), TypeError,
         r"token ids must be a sequence of ints, not str"),
    Case("detokenize: None", lambda e: e.model.detokenize(None), TypeError,
         r"token ids must be a sequence of ints, not NoneType"),
    Case("detokenize: a float", lambda e: e.model.detokenize([1, 2.5]), TypeError,
         r"token ids must be ints: item 1 is 2\.5"),
    Case("detokenize: 2**70", lambda e: e.model.detokenize([2**70]), ValueError,
         r"token id 1180591620717411303424 is out of range"),
    # -- the engine
    Case("submit: prompt None", submit(None), ParameterTypeError, r"prompt must be a str .* not NoneType"),
    Case("submit: misspelt keyword", submit(tmperature=0), TypeError, r"submit\(\).*'tmperature'"),
    Case("submit: top_k=-5", submit(top_k=-5), ValueError, r"top_k must be in \[0, 2147483647\].* got -5"),
    Case("submit: max_tokens=-2", submit(max_tokens=-2), ValueError, r"max_tokens .* got -2"),
    Case("submit: id past the vocabulary", submit([10**9]), ValueError, r"prompt token 0 has id 1000000000"),
    Case("submit: too long", submit([1] * 5000), ContextOverflowError, r"the prompt has 5000 tokens"),
    Case("submit: lone surrogate", submit("\ud83d"), ValueError,
         r"character '\\ud83d' in position 0: a lone surrogate"),
    Case("engine chat: no content", lambda e: e.engine.chat([{"role": "user"}]), ValueError, r"has no 'content'"),
]


def _template(source: str, e: Env) -> Any:
    return ChatTemplate(source).encode(e.model.tokenizer, [USER], add_generation_prompt=True)


def _write_files(tmp: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    fifo = tmp / "fifo.gguf"
    os.mkfifo(fifo)
    files["fifo"] = fifo
    text = tmp / "notes.gguf"
    text.write_text("these are notes, not a model\n" * 4)
    files["text"] = text
    w = GGUFWriter(tmp / "truncated.gguf")
    w.add("general.architecture", "llama")
    w.add_tensor("blob", np.ones((64, 64), np.float32), GGMLType.F32)
    w.write()
    data = (tmp / "truncated.gguf").read_bytes()
    (tmp / "truncated.gguf").write_bytes(data[:-100])
    files["truncated"] = tmp / "truncated.gguf"
    w = GGUFWriter(tmp / "no_arch.gguf")
    w.add("general.name", "nothing")
    w.write()
    files["no_arch"] = tmp / "no_arch.gguf"
    return files


@pytest.fixture(scope="module")
def env(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("bad_input")
    files = _write_files(tmp)
    model = Model.load(default_model, n_threads=2)
    # The engine runs its own Model over the same file: an engine's model is used by it alone.
    engine = Engine(Model(model.reader, n_threads=2), max_batch=2)
    try:
        yield Env(model, engine, files, tmp)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def baseline(env: Env) -> tuple[np.ndarray, list[int], list[int]]:
    return _answers(env)


def _answers(env: Env) -> tuple[np.ndarray, list[int], list[int]]:
    """What the model answers to a fixed prompt: logits of a fresh context, a greedy
    generation, and the same request through the engine."""
    ids = env.model.tokenize(PROMPT)
    logits = env.model.context(n_ctx=16).eval(ids).copy()
    tokens = env.model.generate(PROMPT, max_tokens=4, temperature=0).token_ids
    engine_tokens = env.engine.submit(PROMPT, max_tokens=4, temperature=0).result(timeout=60).token_ids
    return logits, tokens, engine_tokens


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_by_name_and_leaves_the_model_intact(env: Env, baseline: Any, case: Case) -> None:
    with pytest.raises(case.exc) as info:
        case.call(env)
    assert re.search(case.match, str(info.value)), f"{type(info.value).__name__}: {info.value}"
    logits, tokens, engine_tokens = _answers(env)
    np.testing.assert_array_equal(logits, baseline[0])
    assert tokens == baseline[1]
    assert engine_tokens == baseline[2] == tokens


def test_the_table_covers_every_entry_point() -> None:
    prefixes = {c.name.split(":")[0] for c in CASES}
    for entry in ("load", "context", "generate", "chat", "tokenize", "detokenize", "submit"):
        assert entry in prefixes, entry


# -- the command line: exit status 1 with "pyinfer <command>: error: ..." (2 from argparse)

CLI_CASES = [
    (["run", "hi", "--ctx", "0", "-n", "1"], 1, r"pyinfer run: error: n_ctx must be a positive integer, got 0"),
    (["run", "hi", "--ctx", "99999999999999999999", "-n", "1"], 1, r"n_ctx must be in \[1, 2147483647\]"),
    (["run", "hi", "--threads", "0", "-n", "1"], 1, r"n_threads must be a positive integer, got 0"),
    (["run", "hi", "-n", "-5"], 1, r"max_tokens must be in \[0, 2147483647\].* got -5"),
    (["run", "hi", "-n", "1", "--temperature", "nan"], 1, r"temperature must not be NaN"),
    (["run", "hi", "-n", "1", "--top-k", str(2**70)], 1, r"top_k must be in \[0, 2147483647\]"),
    (["run", "hi", "-n", "1", "--top-p", "7"], 1, r"top_p must be in \[0, 1\], got 7"),
    (["run", "hi", "-n", "1", "--seed", "-3"], 1, r"seed must be in \[0, 18446744073709551615\]"),
    (["run", "hi", "-n", "1", "--precision", "fp8"], 2, r"argument --precision: invalid choice: 'fp8'"),
    (["run", "hi", "-n", "x"], 2, r"argument --max-tokens/-n: invalid int value: 'x'"),
    (["chat", "-n", "1", "--ctx", "-1"], 1, r"pyinfer chat: error: n_ctx must be a positive integer, got -1"),
    (["serve", "--port", "99999"], 2, r"argument --port: 99999 is outside 0-65535"),
    (["serve", "--kv-budget-mib", "nan"], 1, r"--kv-budget-mib must be a positive number of MiB, got nan"),
    (["serve", "--max-body-bytes", "0"], 1, r"--max-body-bytes must be >= 1, got 0"),
    (["serve", "--max-batch", "0"], 1, r"max_batch must be >= 1, got 0"),
    (["bench", "--quick", "--threads", "0"], 1, r"thread counts must be positive"),
]


@pytest.mark.parametrize(("argv", "rc", "match"), CLI_CASES, ids=[" ".join(c[0]) for c in CLI_CASES])
def test_cli_refuses_bad_flags_by_name(env: Env, baseline: Any, capsys: pytest.CaptureFixture[str], argv: list[str],
                                       rc: int, match: str) -> None:
    args = list(argv)
    if args[0] in ("run", "chat", "serve"):
        args += ["--model", str(env.model.reader.path)]
    if args[0] == "bench":
        args += ["--out", str(env.tmp / "bench")]
    try:
        got = cli_main(args)
    except SystemExit as e:  # argparse
        got = e.code
    err = capsys.readouterr().err
    assert got == rc, err
    assert re.search(match, err), err
    assert "Traceback" not in err
    assert env.model.context(n_ctx=16).eval(env.model.tokenize(PROMPT)).tolist() == baseline[0].tolist()


@pytest.mark.parametrize("name", ["truncated", "text", "fifo"])
def test_cli_info_on_a_bad_file_names_the_file_and_gguf(env: Env, capsys: pytest.CaptureFixture[str],
                                                        name: str) -> None:
    path = env.files[name]
    assert cli_main(["info", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pyinfer info: error: ") and str(path) in err and "GGUF" in err, err
