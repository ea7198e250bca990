"""What a GGUF model is and what running it costs: the figures `pyinfer info` prints."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pyinfer.arch import UnsupportedModelError, describe
from pyinfer.chat import builtin_template, has_chat_template
from pyinfer.gguf import GGUFReader
from pyinfer.model import KV_ELEMENT_BYTES


def _meta(r: GGUFReader, arch: str, key: str, default: Any = None) -> Any:
    return r.metadata.get(f"{arch}.{key}", default)


def model_info(r: GGUFReader) -> dict[str, Any]:
    """Architecture, dimensions, tokenizer, tensor counts by type and per-token costs.

    Dimensions come from the architecture's description (pyinfer.arch) when pyinfer runs the
    file; for any other file, from the usual metadata keys, with `unsupported` saying why."""
    arch = r.metadata.get("general.architecture", "?")
    unsupported = None
    try:
        c = describe(r).config
        n_layer, n_embd, n_head, n_head_kv = c.n_layer, c.n_embd, c.n_head, c.n_head_kv
        head_dim, head_dim_v, n_ff, n_vocab = c.head_dim, c.head_dim, c.n_ff, c.n_vocab
        n_ctx_train, rope_base = c.n_ctx_train, c.rope_base
    except UnsupportedModelError as e:
        unsupported = str(e).removeprefix(f"{r.path}: ")
        n_layer = _meta(r, arch, "block_count")
        n_embd = _meta(r, arch, "embedding_length")
        n_head = _meta(r, arch, "attention.head_count")
        n_head_kv = _meta(r, arch, "attention.head_count_kv", n_head)
        head_dim = _meta(r, arch, "attention.key_length", None)
        if head_dim is None and isinstance(n_embd, int) and isinstance(n_head, int) and n_head > 0:
            head_dim = n_embd // n_head
        head_dim_v = _meta(r, arch, "attention.value_length", head_dim)
        n_ff, n_ctx_train = _meta(r, arch, "feed_forward_length"), _meta(r, arch, "context_length")
        rope_base = _meta(r, arch, "rope.freq_base")
        tokens = r.metadata.get("tokenizer.ggml.tokens")
        n_vocab = _meta(r, arch, "vocab_size", len(tokens) if tokens is not None else None)
    tied = "output.weight" not in r.tensors and "token_embd.weight" in r.tensors

    # A decode step reads every weight once, except the embedding table, of which it reads
    # one row, unless the table doubles as the output head (tied), when it is read whole.
    weight_bytes = 0
    for t in r.tensors.values():
        if t.name == "token_embd.weight" and not tied:
            weight_bytes += t.nbytes // t.shape[1]
        else:
            weight_bytes += t.nbytes

    kv_elems = None
    if n_layer and n_head_kv and head_dim:
        kv_elems = n_layer * n_head_kv * (head_dim + head_dim_v)
    return {
        "path": str(r.path),
        "file_size": r.file_size,
        "gguf_version": r.version,
        "name": r.metadata.get("general.name"),
        "architecture": arch,
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "head_dim": head_dim,
        "unsupported": unsupported,
        "n_ff": n_ff,
        "n_vocab": n_vocab,
        "context_length": n_ctx_train,
        "rope_freq_base": rope_base,
        "tied_embeddings": tied,
        "tokenizer_model": r.metadata.get("tokenizer.ggml.model"),
        "tokenizer_pre": r.metadata.get("tokenizer.ggml.pre"),
        "has_chat_template": has_chat_template(r.metadata),
        "builtin_chat_template": builtin_template(r.metadata) is not None,
        "n_tensors": len(r.tensors),
        "tensor_types": dict(Counter(t.type.name for t in r.tensors.values()).most_common()),
        "tensors": [
            {"name": t.name, "shape": list(t.shape), "type": t.type.name, "nbytes": t.nbytes}
            for t in r.tensors.values()
        ],
        "weight_bytes_per_token": weight_bytes,
        "kv_bytes_per_token": ({k: int(kv_elems * KV_ELEMENT_BYTES[d])
                                for k, d in (("f32", "float32"), ("f16", "float16"), ("q8_0", "q8_0"))}
                               if kv_elems else None),
    }


def format_info(info: dict[str, Any], *, tensors: bool = False) -> str:
    """The human-readable report."""
    mb = 1e6
    lines = [
        f"file            {info['path']}",
        f"size            {info['file_size']:,} bytes ({info['file_size'] / mb:.1f} MB), GGUF v{info['gguf_version']}",
        f"name            {info['name']}",
        f"architecture    {info['architecture']}"
        + (f" (not supported: {info['unsupported']})" if info["unsupported"] else ""),
        f"layers          {info['n_layer']}",
        f"width           {info['n_embd']}",
        f"heads           {info['n_head']} query, {info['n_head_kv']} key/value, head dim {info['head_dim']}",
        f"feed-forward    {info['n_ff']}",
        f"vocabulary      {info['n_vocab']}",
        f"context         {info['context_length']} (trained)",
        f"rope base       {info['rope_freq_base']}",
        f"output head     {'tied to the embedding' if info['tied_embeddings'] else 'separate'}",
        f"tokenizer       {info['tokenizer_model']} (pre-tokenizer {info['tokenizer_pre']})"
        + (", chat template" if info["has_chat_template"] else "")
        + (" (built in: the file has none)" if info.get("builtin_chat_template") else ""),
        f"tensors         {info['n_tensors']}: "
        + ", ".join(f"{n} {k}" for k, n in info["tensor_types"].items()),
        f"decode reads    {info['weight_bytes_per_token'] / mb:.1f} MB of weights per token",
    ]
    kv = info["kv_bytes_per_token"]
    if kv:
        lines.append(f"KV cache        {kv['f32']:,} bytes per token of context in float32, {kv['f16']:,} in float16, "
                     f"{kv['q8_0']:,} in q8_0")
    if tensors:
        lines.append("")
        for t in info["tensors"]:
            shape = "x".join(str(d) for d in t["shape"])
            lines.append(f"  {t['name']:<32} {t['type']:<6} {shape:<14} {t['nbytes']:>12,}")
    return "\n".join(lines)
