"""Llama-shaped GGUF models with random weights, for measuring speed at sizes no small
real model has. Decode and prefill speed do not depend on the weights' values (every
kernel does the same work on any bytes), so these time like real models of their shape."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pyinfer.gguf import GGUFWriter
from pyinfer.gguf_types import BLOCK_SIZES, GGMLType, ValueType
from pyinfer.quants import quantize
from pyinfer.tokenizer import BYTE_CHARS


@dataclass(frozen=True)
class Shape:
    """Dimensions of a llama-family model."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx: int = 4096
    key_length: int = 0  # head dim, when not n_embd / n_head

    @property
    def head_dim(self) -> int:
        return self.key_length or self.n_embd // self.n_head

    def matrices(self) -> dict[str, tuple[int, int]]:
        """Every weight matrix, (rows, cols) in NumPy order."""
        q, kv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        out = {"token_embd.weight": (self.n_vocab, self.n_embd), "output.weight": (self.n_vocab, self.n_embd)}
        for i in range(self.n_layer):
            p = f"blk.{i}."
            out.update({p + "attn_q.weight": (q, self.n_embd), p + "attn_k.weight": (kv, self.n_embd),
                        p + "attn_v.weight": (kv, self.n_embd), p + "attn_output.weight": (self.n_embd, q),
                        p + "ffn_gate.weight": (self.n_ff, self.n_embd), p + "ffn_up.weight": (self.n_ff, self.n_embd),
                        p + "ffn_down.weight": (self.n_embd, self.n_ff)})
        return out

    @property
    def n_params(self) -> int:
        return sum(r * c for r, c in self.matrices().values()) + (2 * self.n_layer + 1) * self.n_embd


# Presets: "tiny" for tests and --quick; the others follow published llama-family shapes
# (TinyLlama-1.1B for "1b", Llama-3.2-3B's layers for "3b") with a 32000-token vocabulary.
PRESETS: dict[str, Shape] = {
    "tiny": Shape(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_vocab=2048, n_ctx=2048),
    "0.5b": Shape(n_layer=28, n_embd=1024, n_head=16, n_head_kv=4, n_ff=4096, n_vocab=32000),
    "1b": Shape(n_layer=22, n_embd=2048, n_head=32, n_head_kv=4, n_ff=5632, n_vocab=32000),
    "3b": Shape(n_layer=28, n_embd=3072, n_head=24, n_head_kv=8, n_ff=8192, n_vocab=32000),
}


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|endoftext|>{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def _tokenizer_tokens(n_vocab: int) -> list[str]:
    """A byte-level vocabulary with no merges: 256 byte tokens, an end-of-text token, and
    placeholders up to n_vocab, so text round-trips and generate() runs."""
    if n_vocab < 257:
        raise ValueError("a synthetic model needs a vocabulary of at least 257 tokens")
    return list(BYTE_CHARS) + ["<|endoftext|>"] + [f"<unused{i}>" for i in range(n_vocab - 257)]


def _random_matrix(rng: np.random.Generator, rows: int, cols: int, ggml_type: GGMLType,
                   tile_rows: int = 256) -> np.ndarray:
    """Raw bytes of a [rows, cols] matrix: `tile_rows` random rows quantized and repeated.
    Quantizing billions of distinct values would take minutes and change nothing measured:
    the repeated rows still lie at distinct addresses and stream from memory like any."""
    t = min(rows, tile_rows)
    tile = quantize((rng.standard_normal((t, cols)) / np.sqrt(cols)).astype(np.float32), ggml_type)
    row_bytes = cols // BLOCK_SIZES[ggml_type][0] * BLOCK_SIZES[ggml_type][1]
    tile = tile.reshape(t, row_bytes)
    return np.ascontiguousarray(np.tile(tile, (-(-rows // t), 1))[:rows]).reshape(-1)


def write_synthetic_llama(path: str | os.PathLike[str], shape: Shape | str,
                          ggml_type: GGMLType = GGMLType.Q4_1, seed: int = 0, *,
                          metadata: Mapping[str, Any] | None = None,
                          tensors: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write a llama GGUF of `shape` (a Shape or a PRESETS name) with random weights in
    `ggml_type` (norms in F32), a separate output head, a byte-level tokenizer and a chat
    template; `metadata` (key -> value, or (value, ValueType)) and `tensors` (name -> float32
    array in NumPy order) are added as they are."""
    s = PRESETS[shape] if isinstance(shape, str) else shape
    rng = np.random.default_rng(seed)
    path = Path(path)
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add("general.name", f"synthetic llama {s.n_params / 1e9:.2f}B (random weights)")
    for k, v in [("block_count", s.n_layer), ("context_length", s.n_ctx), ("embedding_length", s.n_embd),
                 ("feed_forward_length", s.n_ff), ("attention.head_count", s.n_head),
                 ("attention.head_count_kv", s.n_head_kv), ("vocab_size", s.n_vocab),
                 ("rope.dimension_count", s.head_dim)]:
        w.add(f"llama.{k}", v, ValueType.UINT32)
    if s.key_length:
        w.add("llama.attention.key_length", s.key_length, ValueType.UINT32)
        w.add("llama.attention.value_length", s.key_length, ValueType.UINT32)
    w.add("llama.rope.freq_base", 10000.0, ValueType.FLOAT32)
    w.add("llama.attention.layer_norm_rms_epsilon", 1e-5, ValueType.FLOAT32)
    w.add("general.file_type", {GGMLType.Q4_1: 3, GGMLType.Q4_0: 2, GGMLType.Q8_0: 7,
                                GGMLType.F16: 1, GGMLType.F32: 0}.get(ggml_type, 0), ValueType.UINT32)
    tokens = _tokenizer_tokens(s.n_vocab)
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", "gpt-2")  # llama.cpp's name for it
    w.add("tokenizer.ggml.tokens", tokens, ValueType.ARRAY, ValueType.STRING)
    w.add("tokenizer.ggml.token_type", np.array([1] * 256 + [3] + [1] * (s.n_vocab - 257), np.int32))
    w.add("tokenizer.ggml.merges", [], ValueType.ARRAY, ValueType.STRING)
    w.add("tokenizer.ggml.bos_token_id", 256, ValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", 256, ValueType.UINT32)
    w.add("tokenizer.ggml.add_bos_token", False, ValueType.BOOL)
    # Turns ended by the one control token, so Model.chat() (the peers study's time to first
    # token) runs on these models too.
    w.add("tokenizer.chat_template", CHAT_TEMPLATE)
    for name, (rows, cols) in s.matrices().items():
        w.add_raw_tensor(name, _random_matrix(rng, rows, cols, ggml_type), (cols, rows), ggml_type)
    for i in range(s.n_layer):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", 1 + 0.1 * rng.standard_normal(s.n_embd).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(s.n_embd, np.float32))
    for key, value in (metadata or {}).items():
        if isinstance(value, tuple):
            w.add(key, *value)
        else:
            w.add(key, value)
    for name, t in (tensors or {}).items():
        w.add_tensor(name, np.ascontiguousarray(t, np.float32))
    w.write()
    return path


def synthetic_model(preset: str, ggml_type: GGMLType = GGMLType.Q4_1) -> Path:
    """The preset's model in the cache (pyinfer.registry.cache_dir()/derived), written once."""
    from pyinfer.registry import cache_dir

    if preset not in PRESETS:
        raise ValueError(f"unknown synthetic model {preset!r} (known: {', '.join(PRESETS)})")
    path = cache_dir() / "derived" / f"synthetic-llama-{preset}.{ggml_type.name.lower()}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic_llama(path, preset, ggml_type)
    return path
