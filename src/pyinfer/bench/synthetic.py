"""Llama-family GGUF models with random weights, for measuring speed at sizes no small
real model has (decode and prefill speed do not depend on the weights' values: every
kernel does the same work on any bytes, so these time like real models of their shape), and
small ones of each architecture for tests, with vocabularies learned from generated text."""

from __future__ import annotations

import functools
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
    "8b": Shape(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=32000),  # Llama 3 8B's layers
}

# Weight formats of synthetic models: one type for every matrix, or "q4_k_m", llama.cpp's
# Q4_K_M mix of Q4_K and Q6_K (pyinfer.quantize's choice per tensor).
MIXES = ("q4_k_m",)


# The architectures write_synthetic writes: the llama family's members (mistral: the llama
# architecture with a sliding window, as llama.cpp's converter names Mistral's dense models).
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3")


def chat_template(end: str) -> str:
    """A chat template whose turns end with the control token `end`."""
    return ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}" + end + "{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


CHAT_TEMPLATE = chat_template("<|endoftext|>")


def _tokenizer_tokens(n_vocab: int) -> list[str]:
    """A byte-level vocabulary with no merges: 256 byte tokens, an end-of-text token, and
    placeholders up to n_vocab, so text round-trips and generate() runs."""
    if n_vocab < 257:
        raise ValueError("a synthetic model needs a vocabulary of at least 257 tokens")
    return list(BYTE_CHARS) + ["<|endoftext|>"] + [f"<unused{i}>" for i in range(n_vocab - 257)]


# ---- vocabularies learned from generated text

# Syllables, marks and characters the generated text is made of: letters of several scripts and
# cases, digits, contractions, punctuation, runs of spaces and line breaks, so that every rule of
# a pre-tokenizer's split has words to learn merges from.
_SYLLABLES = ("ka", "to", "re", "mi", "lu", "an", "st", "er", "in", "on", "ve", "al", "or", "sh", "qu", "ex",
              "\u00e9t", "\u00fcb", "\u0436\u0430", "\u043c\u0438", "\u65e5", "\u672c", "\u03b1\u03b2")
_MARKS = (".", ",", "!", "?", ";", ":", "-", "(", ")", "\"", "/", "#", "...", "->", "{}", "\U0001f642")
_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL")
_GAPS = (" ", " ", " ", " ", " ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "   ")


def generated_text(seed: int = 0, n_words: int = 3000) -> str:
    """Text of made-up words (no natural language): what synthetic vocabularies are learned
    from and the tokenizer tests read."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_words):
        r = rng.random()
        if r < 0.12:
            word = str(int(rng.integers(0, 10 ** int(rng.integers(1, 8)))))
        elif r < 0.2:
            word = str(rng.choice(_MARKS))
        else:
            word = "".join(rng.choice(_SYLLABLES, size=int(rng.integers(1, 4))))
            if rng.random() < 0.15:
                word = word.capitalize() if rng.random() < 0.7 else word.upper()
            if rng.random() < 0.08:
                word += str(rng.choice(_CONTRACTIONS))
            if rng.random() < 0.1:
                word += str(rng.choice(_MARKS))
        out.append(word + str(rng.choice(_GAPS)))
    return "".join(out)


def learn_bpe(pre: str, n_merges: int, text: str) -> tuple[list[str], list[str]]:
    """(tokens, merges) of a byte-level BPE vocabulary learned from `text` split by the
    pre-tokenizer `pre` (a tokenizer.ggml.pre name): the 256 byte tokens, then one token per
    merge (its first occurrence), merges as "left right" in byte-level spelling. Each step
    merges the most frequent adjacent pair over all words (ties: the smallest pair)."""
    from collections import Counter

    from pyinfer.tokenizer import Tokenizer

    splitter = Tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                          "tokenizer.ggml.tokens": list(BYTE_CHARS), "tokenizer.ggml.merges": []})
    words = Counter(splitter._bpe.split(text))
    seqs = {w: [BYTE_CHARS[b] for b in w.encode("utf-8")] for w in words}  # a symbol per byte
    tokens, seen, merges = list(BYTE_CHARS), set(BYTE_CHARS), []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, s in seqs.items():
            for a, b in zip(s, s[1:]):
                pairs[a, b] += words[w]
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], [-ord(c) for c in kv[0][0] + " " + kv[0][1]]))[0]
        merges.append(f"{best[0]} {best[1]}")
        joined = best[0] + best[1]
        if joined not in seen:
            seen.add(joined)
            tokens.append(joined)
        for w, s in seqs.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == best[0] and s[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return tokens, merges


@functools.lru_cache(maxsize=16)
def _learned(pre: str, n_merges: int, seed: int) -> tuple[list[str], list[str]]:
    return learn_bpe(pre, n_merges, generated_text(seed))  # a few seconds: once per process


# Control tokens of each vocabulary style: (BOS, EOS, end of turn, others).
_SPECIALS = {
    "llama-bpe": ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", ("<|start_header_id|>", "<|end_header_id|>")),
    "qwen2": ("<|endoftext|>", "<|endoftext|>", "<|im_end|>", ("<|im_start|>",)),
}


def _bpe_vocabulary(w: GGUFWriter, n_vocab: int, pre: str, seed: int) -> str:
    """Adds a byte-level BPE vocabulary of n_vocab tokens learned from generated_text (with
    the control tokens of `pre`'s models at the end); returns the end-of-turn token."""
    bos, eos, eot, others = _SPECIALS[pre]
    specials = list(dict.fromkeys([bos, eos, eot, *others]))
    n_merges = n_vocab - 256 - len(specials)
    if n_merges < 0:
        raise ValueError(f"a {pre} vocabulary needs at least {256 + len(specials)} tokens")
    tokens, merges = _learned(pre, n_merges * 2, seed)
    tokens = tokens[:256 + n_merges]
    # Only merges whose parts and result are tokens of the cut vocabulary.
    have = set(tokens)
    merges = [m for m in merges if m.replace(" ", "") in have and all(p in have for p in m.split(" "))]
    if len(tokens) < 256 + n_merges:  # text too short for this many merges: placeholders
        tokens += [f"<unused{i}>" for i in range(256 + n_merges - len(tokens))]
    n_plain = len(tokens)
    tokens += specials
    types = [1] * n_plain + [3] * len(specials)
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", pre)
    w.add("tokenizer.ggml.tokens", tokens, ValueType.ARRAY, ValueType.STRING)
    w.add("tokenizer.ggml.token_type", np.array(types, np.int32))
    w.add("tokenizer.ggml.merges", merges, ValueType.ARRAY, ValueType.STRING)
    w.add("tokenizer.ggml.bos_token_id", tokens.index(bos), ValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", tokens.index(eos), ValueType.UINT32)
    w.add("tokenizer.ggml.add_bos_token", pre == "llama-bpe", ValueType.BOOL)
    return eot


def _sentencepiece_vocabulary(w: GGUFWriter, n_vocab: int, seed: int) -> str:
    """Adds a SentencePiece-style vocabulary (Phi-3's kind: <unk>, <s>, </s>, the 256 byte
    tokens, pieces learned from generated_text with the space mark, scored by the order they
    were learned, then <|endoftext|> and <|end|>); returns the end-of-turn token."""
    from pyinfer.tokenizer import SPACE_MARK

    head = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tail = ["<|endoftext|>", "<|end|>"]  # llama.cpp looks the first up in files named for Phi-3
    n_pieces = n_vocab - len(head) - len(tail)
    if n_pieces < 1:
        raise ValueError(f"a SentencePiece vocabulary needs at least {len(head) + len(tail) + 1} tokens")
    # Every character of the text a piece of its own (as in real SentencePiece vocabularies,
    # whose merges start from characters; whitespace other than the space is left to byte
    # fallback), scored below every learned piece; then the pieces byte-level BPE learned, in
    # the order it learned them, that are whole characters.
    text = generated_text(seed)
    chars = sorted({c for c in text.replace(" ", SPACE_MARK) if not c.isspace()})
    learned, _ = _learned("gpt2", n_pieces * 2, seed)
    merged: list[str] = []
    for t in learned[256:]:
        try:
            piece = bytes(_UNMAP_BYTES[c] for c in t).decode("utf-8").replace(" ", SPACE_MARK)
        except UnicodeDecodeError:  # a piece ending inside a character
            continue
        if len(piece) > 1 and piece not in merged and all(c in chars for c in piece):
            merged.append(piece)
    if len(chars) > n_pieces:
        raise ValueError(f"a SentencePiece vocabulary of this text needs at least {len(head) + len(tail) + len(chars)}"
                         " tokens")
    merged = merged[:n_pieces - len(chars)]
    pieces = chars + merged
    piece_scores = [-1e4 - i for i in range(len(chars))] + [-float(i) for i in range(len(merged))]
    pieces += [f"<unused{i}>" for i in range(n_pieces - len(pieces))]
    piece_scores += [-2e4] * (n_pieces - len(piece_scores))
    tokens = head + pieces + tail
    scores = [0.0] * len(head) + piece_scores + [0.0] * len(tail)
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [3] * len(tail)
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.pre", "default")
    w.add("tokenizer.ggml.tokens", tokens, ValueType.ARRAY, ValueType.STRING)
    w.add("tokenizer.ggml.scores", np.array(scores, np.float32))
    w.add("tokenizer.ggml.token_type", np.array(types, np.int32))
    w.add("tokenizer.ggml.bos_token_id", 1, ValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", tokens.index("<|endoftext|>"), ValueType.UINT32)
    w.add("tokenizer.ggml.unknown_token_id", 0, ValueType.UINT32)
    w.add("tokenizer.ggml.add_bos_token", True, ValueType.BOOL)
    return "<|end|>"


_UNMAP_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}


def _byte_vocabulary(w: GGUFWriter, n_vocab: int) -> str:
    tokens = _tokenizer_tokens(n_vocab)
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", "gpt-2")  # llama.cpp's name for it
    w.add("tokenizer.ggml.tokens", tokens, ValueType.ARRAY, ValueType.STRING)
    w.add("tokenizer.ggml.token_type", np.array([1] * 256 + [3] + [1] * (n_vocab - 257), np.int32))
    w.add("tokenizer.ggml.merges", [], ValueType.ARRAY, ValueType.STRING)
    w.add("tokenizer.ggml.bos_token_id", 256, ValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", 256, ValueType.UINT32)
    w.add("tokenizer.ggml.add_bos_token", False, ValueType.BOOL)
    return "<|endoftext|>"


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
    return write_synthetic(path, shape, ggml_type, seed, metadata=metadata, tensors=tensors)


def write_synthetic(path: str | os.PathLike[str], shape: Shape | str,
                    ggml_type: GGMLType | str = GGMLType.Q4_1, seed: int = 0, *, arch: str = "llama",
                    vocab: str = "bytes", sliding_window: int = 0, n_rot: int = 0, tile_rows: int = 256,
                    fused_qkv: bool = True, omit: tuple[str, ...] = (),
                    metadata: Mapping[str, Any] | None = None,
                    tensors: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write a GGUF of architecture `arch` (ARCHITECTURES) and `shape` (a Shape or a PRESETS
    name) with random weights in `ggml_type` (a GGMLType, or a mix of MIXES; norms and biases in
    F32), a separate output head,
    the architecture's real tensor names, shapes and metadata keys (qwen2's Q/K/V biases,
    qwen3's per-head norms and key length, phi3's fused attn_qkv and 2 * n_ff-row ffn_up), a
    tokenizer and a chat template.

    vocab: "bytes" (256 byte tokens and placeholders, no merges), "bpe" (byte-level BPE
    learned from generated_text, with the pre-tokenizer of the architecture's models: llama-bpe
    for llama and mistral, qwen2 for the Qwen models) or "spm" (SentencePiece-style, as Phi-3's).
    sliding_window: `<arch>.attention.sliding_window` (mistral and phi3; 0 writes none for
    mistral, 0 for phi3 as Phi-4's converter does). n_rot: phi3's `rope.dimension_count`
    (0: the head dim). tile_rows: rows of each matrix that are random (the rest repeat them);
    small test models pass more than they have. fused_qkv=False: phi3's attn_qkv rows written
    as attn_q, attn_k and attn_v instead (the same weights). omit: tensor names left out.
    `metadata` (key -> value, or (value, ValueType)) and `tensors` (name -> float32 array in
    NumPy order) are added as they are."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown synthetic architecture {arch!r} (known: {', '.join(ARCHITECTURES)})")
    if isinstance(ggml_type, str) and ggml_type not in MIXES:
        raise ValueError(f"unknown weight mix {ggml_type!r} (known: {', '.join(MIXES)})")
    s = PRESETS[shape] if isinstance(shape, str) else shape
    type_of = functools.partial(_weight_type, ggml_type, s.n_layer)
    name = "llama" if arch == "mistral" else arch
    rng = np.random.default_rng(seed)
    path = Path(path)
    w = GGUFWriter(path)
    w.add("general.architecture", name)
    # transformers reads a llama file named for Mistral as its Mistral model.
    w.add("general.name", f"synthetic {arch} {s.n_params / 1e9:.2f}B (random weights)")
    hd = s.head_dim
    rot = n_rot or hd
    if arch == "phi3" and (rot % 2 or not 2 <= rot <= hd):
        raise ValueError(f"n_rot = {n_rot} must be even and in [2, head dim = {hd}]")
    if arch not in ("phi3", "mistral") and (sliding_window or n_rot):
        raise ValueError(f"{arch} files have no sliding window or partial RoPE here")
    for k, v in [("block_count", s.n_layer), ("context_length", s.n_ctx), ("embedding_length", s.n_embd),
                 ("feed_forward_length", s.n_ff), ("attention.head_count", s.n_head),
                 ("attention.head_count_kv", s.n_head_kv), ("vocab_size", s.n_vocab),
                 ("rope.dimension_count", rot)]:
        w.add(f"{name}.{k}", v, ValueType.UINT32)
    if s.key_length or arch == "qwen3":  # Qwen 3's converter always writes its head dim
        w.add(f"{name}.attention.key_length", hd, ValueType.UINT32)
        w.add(f"{name}.attention.value_length", hd, ValueType.UINT32)
    if arch == "phi3" or sliding_window:
        w.add(f"{name}.attention.sliding_window", sliding_window, ValueType.UINT32)
    if arch == "phi3":
        w.add("phi3.rope.scaling.original_context_length", s.n_ctx, ValueType.UINT32)
    w.add(f"{name}.rope.freq_base", 1e6 if arch.startswith("qwen") else 10000.0, ValueType.FLOAT32)
    w.add(f"{name}.attention.layer_norm_rms_epsilon", 1e-6 if arch.startswith("qwen") else 1e-5, ValueType.FLOAT32)
    w.add("general.file_type", {GGMLType.Q4_1: 3, GGMLType.Q4_0: 2, GGMLType.Q8_0: 7, GGMLType.F16: 1,
                                GGMLType.F32: 0, "q4_k_m": 15}.get(ggml_type, 0), ValueType.UINT32)
    if vocab == "bytes":
        end = _byte_vocabulary(w, s.n_vocab)
    elif vocab == "bpe":
        end = _bpe_vocabulary(w, s.n_vocab, "qwen2" if arch.startswith("qwen") else "llama-bpe", seed)
    elif vocab == "spm":
        end = _sentencepiece_vocabulary(w, s.n_vocab, seed)
    else:
        raise ValueError(f"vocab must be 'bytes', 'bpe' or 'spm', not {vocab!r}")
    # Turns ended by the one control token, so Model.chat() (the peers study's time to first
    # token) runs on these models too.
    w.add("tokenizer.chat_template", chat_template(end))
    q, kv = s.n_head * hd, s.n_head_kv * hd

    def add_raw(tname: str, raw: np.ndarray, ggml_shape: tuple[int, int], t: GGMLType) -> None:
        if tname not in omit:
            w.add_raw_tensor(tname, raw, ggml_shape, t)

    def add(tname: str, data: np.ndarray) -> None:
        if tname not in omit:
            w.add_tensor(tname, data)

    for mat, (rows, cols) in s.matrices().items():
        if arch == "phi3" and mat.endswith(("attn_k.weight", "attn_v.weight", "ffn_gate.weight")):
            continue  # written fused below
        if arch == "phi3" and mat.endswith("attn_q.weight"):
            mat, rows = mat.replace("attn_q", "attn_qkv"), q + 2 * kv
        if arch == "phi3" and mat.endswith("ffn_up.weight"):
            rows = 2 * s.n_ff
        wt = type_of(mat, cols)
        raw = _random_matrix(rng, rows, cols, wt, tile_rows)
        if mat.endswith("attn_qkv.weight") and not fused_qkv:
            parts = np.split(raw.reshape(rows, -1), [q, q + kv])
            for t, part in zip("qkv", parts):
                add_raw(mat.replace("attn_qkv", f"attn_{t}"), part.reshape(-1), (cols, part.shape[0]), wt)
        else:
            add_raw(mat, raw, (cols, rows), wt)
    for i in range(s.n_layer):
        for norm in ("attn_norm", "ffn_norm"):
            add(f"blk.{i}.{norm}.weight", 1 + 0.1 * rng.standard_normal(s.n_embd).astype(np.float32))
        if arch == "qwen2":
            for t, n in (("q", q), ("k", kv), ("v", kv)):
                add(f"blk.{i}.attn_{t}.bias", 0.5 * rng.standard_normal(n).astype(np.float32))
        if arch == "qwen3":
            for t in ("q", "k"):
                add(f"blk.{i}.attn_{t}_norm.weight", 1 + 0.2 * rng.standard_normal(hd).astype(np.float32))
    add("output_norm.weight", np.ones(s.n_embd, np.float32))
    for key, value in (metadata or {}).items():
        if isinstance(value, tuple):
            w.add(key, *value)
        else:
            w.add(key, value)
    for tname, arr in (tensors or {}).items():
        w.add_tensor(tname, np.ascontiguousarray(arr, np.float32))
    w.write()
    return path


def _weight_type(ggml_type: GGMLType | str, n_layer: int, name: str, cols: int) -> GGMLType:
    """The type of matrix `name` (of `cols` columns) in a file of `ggml_type`."""
    if not isinstance(ggml_type, str):
        return ggml_type
    from pyinfer.quantize import matrix_type

    return matrix_type(ggml_type, name, n_layer, False, cols)


def synthetic_model(preset: str, ggml_type: GGMLType | str = GGMLType.Q4_1, arch: str = "llama") -> Path:
    """The preset's model of architecture `arch` (ARCHITECTURES) in the cache
    (pyinfer.registry.cache_dir()/derived), written once."""
    from pyinfer.registry import cache_dir

    if preset not in PRESETS:
        raise ValueError(f"unknown synthetic model {preset!r} (known: {', '.join(PRESETS)})")
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown synthetic architecture {arch!r} (known: {', '.join(ARCHITECTURES)})")
    kind = ggml_type if isinstance(ggml_type, str) else ggml_type.name.lower()
    path = cache_dir() / "derived" / f"synthetic-{arch}-{preset}.{kind}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic(path, preset, ggml_type, arch=arch)
    return path
