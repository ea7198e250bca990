"""The llama architecture (Llama 1-3, SmolLM, TinyLlama, Mistral's dense models as converted
to `llama`): RMSNorm, RoPE on adjacent pairs, grouped-query attention, SwiGLU, and a sliding
window on every layer where `llama.attention.sliding_window` asks for one; the C++ side is
csrc/models/llama.cpp, which also runs the family's other members (pyinfer.arch.qwen2, qwen3,
phi3) through the flags of LlamaConfig."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyinfer.arch.base import (
    Architecture,
    Config,
    UnsupportedModelError,
    get_float,
    get_int,
    get_key,
)


@dataclass(frozen=True)
class LlamaConfig(Config):
    """Config plus the variations of the llama family's one forward pass."""

    rope_neox: bool = False  # RoPE pairs (i, i + n_rot / 2) (NeoX order), not (2i, 2i + 1)
    n_rot: int = 0  # RoPE on the first n_rot dims of each head (0: all of them)
    sliding_window: int = 0  # each position attends to the last sliding_window ones (0: all)
    qkv_bias: bool = False  # attn_q/k/v.bias added to the projections
    qk_norm: bool = False  # RMSNorm of each query and key head (attn_q_norm, attn_k_norm) before RoPE
    ffn_fused: bool = False  # ffn_up.weight holds gate and up ([2 * n_ff, n_embd]), no ffn_gate

    @property
    def rope_dim(self) -> int:
        return self.n_rot or self.head_dim

    def params(self) -> dict[str, float]:
        p = super().params()
        p.update({"rope_neox": float(self.rope_neox), "n_rot": self.rope_dim, "sliding_window": self.sliding_window,
                  "qkv_bias": float(self.qkv_bias), "qk_norm": float(self.qk_norm),
                  "ffn_fused": float(self.ffn_fused)})
        return p


def sliding_window(arch: Architecture, md: Mapping[str, Any]) -> int:
    """`<arch>.attention.sliding_window`: the window of every layer, 0 (or absent) for none."""
    window = get_int(arch, md, "attention.sliding_window", 0)
    if window < 0:
        raise UnsupportedModelError(f"{arch.key('attention.sliding_window')} = {window} must be >= 0")
    return window


def family_config(arch: Architecture, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], *,
                  partial_rotary: bool = False, **flags: Any) -> LlamaConfig:
    """The llama family's config: _config's dimensions, norms and RoPE, RoPE on the first
    `rope.dimension_count` dims of a head where partial_rotary allows it, and the flags given
    (LlamaConfig's fields)."""
    return dataclasses.replace(_config(arch, md, shapes, partial_rotary=partial_rotary), **flags)


def _llama_config(arch: Architecture, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Config:
    return family_config(arch, md, shapes, sliding_window=sliding_window(arch, md))


def _config(arch: Architecture, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], *,
            partial_rotary: bool = False) -> LlamaConfig:
    emb = shapes.get("token_embd.weight")
    if emb is None or len(emb) != 2:
        raise UnsupportedModelError("tensor token_embd.weight is missing or not a matrix")
    n_embd, n_vocab = get_int(arch, md, "embedding_length"), int(emb[1])
    n_head = get_int(arch, md, "attention.head_count")
    if n_head < 1:
        raise UnsupportedModelError(f"{arch.key('attention.head_count')} = {n_head} must be positive")
    head_dim = get_int(arch, md, "attention.key_length", n_embd // n_head)
    value_dim = get_int(arch, md, "attention.value_length", head_dim)
    if value_dim != head_dim:
        raise UnsupportedModelError(
            f"{arch.key('attention.value_length')} = {value_dim} differs from the key length {head_dim}: "
            "not supported"
        )
    rope_dim = get_int(arch, md, "rope.dimension_count", head_dim)
    if rope_dim != head_dim and not (partial_rotary and 2 <= rope_dim < head_dim and rope_dim % 2 == 0):
        raise UnsupportedModelError(
            f"{arch.key('rope.dimension_count')} = {rope_dim}: RoPE on part of a head "
            f"(head dim {head_dim}) is not supported"
            + (" (an even count in [2, head dim] is)" if partial_rotary else " by this architecture")
        )
    vocab = get_int(arch, md, "vocab_size") if arch.key("vocab_size") in md else None
    if vocab is not None and vocab != n_vocab:
        raise UnsupportedModelError(
            f"{arch.key('vocab_size')} = {vocab} but token_embd.weight has {n_vocab} rows"
        )

    # RoPE scaling: none, or linear (positions divided by the factor). Llama 3's frequency
    # factors come as the tensor rope_freqs.weight, which the forward pass reads.
    scaling = str(get_key(arch, md, "rope.scaling.type", "none"))
    freq_scale = 1.0
    if scaling == "linear":
        factor = get_float(arch, md, "rope.scaling.factor", 1.0)
        if not factor > 0:
            raise UnsupportedModelError(f"{arch.key('rope.scaling.factor')} = {factor} must be positive")
        freq_scale = 1.0 / factor
    elif scaling == "none":
        factor = get_float(arch, md, "rope.scaling.factor", 1.0)
        if factor not in (0.0, 1.0):
            raise UnsupportedModelError(
                f"{arch.key('rope.scaling.factor')} = {factor} without a scaling type is not supported"
            )
    else:
        raise UnsupportedModelError(f"{arch.key('rope.scaling.type')} = {scaling!r} is not supported")
    if arch.key("rope.scale_linear") in md and arch.key("rope.scaling.type") not in md:  # older converters'
        legacy = get_float(arch, md, "rope.scale_linear")
        if not legacy > 0:
            raise UnsupportedModelError(f"{arch.key('rope.scale_linear')} = {legacy} must be positive")
        freq_scale /= legacy
    rope_freqs = shapes.get("rope_freqs.weight")
    if rope_freqs is not None and tuple(rope_freqs) != (rope_dim // 2,):
        raise UnsupportedModelError(
            f"tensor rope_freqs.weight has shape {tuple(rope_freqs)}, expected ({rope_dim // 2},)"
        )

    n_head_kv = get_int(arch, md, "attention.head_count_kv", n_head)
    if not 1 <= n_head_kv <= n_head or n_head % n_head_kv:
        raise UnsupportedModelError(
            f"{arch.key('attention.head_count_kv')} = {n_head_kv} does not divide "
            f"{arch.key('attention.head_count')} = {n_head}"
        )
    sizes = {"block_count": get_int(arch, md, "block_count"), "embedding_length": n_embd,
             "feed_forward_length": get_int(arch, md, "feed_forward_length"),
             "attention.key_length": head_dim, "context_length": get_int(arch, md, "context_length", 2048)}
    for key, v in sizes.items():
        if v < 1:
            raise UnsupportedModelError(f"{arch.key(key)} = {v} must be positive")
    if head_dim % 2:
        raise UnsupportedModelError(f"{arch.key('attention.key_length')} = {head_dim}: RoPE needs an even head dim")
    rope_base = get_float(arch, md, "rope.freq_base", 10000.0)
    if not (math.isfinite(rope_base) and rope_base > 1):
        raise UnsupportedModelError(f"{arch.key('rope.freq_base')} = {rope_base} must be a finite number > 1")
    rms_eps = get_float(arch, md, "attention.layer_norm_rms_epsilon", 1e-5)
    if not (math.isfinite(rms_eps) and 0 <= rms_eps < 1):
        raise UnsupportedModelError(
            f"{arch.key('attention.layer_norm_rms_epsilon')} = {rms_eps} must be a finite number in [0, 1)"
        )
    return LlamaConfig(
        architecture=arch.name,
        n_layer=sizes["block_count"],
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=sizes["feed_forward_length"],
        n_vocab=n_vocab,
        n_ctx_train=sizes["context_length"],
        rope_base=rope_base,
        rms_eps=rms_eps,
        rope_freq_scale=freq_scale,
        tied_output="output.weight" not in shapes,
        n_rot=rope_dim if rope_dim != head_dim else 0,
    )


# What every member of the family reads: dimensions, norms, RoPE and its linear scaling.
FAMILY_KEYS = frozenset({
    "block_count", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length",
    "rope.freq_base", "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor", "vocab_size",
})
# The training context only sets the default n_ctx; the original context length and the
# fine-tuned flag only matter to YaRN and LongRoPE scaling, which are refused.
FAMILY_HARMLESS_KEYS = frozenset({"context_length", "rope.scaling.original_context_length",
                                  "rope.scaling.finetuned"})
# The tensors around the layers.
FAMILY_TENSORS = ("token_embd.weight", "output_norm.weight",
                  "output.weight")  # absent: tied to the embedding
# A llama layer's tensors; qwen2 and qwen3 add theirs to these.
LAYER_TENSORS = (
    "blk.{L}.attn_norm.weight",
    "blk.{L}.attn_q.weight",
    "blk.{L}.attn_k.weight",
    "blk.{L}.attn_v.weight",
    "blk.{L}.attn_output.weight",
    "blk.{L}.ffn_norm.weight",
    "blk.{L}.ffn_gate.weight",
    "blk.{L}.ffn_up.weight",
    "blk.{L}.ffn_down.weight",
)

LLAMA = Architecture(
    name="llama",
    make_config=_llama_config,
    tensors=(
        *FAMILY_TENSORS,
        "rope_freqs.weight",  # Llama 3's per-pair RoPE frequency factors
        *LAYER_TENSORS,
    ),
    # Old converters stored each layer's RoPE inverse frequencies, which follow from the base.
    harmless_tensors=("blk.{L}.attn_rot_embd",),
    # rope.scale_linear: older converters' linear scaling; attention.sliding_window: Mistral's
    # window (0: none), on every layer.
    implemented_keys=FAMILY_KEYS | {"rope.scale_linear", "attention.sliding_window"},
    harmless_keys=FAMILY_HARMLESS_KEYS,
)
