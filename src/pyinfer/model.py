"""Model: a GGUF model loaded once (weights memory-mapped, quantized matrices repacked
for the fast kernels), with contexts that each hold a KV cache and a position."""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast, overload

import numpy as np

from pyinfer import _C
from pyinfer.arch import Config, describe
from pyinfer.arch.base import FLOAT32_MAX, UnsupportedModelError, fits_float32
from pyinfer.errors import ParameterTypeError
from pyinfer.gguf import GGUFReader
from pyinfer.registry import ModelArg, resolve_model
from pyinfer.sampling import logsumexp
from pyinfer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from pyinfer.chat import ChatTemplate
    from pyinfer.request import Completion, CompletionChunk

PRECISIONS = ("fast", "exact")
KV_DTYPES = ("float32", "float16", "q8_0")
# Bytes per cached element: q8_0 holds an int8 and, per 32 elements, a float32 scale.
KV_ELEMENT_BYTES = {"float32": 4.0, "float16": 2.0, "q8_0": 1.0 + 4.0 / 32}


def kv_dtypes_for(head_dim: int) -> tuple[str, ...]:
    """The KV cache types a model with this head_dim takes: q8_0's scales cover 32 elements."""
    return KV_DTYPES if head_dim % 32 == 0 else tuple(d for d in KV_DTYPES if d != "q8_0")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


# Token counts (n_ctx, n_batch) are 32-bit throughout, as SamplingParams' are: a larger one is
# refused by name here instead of overflowing a size further down.
MAX_TOKENS = 2**31 - 1


def _check_positive_int(name: str, value: object, limit: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if limit is not None and value > limit:
        raise ValueError(f"{name} must be in [1, {limit}], got {value!r}")
    return int(value)


def _check_count(name: str, value: object) -> int:
    """A count of tokens: an int in [0, MAX_TOKENS]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_TOKENS:
        raise ValueError(f"{name} must be an integer in [0, {MAX_TOKENS}], got {value!r}")
    return int(value)


def available_memory() -> int | None:
    """Bytes of memory available to allocate now (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_threads() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Context:
    """One sequence on a model: its KV cache and position.

    `eval(ids)` runs tokens at the next positions and returns the last token's logits;
    several contexts of one model may run at once from different threads. One context is
    for one thread at a time (a second concurrent call raises RuntimeError).
    """

    def __init__(self, model: Model, n_ctx: int, n_batch: int, kv_dtype: str) -> None:
        self.model = model
        self._ctx = _C.Sequence(model._native, n_ctx, n_batch, kv_dtype)
        self._last = np.empty((1, model.n_vocab), np.float32)

    @property
    def n_ctx(self) -> int:
        return self._ctx.n_ctx

    @property
    def n_past(self) -> int:
        return self._ctx.n_past

    @property
    def n_batch(self) -> int:
        return self._ctx.n_batch

    def _ids(self, ids: Any) -> np.ndarray:
        a = np.asarray(ids)
        if a.ndim != 1 or a.size == 0 or not (np.issubdtype(a.dtype, np.integer)):
            raise ValueError("ids must be a non-empty 1-D sequence of integers")
        if a.min() < 0 or a.max() >= self.model.n_vocab:
            bad = int(a[(a < 0) | (a >= self.model.n_vocab)][0])
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.model.n_vocab})")
        if self.n_past + a.size > self.n_ctx:
            raise ValueError(f"context full: {self.n_past} + {a.size} tokens exceed n_ctx {self.n_ctx}")
        return np.ascontiguousarray(a, dtype=np.int32)

    def eval(self, ids: Any, *, all_logits: bool = False, out: np.ndarray | None = None) -> np.ndarray:
        """Run ids at positions n_past.. (any count: chunks of n_batch), appending them to the
        cache. Returns the last token's logits [n_vocab], or with all_logits every token's
        [len(ids), n_vocab]. The last-token row is a view reused by the next call. out: with
        all_logits, a C-contiguous float32 array of that shape to write the rows into (and
        return) instead of a new one, so that a loop of passes touches no fresh memory."""
        a = self._ids(ids)
        if out is not None:
            if not all_logits:
                raise ValueError("out is for all_logits=True")
            if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.flags.c_contiguous
                    and out.flags.writeable and out.shape == (a.size, self.model.n_vocab)):
                raise ValueError(f"out must be a writeable C-contiguous float32 array of shape "
                                 f"{(a.size, self.model.n_vocab)}")
        elif all_logits:
            out = np.empty((a.size, self.model.n_vocab), np.float32)
        else:
            out = self._last
        self._run(self._ctx.eval, a, out, all_logits)
        return out if all_logits else out[0]

    def hidden(self, ids: Any) -> np.ndarray:
        """Run ids at positions n_past.. like eval, returning every token's final hidden state
        (after the output norm: what the output head reads) [len(ids), n_embd]."""
        a = self._ids(ids)
        out = np.empty((a.size, self.model.config.n_embd), np.float32)
        self._run(self._ctx.embed, a, out, True)
        return out

    def _run(self, native: Any, a: np.ndarray, out: np.ndarray, all_rows: bool) -> None:
        """a through `native` (the sequence's eval or embed) in chunks of n_batch, writing
        every row of out (all_rows) or its one row after each chunk."""
        m = self.model
        m.reader.check_unchanged()  # a GGUFError instead of a SIGBUS on a truncated file
        for start in range(0, a.size, self.n_batch):
            chunk = a[start : start + self.n_batch]
            rows = out[start : start + chunk.size] if all_rows else out
            native(chunk, rows, all_rows, m.precision, m.n_threads)

    def truncate(self, n: int) -> None:
        """Forget positions >= n (the KV cache keeps the first n)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise ParameterTypeError(f"truncate takes an int length, not {type(n).__name__}")
        if n < 0:
            raise ValueError(f"truncate takes a length >= 0, got {n}")
        self._ctx.truncate(min(int(n), self.n_ctx))

    def reset(self) -> None:
        """Empty the sequence."""
        self._ctx.truncate(0)

    def copy_prefix(self, src: Context, n: int) -> None:
        """Hold the first n positions of src (a context of the same model, n <= src.n_past and
        n <= n_ctx) and nothing after them: an exact copy of its KV cache, so a prompt prefix
        evaluated once serves another sequence. src may be this context (a truncation)."""
        if not isinstance(src, Context) or src.model is not self.model:
            raise ValueError("copy_prefix needs a context of the same model")
        self._ctx.copy_prefix(src._ctx, _check_count("n", n))

    @property
    def kv_nbytes(self) -> int:
        return self._ctx.kv_nbytes


class Batch:
    """Steps of many contexts of one model in one forward pass each: every weight is read once
    per step for all of them, and each context takes any number of tokens (one for a
    sequence decoding, a chunk of the prompt for one prefilling), up to n_rows in all. One
    step at a time (a concurrent call raises RuntimeError)."""

    def __init__(self, model: Model, n_rows: int) -> None:
        self.model = model
        self.n_rows = _check_positive_int("n_rows", n_rows, MAX_TOKENS)
        model._check_fits(self.nbytes, f"a batch of n_rows={self.n_rows}", "its scratch")
        self._batch = _C.Batch(model._native, self.n_rows)

    @property
    def nbytes(self) -> int:
        """The forward-pass scratch it holds."""
        return self.n_rows * self.model._row_nbytes()

    def step(self, contexts: Sequence[Context], tokens: Sequence[Sequence[int]] | np.ndarray,
             logit_rows: Sequence[int] | None = None) -> np.ndarray:
        """Append tokens[b] (a non-empty sequence of ids) to contexts[b] at its own positions.
        Returns the next-token logits after each one's last token, [B, n_vocab]: row b is what
        contexts[b].eval(tokens[b]) returns (bit for bit with precision="fast"). logit_rows:
        per context, how many of its last tokens to return the logits after (1 to
        len(tokens[b])), all the contexts' rows back to back, [sum(logit_rows), n_vocab]: what
        eval(all_logits=True) returns for those tokens (a sequence verifying guessed tokens
        needs them all). Contexts must be distinct contexts of this model with room for their
        tokens; on any error (ValueError: bad id or count, full or repeated context;
        RuntimeError: a context in use by another thread) no context changes."""
        if logit_rows is None:
            return self._run(self._batch.step, contexts, tokens, hidden=False)
        ctxs, ids, counts = self._prepare(contexts, tokens)
        if len(logit_rows) != len(ctxs):
            raise ValueError(f"{len(ctxs)} contexts but {len(logit_rows)} logit_rows: one per context")
        n_logits = np.zeros(len(ctxs), np.int64)
        for i, k in enumerate(logit_rows):
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= counts[i]:
                raise ValueError(f"logit_rows[{i}] must be an int from 1 to {int(counts[i])}, got {k!r}")
            n_logits[i] = k
        m = self.model
        out = np.empty((int(n_logits.sum()), m.n_vocab), np.float32)
        m.reader.check_unchanged()
        self._batch.step([c._ctx for c in ctxs], ids, counts, out, m.precision, m.n_threads, n_logits)
        return out

    def embed(self, contexts: Sequence[Context], tokens: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
        """As step, returning instead the final hidden states (after the output norm) of every
        token, the contexts' rows back to back in the order given, [sum of lengths, n_embd]:
        contexts[b]'s rows are what contexts[b].hidden(tokens[b]) returns (bit for bit with
        precision="fast")."""
        return self._run(self._batch.embed, contexts, tokens, hidden=True)

    def _run(self, native: Any, contexts: Sequence[Context], tokens: Sequence[Sequence[int]] | np.ndarray, *,
             hidden: bool) -> np.ndarray:
        """One pass through `native` (the batch's step or embed): logits of each context's last
        token, or the hidden state of every token."""
        ctxs, ids, counts = self._prepare(contexts, tokens)
        m = self.model
        out = np.empty((ids.size, m.config.n_embd) if hidden else (len(ctxs), m.n_vocab), np.float32)
        m.reader.check_unchanged()  # a GGUFError instead of a SIGBUS on a truncated file
        native([c._ctx for c in ctxs], ids, counts, out, m.precision, m.n_threads)
        return out

    def _prepare(self, contexts: Sequence[Context], tokens: Sequence[Sequence[int]] | np.ndarray
                 ) -> tuple[list[Context], np.ndarray, np.ndarray]:
        """The contexts, the ids back to back (int32) and the counts (int64) of a step, checked."""
        m = self.model
        ctxs = list(contexts)
        if not ctxs:
            raise ValueError("a step needs at least one context")
        if len(tokens) != len(ctxs):
            raise ValueError(f"{len(ctxs)} contexts but {len(tokens)} token lists: one per context")
        for i, c in enumerate(ctxs):
            if not isinstance(c, Context) or c.model is not m:
                raise ValueError(f"contexts[{i}] is not a context of this model")
        parts = [np.asarray(t) for t in tokens]
        for i, a in enumerate(parts):
            if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
                raise ValueError(f"tokens[{i}] must be a non-empty 1-D sequence of integers")
        counts = np.array([a.size for a in parts], np.int64)
        if int(counts.sum()) > self.n_rows:
            raise ValueError(f"the step has {int(counts.sum())} tokens, more than n_rows = {self.n_rows}")
        ids = np.concatenate(parts)
        if ids.min() < 0 or ids.max() >= m.n_vocab:
            bad = int(ids[(ids < 0) | (ids >= m.n_vocab)][0])
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {m.n_vocab})")
        return ctxs, np.ascontiguousarray(ids, np.int32), counts


T = TypeVar("T")


class _Background(Generic[T]):
    """fn(*args) on a daemon thread, from go() on; result() waits for its value or raises its
    exception. In a process forked while it ran, where the thread does not exist, result() runs
    fn itself. (The outcome is one attribute the thread sets, no lock a fork could leave held.)

    The thread waits for go() before it starts fn, so that the caller can move on to a call that
    releases the GIL first: a thread that went straight to work would hold the GIL for a whole
    switch interval (5 ms) while the caller waited."""

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._fn, self._args = fn, args
        self._outcome: tuple[T | None, BaseException | None] | None = None
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pyinfer {getattr(fn, '__name__', 'task')}",
                                        daemon=True)
        self._thread.start()

    def go(self) -> None:
        self._go.set()

    def _run(self) -> None:
        self._go.wait()
        try:
            self._outcome = (self._fn(*self._args), None)
        except BaseException as e:  # handed to whoever asks for the result
            self._outcome = (None, e)

    def result(self) -> T:
        if self._outcome is None and self._thread.is_alive():
            self._go.set()
            self._thread.join()
        if self._outcome is None:  # forked mid-run: no thread in this process
            return self._fn(*self._args)
        value, error = self._outcome
        if error is not None:
            raise error
        return cast(T, value)


class Model:
    """A loaded llama-family GGUF model.

    >>> m = Model.load()                      # the default model
    >>> ctx = m.context()
    >>> logits = ctx.eval(m.tokenize("The capital of France is"))
    """

    def __init__(self, reader: GGUFReader, *, n_ctx: int | None = None, n_threads: int | None = None,
                 precision: str = "fast", n_batch: int = 512, kv_dtype: str = "float32",
                 repack: bool | None = None, memory_limit: int | None = None,
                 rope_freq_base: float | None = None, rope_freq_scale: float | None = None) -> None:
        self.reader = reader
        description = describe(reader)
        self.config: Config = description.config
        # RoPE overrides (llama.cpp's --rope-freq-base / --rope-freq-scale): None keeps the file's.
        # A file's base must exceed 1 (arch.llama), and so must an override.
        for name, value, lo in (("rope_freq_base", rope_freq_base, 1), ("rope_freq_scale", rope_freq_scale, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not (lo < value < FLOAT32_MAX and fits_float32(float(value)))):
                raise ValueError(f"{name} must be a number > {lo} that fits a float32, got {value!r:.60}")
        if rope_freq_base is not None:
            self.config = dataclasses.replace(self.config, rope_base=float(rope_freq_base))
        if rope_freq_scale is not None:
            self.config = dataclasses.replace(self.config, rope_freq_scale=float(rope_freq_scale))
        self.precision = _check_choice("precision", precision, PRECISIONS)
        self.kv_dtype = _check_choice("kv_dtype", kv_dtype, KV_DTYPES)
        if self.kv_dtype not in kv_dtypes_for(self.config.head_dim):
            raise ValueError(f"kv_dtype 'q8_0' needs head_dim a multiple of 32 (its scales cover 32 elements); "
                             f"this model's head_dim is {self.config.head_dim}")
        self.n_ctx = _check_positive_int(
            "n_ctx", n_ctx if n_ctx is not None else min(self.config.n_ctx_train, 4096), MAX_TOKENS
        )
        self.n_threads = _check_positive_int("n_threads", n_threads if n_threads is not None else default_threads())
        cores = default_threads()
        if self.n_threads > cores:
            # More threads than cores only makes them wait on each other at every step.
            warnings.warn(f"n_threads={self.n_threads} exceeds the {cores} cores this process may use: "
                          f"using {cores}", RuntimeWarning, stacklevel=2)
            self.n_threads = cores
        self.n_batch = _check_positive_int("n_batch", n_batch, MAX_TOKENS)
        # The most a context may take (KV cache + scratch): None, the memory available when it is made.
        self.memory_limit = None if memory_limit is None else _check_positive_int("memory_limit", memory_limit)
        self._tokenizer: Tokenizer | None = None
        if repack is not None and not isinstance(repack, (bool, np.bool_)):
            raise ParameterTypeError(f"repack must be True, False or None (the ISA's choice), not {repack!r}")
        if repack is None:
            # The interleaved layout has SIMD kernels on the AVX2 and AVX-512 paths, several
            # times faster there than blocks as stored; the scalar path keeps the blocks.
            repack = _C.get_isa() in ("avx2", "avx512")
        tensors = {}
        for name in description.tensors:
            t = reader.tensors[name]
            if len(t.shape) > 2:  # the forward pass reads vectors and matrices, by their own shapes
                raise UnsupportedModelError(f"tensor {name} has shape {list(t.shape)}: a vector or a matrix "
                                            "was expected")
            tensors[name] = (reader.tensor(name), int(t.type), t.n_elements // t.shape[0], t.shape[0])
        # The tokenizer is built on another thread while the weights are repacked (which
        # releases the GIL), so that a first request does not wait for it; a model run on ids
        # alone never asks for it, and one that cannot be built fails when asked for.
        self._tokenizer_build = _Background(Tokenizer, reader.metadata)
        self._tokenizer_build.go()  # the native model's build releases the GIL at once
        try:
            self._native = _C.Model(self.config.architecture, self.config.params(), tensors, bool(repack))
        except ValueError as e:
            raise type(e)(f"{reader.path}: {e}") from None
        reader.check_unchanged()  # repacking read the whole file: it must be what was validated
        self._chat_template: ChatTemplate | None = None
        # Compute scratch of decode_batch (activations for B rows, no sequence state), grown
        # to the largest batch seen; one step at a time.
        self._batch: Batch | None = None
        self._batch_lock = threading.Lock()

    @classmethod
    def load(cls, model: ModelArg = None, **kwargs: Any) -> Model:
        """Load a GGUF path or known model name (None: the default model)."""
        return cls(GGUFReader(resolve_model(model)), **kwargs)

    @property
    def tokenizer(self) -> Tokenizer:
        """Built from the file's metadata beside the load (a model can be run on ids without one:
        a file with none raises here)."""
        if self._tokenizer is None:
            self._tokenizer = self._tokenizer_build.result()
        return self._tokenizer

    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    @property
    def repacked_bytes(self) -> int:
        """Memory used by the repacked copies of the quantized matrices and the copies of the
        float ones (the rest, embeddings and norms, stays mapped)."""
        return self._native.repacked_bytes

    @functools.cached_property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads (the file does not change: computed once)."""
        from pyinfer.info import model_info

        return model_info(self.reader)["weight_bytes_per_token"]

    def context_nbytes(self, n_ctx: int, n_batch: int) -> int:
        """Bytes a context of n_ctx positions and n_batch tokens per call allocates: its KV
        cache and its forward-pass scratch."""
        return self.kv_nbytes(n_ctx) + n_batch * self._row_nbytes()

    def kv_nbytes(self, n_positions: int) -> int:
        """Bytes of K and V that n_positions cached positions hold, over all layers."""
        c = self.config
        return int(2 * c.n_layer * c.n_head_kv * c.head_dim * n_positions * KV_ELEMENT_BYTES[self.kv_dtype])

    def _row_nbytes(self) -> int:
        """Forward-pass scratch per token row (the C++ Scratch's buffers)."""
        c = self.config
        q, kvd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        return 4 * (2 * c.n_embd + q + 2 * kvd + q + 3 * c.n_ff + c.head_dim) + 16

    def context(self, n_ctx: int | None = None, *, n_batch: int | None = None) -> Context:
        """A new sequence with its own KV cache. n_batch (tokens per forward call) is capped at
        n_ctx. MemoryError, before allocating, if the context needs more than the model's
        memory_limit (default: the memory available now)."""
        n_ctx = _check_positive_int("n_ctx", n_ctx if n_ctx is not None else self.n_ctx, MAX_TOKENS)
        n_batch = min(
            n_ctx, _check_positive_int("n_batch", n_batch if n_batch is not None else self.n_batch, MAX_TOKENS)
        )
        self._check_fits(self.context_nbytes(n_ctx, n_batch),
                         f"a context of n_ctx={n_ctx} (n_batch={n_batch})", "its KV cache and scratch")
        return Context(self, n_ctx, n_batch, self.kv_dtype)

    def _check_fits(self, need: int, what: str, purpose: str) -> None:
        """MemoryError, naming what and its size, if need bytes exceed the memory_limit
        (default: the memory available now)."""
        limit = self.memory_limit if self.memory_limit is not None else available_memory()
        if limit is not None and need > limit:
            raise MemoryError(
                f"{what} needs {need / 1e6:,.1f} MB for {purpose}, over the {limit / 1e6:,.1f} MB "
                f"{'limit' if self.memory_limit else 'available'}"
            )

    def decode_batch(self, contexts: Sequence[Context], ids: Sequence[int]) -> np.ndarray:
        """Advance each context by one token, all in one forward pass: ids[b] goes to
        contexts[b] at its own position. Every weight is read once per step for the whole
        batch, so the aggregate rate grows with B until the int8 dot products, not memory,
        bound the step (bench/bench_batch.py). Returns the next-token logits [B, n_vocab], row b
        equal to what contexts[b].eval([ids[b]]) would return (bit for bit with
        precision="fast"). Contexts must be distinct contexts of this model with room for one
        more token; on any error (ValueError: bad id, full or repeated context; RuntimeError:
        a context in use by another thread) no context changes. (Batch steps contexts by any
        number of tokens each.)"""
        n = len(contexts)
        if n == 0:
            raise ValueError("decode_batch needs at least one context")
        a = np.asarray(ids)
        if a.shape != (n,) or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"ids must be {n} integers, one per context")
        with self._batch_lock:
            if self._batch is None or self._batch.n_rows < n:
                self._batch = Batch(self, max(n, 8))
            return self._batch.step(contexts, a.reshape(n, 1))

    # -- tokens --

    def tokenize(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        return self.tokenizer.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, ids: Any) -> bytes:
        return self.tokenizer.detokenize(ids)

    # -- scoring --

    def logits(self, ids: Any) -> np.ndarray:
        """Logits at every position of ids, from a fresh context: [len(ids), n_vocab]."""
        n = len(ids)
        if n == 0:
            raise ValueError("ids must not be empty")
        return self.context(n_ctx=max(n, 1)).eval(ids, all_logits=True)

    def embed(
        self,
        texts: str | Sequence[str] | Sequence[Sequence[int]],
        *,
        pooling: Literal["mean", "last", "cls"] = "mean",
        normalize: bool = True,
        add_bos: bool | None = None,
        n_rows: int | None = None,
    ) -> np.ndarray:
        """Embeddings of texts (or token-id lists), one row each [len(texts), n_embd] float32
        (a single text: one row [n_embd]): the final hidden states (after the output norm)
        pooled over the text's tokens by their mean, the last token's or the first's ("cls"),
        scaled to unit length with normalize. A text longer than n_ctx raises
        ContextOverflowError.

        The texts are evaluated together: packed in order into forward passes of up to n_rows
        token rows (default n_batch), each text in a context of its own (a text longer than
        that is continued in the next pass), so every weight is read once per pass for all of
        them. Each row is the one the text gives alone: the same bits with precision="fast",
        float rounding with "exact" (its matrix kernels block over rows)."""
        from pyinfer.errors import ContextOverflowError

        _check_choice("pooling", pooling, ("mean", "last", "cls"))
        rows = _check_positive_int("n_rows", n_rows if n_rows is not None else self.n_batch, MAX_TOKENS)
        one = isinstance(texts, str)
        if not one and (isinstance(texts, (bytes, bytearray, Mapping)) or not isinstance(texts, Sequence)):
            raise ParameterTypeError(f"texts must be a str or a list of str or token-id lists, "
                                     f"not {type(texts).__name__}")
        items = [texts] if one else list(texts)
        if not items:
            raise ValueError("embed needs at least one text")
        all_ids: list[list[int]] = []
        for i, t in enumerate(items):
            if isinstance(t, str):
                ids = self.tokenize(t, add_bos=add_bos)
            elif isinstance(t, (Sequence, np.ndarray)) and not isinstance(t, (bytes, bytearray)):
                bad = next(((j, x) for j, x in enumerate(t) if isinstance(x, (bool, np.bool_))
                            or not isinstance(x, (int, np.integer))), None)
                if bad is not None:
                    raise ParameterTypeError(f"texts[{i}][{bad[0]}] = {bad[1]!r} is not a token id (an int)")
                ids = [operator.index(cast(int, x)) for x in t]
            else:
                raise ParameterTypeError(f"texts[{i}] must be a str or a list of token ids, not {type(t).__name__}")
            if not ids:
                raise ValueError(f"texts[{i}] has no tokens")
            if len(ids) > self.n_ctx:
                raise ContextOverflowError(f"texts[{i}] has {len(ids)} tokens, more than n_ctx = {self.n_ctx}",
                                           len(ids), self.n_ctx)
            all_ids.append(ids)
        out = np.empty((len(items), self.config.n_embd), np.float32)
        batch = Batch(self, min(rows, sum(map(len, all_ids))))
        # Contexts live from a text's first pass to its last: at most one pass's texts at a time.
        live: dict[int, tuple[Context, list[np.ndarray]]] = {}
        i, off = 0, 0
        while i < len(all_ids):
            owners, parts, room = [], [], batch.n_rows
            while room and i < len(all_ids):
                ids = all_ids[i]
                take = min(room, len(ids) - off)
                if i not in live:
                    live[i] = (self.context(n_ctx=len(ids), n_batch=1), [])
                owners.append(i)
                parts.append(ids[off : off + take])
                room -= take
                off += take
                if off == len(ids):
                    i, off = i + 1, 0
            h = batch.embed([live[j][0] for j in owners], parts)
            r = 0
            for j, part in zip(owners, parts):
                ctx, done = live[j]
                done.append(h[r : r + len(part)])
                r += len(part)
                if ctx.n_past == len(all_ids[j]):  # the text is complete
                    del live[j]
                    hj = done[0] if len(done) == 1 else np.concatenate(done)
                    v = hj.mean(axis=0) if pooling == "mean" else hj[-1] if pooling == "last" else hj[0]
                    if normalize:
                        v = v / max(float(np.linalg.norm(v)), 1e-12)
                    out[j] = v
        return out[0] if one else out

    def perplexity(self, text: str, window: int = 512, *, add_bos: bool = False) -> float:
        """Perplexity of text scored in non-overlapping windows, each from an empty cache
        (every token but the first of each window is predicted)."""
        window = _check_positive_int("window", window)
        if window < 2:
            raise ValueError("window must be at least 2")
        ids = self.tokenize(text, add_bos=add_bos)
        if len(ids) < 2:
            raise ValueError("text must have at least 2 tokens")
        # A window longer than the text needs no more room than the text.
        ctx = self.context(n_ctx=min(window, len(ids)))
        nll, count = 0.0, 0
        for start in range(0, len(ids) - 1, window):
            chunk = ids[start : start + window]
            if len(chunk) < 2:
                break
            ctx.reset()
            lg = ctx.eval(chunk, all_logits=True)[:-1]
            picked = lg[np.arange(len(chunk) - 1), chunk[1:]].astype(np.float64)
            nll += float((logsumexp(lg) - picked).sum())
            count += len(chunk) - 1
        return math.exp(nll / count)

    # -- generation --

    @property
    def chat_template(self) -> ChatTemplate:
        """The file's `tokenizer.chat_template`, compiled in a sandboxed Jinja2 environment."""
        if self._chat_template is None:
            from pyinfer.chat import ChatTemplate  # Jinja2 is imported with the first template

            self._chat_template = ChatTemplate.from_metadata(self.reader.metadata)
        return self._chat_template

    @overload
    def generate(self, prompt: str | Sequence[int], *, stream: Literal[False] = False, **kwargs: Any) -> Completion: ...
    @overload
    def generate(
        self, prompt: str | Sequence[int], *, stream: Literal[True], **kwargs: Any
    ) -> Iterator[CompletionChunk]: ...
    def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> Completion | Iterator[CompletionChunk]:
        """Continue a prompt (text, or token ids) in a fresh sequence; keywords and defaults:
        pyinfer.generate.model_generate (the sampling ones are SamplingParams', llama.cpp's)."""
        from pyinfer.generate import model_generate  # the driver imports the model, not back

        return model_generate(self, prompt, **kwargs)

    @overload
    def chat(
        self, messages: Sequence[Mapping[str, Any]], *, stream: Literal[False] = False, **kwargs: Any
    ) -> Completion: ...
    @overload
    def chat(
        self, messages: Sequence[Mapping[str, Any]], *, stream: Literal[True], **kwargs: Any
    ) -> Iterator[CompletionChunk]: ...
    def chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> Completion | Iterator[CompletionChunk]:
        """Reply to a conversation: messages ({"role": ..., "content": ...}) rendered with the
        model's chat template and an assistant header; the same keywords as generate()."""
        from pyinfer.generate import model_chat

        return model_chat(self, messages, **kwargs)
