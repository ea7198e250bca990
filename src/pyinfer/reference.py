"""NumPy references: the spec every C++ kernel is tested against, and a NumPy forward pass.

The kernel references compute in float64 and return float64, so a test measures a kernel's
own float32 rounding against a value that carries almost none. `forward` runs a llama-family
(llama, qwen2, qwen3, phi3) or gemma3 GGUF model on dequantized weights, in float64 (or float32) math.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pyinfer.gguf_types import TYPE_TRAITS, GGMLType

# ---- small ops ------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x[..., n] / sqrt(mean(x^2) + eps) * w[n], over the last axis."""
    x = np.asarray(x, dtype=np.float64)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * np.asarray(w, dtype=np.float64)


def rope_angles(
    pos: np.ndarray, head_dim: int, base: float, freq_scale: float = 1.0, factors: np.ndarray | None = None
) -> np.ndarray:
    """theta[len(pos), head_dim // 2] = pos * freq_scale * base^(-2i / head_dim) / factors[i]."""
    i = np.arange(head_dim // 2, dtype=np.float64)
    inv_freq = np.power(float(base), -2.0 * i / head_dim)
    if factors is not None:
        inv_freq = inv_freq / np.asarray(factors, dtype=np.float64)
    return np.asarray(pos, dtype=np.float64)[:, None] * float(freq_scale) * inv_freq[None, :]


def rope(
    x: np.ndarray,
    pos: int | Sequence[int] | np.ndarray,
    n_heads: int,
    head_dim: int,
    base: float,
    neox: bool = False,
    freq_scale: float = 1.0,
    factors: np.ndarray | None = None,
) -> np.ndarray:
    """Rotary embedding of x[M, n_heads * head_dim]; row t is at position pos + t (pos an int)
    or pos[t] (an array).

    Normal mode (llama-arch GGUF, whose converter permuted the Q and K rows) rotates adjacent
    pairs (x[2i], x[2i+1]); neox mode rotates (x[i], x[i + head_dim/2]). Both by theta_i
    (rope_angles: linear scaling by freq_scale, Llama 3's per-pair factors).
    """
    x = np.asarray(x, dtype=np.float64)
    m = x.shape[0]
    positions = np.arange(pos, pos + m) if isinstance(pos, (int, np.integer)) else np.asarray(pos)
    theta = rope_angles(positions, head_dim, base, freq_scale, factors)  # [M, head_dim/2]
    c = np.cos(theta)[:, None, :]
    s = np.sin(theta)[:, None, :]
    h = x.reshape(m, n_heads, head_dim)
    if neox:
        a, b = h[..., : head_dim // 2], h[..., head_dim // 2 :]
    else:
        a, b = h[..., 0::2], h[..., 1::2]
    out = np.empty_like(h)
    ra, rb = a * c - b * s, a * s + b * c
    if neox:
        out[..., : head_dim // 2], out[..., head_dim // 2 :] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out.reshape(m, n_heads * head_dim)


def silu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, elementwise."""
    return silu(gate) * np.asarray(up, dtype=np.float64)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU by its tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
    evaluated as x / (1 + exp(-2u)), the same function without the cancellation of 1 + tanh(u)
    where u is large and negative (there exp(-2u) overflows to inf and the value to -0)."""
    x = np.asarray(x, dtype=np.float64)
    u = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-2.0 * u))


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up, elementwise."""
    return gelu_tanh(gate) * np.asarray(up, dtype=np.float64)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Residual add, in float32 like the kernel (a float32 sum is correctly rounded)."""
    return np.asarray(a, dtype=np.float32) + np.asarray(b, dtype=np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def embedding(table: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """Rows `ids` of a dequantized table[n_rows, dim]."""
    return np.asarray(table, dtype=np.float32)[np.asarray(ids, dtype=np.int64)]


def query_q16(q: np.ndarray, chunk: int = 32) -> np.ndarray:
    """A query as the scores against a q8_0 KV cache take it (kernels/kv_query.h): per `chunk`
    elements, with a the largest |q_i|, int16 round((q_i / a) * 32767) times a / 32767, all in
    float32 arithmetic; a chunk of zeros stays zero, one holding a NaN or an infinity becomes
    NaN. Returns float64 values of q's shape (the last axis a multiple of chunk)."""
    x = np.asarray(q, np.float32)
    c = x.reshape(*x.shape[:-1], x.shape[-1] // chunk, chunk)
    a = np.max(np.abs(c), axis=-1, keepdims=True)
    finite = np.all(np.isfinite(c), axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        qi = np.where((a > 0) & finite, np.rint(c / a * np.float32(32767.0)), np.float32(0.0))
    qd = np.where(finite, a / np.float32(32767.0), np.float32(np.nan))
    return (qi.astype(np.float64) * qd.astype(np.float64)).reshape(x.shape)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    pos: int,
    n_head: int,
    scale: float | None = None,
    window: int = 0,
) -> np.ndarray:
    """Causal grouped-query attention of M new queries at positions pos..pos+M-1.

    q[M, n_head * head_dim]; k, v[n_head_kv, >= pos + M, head_dim] (the cache, holding the new
    positions too). Query head h reads KV head h // (n_head / n_head_kv). Query t sees keys
    0..pos+t, or only the last `window` of them when window > 0. Returns [M, n_head * head_dim].
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    m = q.shape[0]
    n_head_kv, _, head_dim = k.shape
    group = n_head // n_head_kv
    if scale is None:
        scale = 1.0 / np.sqrt(head_dim)
    out = np.empty((m, n_head, head_dim))
    qh = q.reshape(m, n_head, head_dim)
    for t in range(m):
        end = pos + t + 1
        start = max(0, end - window) if window > 0 else 0
        for h in range(n_head):
            g = h // group
            s = k[g, start:end] @ qh[t, h] * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[g, start:end]
    return out.reshape(m, n_head * head_dim)


# ---- matmul ------------------------------------------------------------------------------
# y[M, N] = x[M, K] @ W[N, K]^T with W given as raw GGUF bytes of N rows (pyinfer._C.matmul).

_QK = 32  # activation block of the fast mode, and the block of every quantized matmul type


def matmul_exact(x: np.ndarray, w_raw: np.ndarray, w_type: int, n: int, k: int) -> np.ndarray:
    """Exact mode: W dequantized (pyinfer.quants.dequantize), then a float64 matmul."""
    from pyinfer.quants import dequantize

    w = dequantize(np.asarray(w_raw).reshape(-1).view(np.uint8), w_type).reshape(n, k)
    return np.asarray(x, dtype=np.float64) @ w.astype(np.float64).T


def quantize_activations(
    x: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x[M, K] float32 -> (q int8 [M, K], d float32 [M, K/32], sum int32 [M, K/32],
    h int8 [M, K/32], jo int32 [M, K/32]), bit for bit as the C++ fast mode
    (csrc/kernels/q8_act.h). Per 32-block, all in float32: m1 = max |x|, jo its first index,
    m2 = the max over the others; when m1 > 2 * m2 the block is split: amax = max(m2, m1 / 128)
    and the largest element's integer a = 128 * h + l (l in [-64, 63], stored in q at jo);
    otherwise amax = m1 and h = 0. d = amax / 127, a = round_half_even(x * (127 / amax)),
    sum = sum of the integers a. `activation_integers` gives the a's whole."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    xb = x.reshape(m, k // _QK, _QK)
    ab = np.abs(xb)
    jo = ab.argmax(axis=2)
    m1 = np.take_along_axis(ab, jo[:, :, None], axis=2)[:, :, 0]
    rest = ab.copy()
    np.put_along_axis(rest, jo[:, :, None], np.float32(0), axis=2)
    m2 = rest.max(axis=2)
    split = m1 > np.float32(2) * m2
    amax = np.where(split, np.maximum(m2, m1 / np.float32(128)), m1).astype(np.float32)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    a = np.rint(xb * inv[:, :, None]).astype(np.int32)  # every |a| <= 127 but a split block's largest
    total = a.sum(axis=2, dtype=np.int32)
    big = np.take_along_axis(a, jo[:, :, None], axis=2)[:, :, 0]
    low = np.where(split, ((big + 64) & 127) - 64, big)
    h = np.where(split, (big - low) // 128, 0).astype(np.int8)
    np.put_along_axis(a, jo[:, :, None], low[:, :, None], axis=2)
    return a.astype(np.int8).reshape(m, k), d, total, h, jo.astype(np.int32)


def activation_integers(q: np.ndarray, h: np.ndarray, jo: np.ndarray) -> np.ndarray:
    """The integers a [M, K/32, 32] (int64) that quantize_activations' parts stand for."""
    m, k = q.shape
    a = q.reshape(m, k // _QK, _QK).astype(np.int64)
    at = np.take_along_axis(a, jo[:, :, None].astype(np.int64), axis=2)
    np.put_along_axis(a, jo[:, :, None].astype(np.int64), at + 128 * h[:, :, None].astype(np.int64), axis=2)
    return a


# The weight types with int8 fast-mode kernels.
FAST_TYPES = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q4_K,
              GGMLType.Q5_K, GGMLType.Q6_K)


def _weight_blocks(w_raw: np.ndarray, w_type: int, n: int, k: int):
    """W as 32-element blocks, the C++ spec's view (csrc/kernels/ref/matmul_ref.cpp): integer
    quants [N, K/32, 32] (signed, offset removed; Q6_K's sub-block scale multiplied in), scale
    and min [N, K/32] float32 with value = scale * q + min (K-quants: scale = d * sc, min =
    -(dmin * mn))."""
    from pyinfer.quants import k_quant_parts

    t = GGMLType(w_type)
    if t not in FAST_TYPES:
        raise ValueError(f"fast mode's integer kernels take {', '.join(x.name for x in FAST_TYPES)}, not {t.name}")
    tr = TYPE_TRAITS[t]
    nb = k // _QK
    b = np.asarray(w_raw).reshape(-1).view(np.uint8).reshape(n, k // tr.block_elems, tr.block_bytes)
    if tr.block_elems != _QK:
        q, scale, offset = k_quant_parts(b.reshape(-1, tr.block_bytes), t)
        return (q.reshape(n, nb, _QK).astype(np.int64), scale.reshape(n, nb),
                (-offset).reshape(n, nb).astype(np.float32))

    def f16(o: int) -> np.ndarray:
        return np.ascontiguousarray(b[:, :, o:o + 2]).view("<f2")[:, :, 0].astype(np.float32)

    d = f16(tr.d_offset)
    m = f16(tr.m_offset) if tr.has_min else np.zeros_like(d)
    qs = b[:, :, tr.qs_offset:tr.qs_offset + tr.qs_bytes]
    if tr.qs_signed:
        q = qs.view(np.int8).astype(np.int64)
    else:
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.int64)  # elements 0..15, 16..31
    if tr.quant_bits == 5:  # Q5_0, Q5_1: bit j of the word before the nibbles is element j's fifth
        qh = np.ascontiguousarray(b[:, :, tr.qs_offset - 4:tr.qs_offset]).view("<u4")  # [N, nb, 1]
        q |= ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int64) << 4
    return q - tr.q_bias, d, m


def matmul_fast_parts(
    x: np.ndarray, w_raw: np.ndarray, w_type: int, n: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Fast mode for the FAST_TYPES weights: (y, magnitude), both float64 [M, N].

    Activations are quantized as quantize_activations does; each 32-block's dot product
    isum = sum_j q_w[j] * a_j is exact in integers, and
    y = sum_b (d_w * d_x) * isum  +  sum_b m_w * (d_x * sum_x)   (the second where W has mins)
    with d_w * d_x and d_x * sum_x rounded to float32 as the C++ does, the sums exact (the C++
    adds each block's two terms by fused multiply-adds, one rounding each, within the bound).
    `magnitude` = sum_b |d_w * d_x| * sum_j (|q_w[j]| + 2 * off) * |q_x[j]|
    + sum_b |m_w * (d_x * sum_x)|, with off the offset the type stores its quants with (8 for
    Q4_0, 0 otherwise), bounds what float32 summation in any order, of isum split into partial
    sums of stored quants plus an offset correction, can get wrong: a multiple of
    eps * magnitude.
    """
    qx, dx, sx, hx, jx = quantize_activations(x)
    qw, dw, mw = _weight_blocks(w_raw, w_type, n, k)
    qx = activation_integers(qx, hx, jx)  # [M, nb, 32]
    isum = np.einsum("mbj,nbj->mnb", qx, qw)  # [M, N, nb], exact
    tr = TYPE_TRAITS[GGMLType(w_type)]
    off = tr.q_bias if tr.block_elems == _QK else 0  # K-quants: the offset is in q's integers
    iabs = np.einsum("mbj,nbj->mnb", np.abs(qx), np.abs(qw) + 2 * off)
    f = (dw[None, :, :] * dx[:, None, :]).astype(np.float64)  # float32 products
    y = (f * isum).sum(axis=2)
    mag = (np.abs(f) * iabs).sum(axis=2)
    s = dx * sx.astype(np.float32)  # [M, nb] float32
    mins = (mw[None, :, :] * s[:, None, :]).astype(np.float64)  # zero unless W has mins
    return y + mins.sum(axis=2), mag + np.abs(mins).sum(axis=2)


def matmul_fast(x: np.ndarray, w_raw: np.ndarray, w_type: int, n: int, k: int) -> np.ndarray:
    """Fast mode (see matmul_fast_parts); for types without int8 kernels the exact mode."""
    if w_type not in FAST_TYPES:
        return matmul_exact(x, w_raw, w_type, n, k)
    return matmul_fast_parts(x, w_raw, w_type, n, k)[0]


# ---- forward pass --------------------------------------------------------------------------


def load_model(reader: Any) -> dict[str, Any]:
    """Config (pyinfer.arch's description of the file) and the dequantized float32 weights
    (NumPy order: [out, in]) of the tensors the forward pass reads."""
    from pyinfer.arch import describe

    d = describe(reader)
    if d.config.architecture not in _FORWARDS:
        raise ValueError(f"reference.forward implements {', '.join(_FORWARDS)}, not {d.config.architecture!r}")
    w = {name: reader.dequantize(name) for name in d.tensors}
    if "output.weight" not in w:  # tied embedding
        w["output.weight"] = w["token_embd.weight"]
    return {"config": d.config, "weights": w}


def forward(model: Any, ids: Sequence[int], dtype: Any = np.float64) -> np.ndarray:
    """logits[len(ids), n_vocab] of a llama-family or gemma3 model for one sequence starting at
    position 0.

    `model` is a GGUFReader or the result of `load_model`. All activations are `dtype`.
    """
    if not isinstance(model, Mapping):
        model = load_model(model)
    return _FORWARDS[model["config"].architecture](model, ids, dtype)


def _lin_norm(w: Mapping[str, np.ndarray], eps: float, dtype: Any) -> tuple[Any, Any]:
    """lin(x, name) = x @ W^T and norm(x, name) = RMSNorm by the named vector, both in dtype."""

    def lin(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w[name].astype(dtype).T

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        return rms_norm(x, w[name], eps).astype(dtype)

    return lin, norm


def _forward_llama(model: Mapping[str, Any], ids: Sequence[int], dtype: Any) -> np.ndarray:
    """The llama family (llama, qwen2, qwen3, phi3): per layer RMSNorm, Q/K/V (one fused matrix
    split in three where the file has attn_qkv; plus biases where the config says), RMSNorm of
    each query and key head (qk_norm), RoPE on the first rope_dim dims of each head (NeoX order
    where rope_neox), attention (a sliding window where set), output projection, residual,
    RMSNorm, SwiGLU (gate and up split from one matrix where ffn_fused); final norm, head."""
    cfg, w = model["config"], model["weights"]
    n_head, n_head_kv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    q_dim, kv_dim = n_head * hd, n_head_kv * hd
    eps = cfg.rms_eps
    n_rot = getattr(cfg, "rope_dim", hd)
    rope_kw = {"base": cfg.rope_base, "freq_scale": cfg.rope_freq_scale, "factors": w.get("rope_freqs.weight"),
               "neox": getattr(cfg, "rope_neox", False)}
    window = getattr(cfg, "sliding_window", 0)
    tokens = np.asarray(ids, dtype=np.int64)
    m = len(tokens)

    lin, norm = _lin_norm(w, eps, dtype)

    def heads_rope(x: np.ndarray, n_heads: int) -> np.ndarray:
        h = np.array(x, dtype=np.float64).reshape(m, n_heads, hd)
        rot = rope(h[:, :, :n_rot].reshape(m, n_heads * n_rot), 0, n_heads, n_rot, **rope_kw)
        h[:, :, :n_rot] = rot.reshape(m, n_heads, n_rot)
        return h.reshape(m, n_heads * hd).astype(dtype)

    def head_norm(x: np.ndarray, n_heads: int, name: str) -> np.ndarray:
        return norm(x.reshape(m, n_heads, hd), name).reshape(m, n_heads * hd)

    x = w["token_embd.weight"][tokens].astype(dtype)  # [M, n_embd]
    for layer in range(cfg.n_layer):
        p = f"blk.{layer}."
        h = norm(x, p + "attn_norm.weight")
        if p + "attn_qkv.weight" in w:
            qkv = lin(h, p + "attn_qkv.weight")
            q, k, v = qkv[:, :q_dim], qkv[:, q_dim:q_dim + kv_dim], qkv[:, q_dim + kv_dim:]
        else:
            q, k, v = (lin(h, p + f"attn_{t}.weight") for t in "qkv")
        if getattr(cfg, "qkv_bias", False):
            q, k, v = (a + w[p + f"attn_{t}.bias"].astype(dtype) for a, t in zip((q, k, v), "qkv"))
        if getattr(cfg, "qk_norm", False):
            q = head_norm(q, n_head, p + "attn_q_norm.weight")
            k = head_norm(k, n_head_kv, p + "attn_k_norm.weight")
        q, k = heads_rope(q, n_head), heads_rope(k, n_head_kv)
        kc = k.reshape(m, n_head_kv, hd).transpose(1, 0, 2)  # [n_head_kv, M, head_dim]
        vc = v.reshape(m, n_head_kv, hd).transpose(1, 0, 2)
        a = attention(q, kc, vc, 0, n_head, window=window).astype(dtype)
        x = x + lin(a, p + "attn_output.weight")
        h = norm(x, p + "ffn_norm.weight")
        if getattr(cfg, "ffn_fused", False):
            gu = lin(h, p + "ffn_up.weight")
            gate, up = gu[:, :cfg.n_ff], gu[:, cfg.n_ff:]
        else:
            gate, up = lin(h, p + "ffn_gate.weight"), lin(h, p + "ffn_up.weight")
        x = x + lin(swiglu(gate, up).astype(dtype), p + "ffn_down.weight")
    x = norm(x, "output_norm.weight")
    return lin(x, "output.weight")


def _forward_gemma3(model: Mapping[str, Any], ids: Sequence[int], dtype: Any) -> np.ndarray:
    """Gemma 3: embeddings times sqrt(width); per layer RMSNorm, Q/K/V, RMSNorm of each query
    and key head, NeoX RoPE (the local layers' own base, the global ones' linear scaling),
    attention (a sliding window on local layers), RMSNorm of the block's output before the
    residual add, the same around a GeGLU feed-forward; final norm, head, soft-cap."""
    cfg, w = model["config"], model["weights"]
    n_head, n_head_kv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    eps = cfg.rms_eps
    tokens = np.asarray(ids, dtype=np.int64)
    m = len(tokens)

    lin, norm = _lin_norm(w, eps, dtype)

    def head_norm(x: np.ndarray, n_heads: int, name: str) -> np.ndarray:
        return norm(x.reshape(m, n_heads, hd), name).reshape(m, n_heads * hd)

    x = (w["token_embd.weight"][tokens].astype(np.float32) * np.float32(cfg.embd_scale)).astype(dtype)
    for layer in range(cfg.n_layer):
        p = f"blk.{layer}."
        local = cfg.local_layers[layer]
        rope_kw = {"base": cfg.rope_base_local, "freq_scale": 1.0} if local else \
            {"base": cfg.rope_base, "freq_scale": cfg.rope_freq_scale}
        h = norm(x, p + "attn_norm.weight")
        q = head_norm(lin(h, p + "attn_q.weight"), n_head, p + "attn_q_norm.weight")
        k = head_norm(lin(h, p + "attn_k.weight"), n_head_kv, p + "attn_k_norm.weight")
        q = rope(q, 0, n_head, hd, neox=True, **rope_kw).astype(dtype)
        k = rope(k, 0, n_head_kv, hd, neox=True, **rope_kw).astype(dtype)
        v = lin(h, p + "attn_v.weight")
        kc = k.reshape(m, n_head_kv, hd).transpose(1, 0, 2)  # [n_head_kv, M, head_dim]
        vc = v.reshape(m, n_head_kv, hd).transpose(1, 0, 2)
        a = attention(q, kc, vc, 0, n_head, scale=cfg.attn_scale,
                      window=cfg.sliding_window if local else 0).astype(dtype)
        x = x + norm(lin(a, p + "attn_output.weight"), p + "post_attention_norm.weight")
        h = norm(x, p + "ffn_norm.weight")
        g = geglu(lin(h, p + "ffn_gate.weight"), lin(h, p + "ffn_up.weight")).astype(dtype)
        x = x + norm(lin(g, p + "ffn_down.weight"), p + "post_ffw_norm.weight")
    logits = lin(norm(x, "output_norm.weight"), "output.weight")
    if cfg.final_logit_softcap > 0:
        logits = cfg.final_logit_softcap * np.tanh(logits / cfg.final_logit_softcap)
    return logits


_FORWARDS = {"llama": _forward_llama, "qwen2": _forward_llama, "qwen3": _forward_llama, "phi3": _forward_llama,
             "gemma3": _forward_gemma3}
