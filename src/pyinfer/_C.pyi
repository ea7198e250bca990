"""Type stub for pyinfer._C, the C++ kernels (tests check it names exactly what the module has)."""

from collections import abc
from typing import Any

import numpy as np
import numpy.typing as npt

def cpu_info() -> dict[str, Any]:
    """Detected CPU features, compiled and available ISA paths, the active one."""

def get_isa() -> str:
    """The active ISA path: 'scalar', 'avx2' or 'avx512'."""

def set_isa(name: str) -> None:
    """Switch the active ISA path; RuntimeError if this CPU lacks it, ValueError if unknown."""

def type_traits() -> dict[int, dict[str, Any]]:
    """The per-type traits table of the C++ code: {ggml type id: {field: value}}
    (pyinfer.gguf_types.TYPE_TRAITS is its Python mirror)."""

def dequantize(type: int, raw: npt.NDArray[np.uint8], n: int) -> npt.NDArray[np.float32]:
    """Dequantize n elements of raw GGUF blocks of the given type id to float32."""

def read_bandwidth(n_bytes: int = ..., n_threads: int = 1, repeats: int = 10) -> dict[str, Any]:
    """Time `repeats` passes reading an n_bytes array with n_threads threads."""

def stream_bandwidth(kernel: str, n_bytes: int = ..., n_threads: int = 1, repeats: int = 10) -> dict[str, Any]:
    """Time `repeats` passes of STREAM's copy or triad over arrays of about n_bytes in all;
    n_bytes in the result counts bytes read plus written per pass."""

def int8_peak(min_seconds: float = 0.05) -> float:
    """Multiply-adds per second of the active ISA's int8 dot-product instruction on one core
    (12 independent accumulators): the compute ceiling of precision='fast'."""

def matmul(
    x: npt.NDArray[np.float32],
    w: npt.NDArray[Any],
    w_type: int,
    n: int,
    k: int,
    *,
    precision: str = "fast",
    n_threads: int = 1,
    out: npt.NDArray[np.float32] | None = None,
    packed: bool = False,
) -> npt.NDArray[np.float32]:
    """y[M, n] = x[M, k] @ W[n, k]^T, W of a GGUF type id with a matmul or dequantization
    kernel (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K; k a multiple of 32 and of the
    type's block size) given as its raw bytes or any C-contiguous array of exactly n rows; no
    copies, GIL released.

    precision "fast": activations quantized per 32-block to int8, integer dot products for Q8_0,
    Q4_0 and Q4_1 (for other types the same as "exact": rows dequantized, float32 dots);
    "exact": float32 activations and accumulation.
    Any n_threads gives the same bits; the pool grows to n_threads if needed. packed=True
    takes W in repack's layout and gives the scalar path's unpacked fast result bit for bit on
    every path; unpacked Q8_0/Q4_0/Q4_1 fast on AVX2/AVX-512 adds the block products in
    another order (float32 rounding apart, about 2e-7 relative). NaN/inf in x land in the
    same outputs on every path; a block scale that is not finite makes the same outputs
    non-finite, NaN on one path where another has inf."""

def matmul_parts(
    x: npt.NDArray[np.float32],
    parts: abc.Sequence[tuple[npt.NDArray[Any], int, int, bool]],
    k: int,
    *,
    precision: str = "fast",
    n_threads: int = 1,
) -> npt.NDArray[np.float32]:
    """Matrices that share x, in one job: y[M, sum of n], each part's outputs side by side;
    parts are (w, w_type, n, packed) tuples: weights packed by repack (fast mode), or any
    type's rows as stored."""

def repack(w: npt.NDArray[Any], w_type: int, n: int, k: int) -> npt.NDArray[np.uint8]:
    """Q8_0/Q4_0/Q4_1 weights of n rows -> the 16-row interleaved layout matmul(packed=True)
    takes (n padded to a multiple of 16)."""

def unpack(packed: npt.NDArray[np.uint8], w_type: int, n: int, k: int) -> npt.NDArray[np.uint8]:
    """The inverse of repack: the n rows' blocks as stored in GGUF."""

def quantize_activations(
    x: npt.NDArray[np.float32],
) -> tuple[
    npt.NDArray[np.int8], npt.NDArray[np.float32], npt.NDArray[np.int32], npt.NDArray[np.int8], npt.NDArray[np.int32]
]:
    """Fast-mode activation quantization of x[M, K] (K a multiple of 32): per 32-block the int8
    quants q, the scale d, the sum of the block's integers, and (h, jo): a block whose largest
    element is over twice the next keeps it as 128 * h + q[jo] (h = 0 otherwise); see
    pyinfer.reference.quantize_activations."""

def pool_size() -> int:
    """Threads a kernel call can use without growing the pool (workers + the caller)."""

def set_pool_size(n_threads: int) -> None:
    """Start or stop workers so the pool serves n_threads threads (the caller included)."""

# ---- small ops, KV cache, attention (float32 activations; arrays are checked, never copied)

def rms_norm(
    x: npt.NDArray[np.float32],
    w: npt.NDArray[np.float32],
    eps: float,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """out = x / sqrt(mean(x^2, last axis) + eps) * w for x[..., n], w[n]; out may be x."""

def rope(
    x: npt.NDArray[np.float32],
    pos: int | npt.NDArray[np.integer[Any]],
    n_heads: int,
    head_dim: int,
    base: float,
    neox: bool = False,
    freq_scale: float = 1.0,
    factors: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """Rotate x[M, n_heads * head_dim] in place for positions pos..pos+M-1 (pos an int) or
    pos[t] (an integer array); adjacent pairs (llama.cpp's normal mode, what llama-arch GGUFs
    expect) or, with neox, (i, i + head_dim/2).
    theta_i = pos * freq_scale * base^(-2i/head_dim) / factors[i] (factors float32
    [head_dim/2], default all 1: Llama 3's frequency factors). Returns x."""

def swiglu(
    gate: npt.NDArray[np.float32],
    up: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """out = silu(gate) * up, elementwise over arrays of one shape; out may alias an input."""

def geglu(
    gate: npt.NDArray[np.float32],
    up: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """out = gelu_tanh(gate) * up (GELU's tanh approximation), elementwise over arrays of one
    shape; out may alias an input."""

def add(
    a: npt.NDArray[np.float32],
    b: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """out = a + b (the residual add), elementwise over arrays of one shape."""

def softmax(
    x: npt.NDArray[np.float32], out: npt.NDArray[np.float32] | None = None
) -> npt.NDArray[np.float32]:
    """Softmax over the last axis; out may be x."""

def embedding(
    table: npt.NDArray[Any],
    type: int,
    ids: abc.Sequence[int] | npt.NDArray[np.integer[Any]],
    dim: int,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """Rows `ids` of a table of dim-element rows of a GGUF type id (its bytes as stored: Q8_0,
    F16, F32, or any type with a dequantization kernel) as float32 [len(ids), dim]."""

class KVCache:
    """Per-sequence K/V cache, float32 or float16: V stored [n_layer][n_head_kv][n_ctx][head_dim],
    K in blocks of 16 positions, [head_dim][16] each once complete.

    Not safe to append to from one thread while another reads the same cache."""

    n_layer: int
    n_head_kv: int
    head_dim: int
    n_ctx: int
    nbytes: int
    dtype: np.dtype[Any]

    def __init__(
        self, n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int, dtype: Any = "float32"
    ) -> None:
        """Zeroed storage for n_ctx positions; dtype float32 or float16."""

    def append(
        self, layer: int, k: npt.NDArray[np.float32], v: npt.NDArray[np.float32], pos: int
    ) -> None:
        """Write K (already rotated) and V, [M, n_head_kv * head_dim], at positions
        pos..pos+M-1 (rounded to nearest even for float16). pos <= n_pos(layer) and
        pos + M <= n_ctx, else ValueError; positions after pos + M are dropped."""

    def keys(self, layer: int) -> npt.NDArray[Any]:
        """Read-only copy [n_head_kv, n_ctx, head_dim] of one layer's keys, in position order."""

    def values(self, layer: int) -> npt.NDArray[Any]:
        """Read-only view [n_head_kv, n_ctx, head_dim] of one layer's values."""

    def n_pos(self, layer: int) -> int:
        """Positions a layer holds."""

    def clear(self) -> None:
        """Forget every position of every layer."""

def attention(
    q: npt.NDArray[np.float32],
    cache: KVCache,
    layer: int,
    pos: int,
    n_head: int,
    scale: float | None = None,
    window: int = 0,
    n_threads: int = 1,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """Causal grouped-query attention of q[M, n_head * head_dim] at positions pos..pos+M-1
    against the cache's layer, which must already hold them. Query head h reads KV head
    h // (n_head / n_head_kv); scale defaults to 1/sqrt(head_dim); window > 0 limits each query
    to its last `window` keys. Any n_threads gives the same bits. Returns [M, n_head * head_dim]."""

def architectures() -> list[str]:
    """Names of the architectures the C++ forward pass implements."""

class Model:
    """Weights of a model of one architecture, shared by its sequences."""

    repacked_bytes: int

    def __init__(self, architecture: str, params: dict[str, float],
                 tensors: dict[str, tuple[Any, int, int, int]], repack: bool = True) -> None:
        """params: hyperparameters by name (pyinfer.arch.Config.params()); tensors: GGUF name ->
        (array, type, rows, cols), every one of which the architecture must read (ValueError
        naming a missing, misshapen or unused tensor). With repack, quantized matrices get a
        16-row interleaved copy for the fast path."""

class Sequence:
    """One sequence: KV cache, position, scratch for n_batch tokens per eval."""

    n_past: int
    n_ctx: int
    n_batch: int
    kv_nbytes: int

    def __init__(self, model: Model, n_ctx: int, n_batch: int, kv_dtype: Any = "float32") -> None:
        """An empty sequence of at most n_ctx positions."""

    def eval(self, ids: npt.NDArray[np.int32], logits: npt.NDArray[np.float32], all_logits: bool,
             precision: str, n_threads: int) -> None:
        """Run 1..n_batch int32 ids at the next positions; write the logits of every token
        (all_logits) or of the last into logits [rows, n_vocab]."""

    def embed(self, ids: npt.NDArray[np.int32], hidden: npt.NDArray[np.float32], all_rows: bool,
              precision: str, n_threads: int) -> None:
        """As eval, writing the final hidden states (after the output norm) of every token
        (all_rows) or of the last into hidden [rows, n_embd]."""

    def truncate(self, n: int) -> None:
        """Forget positions >= n."""

    def copy_prefix(self, src: Sequence, n: int) -> None:
        """Hold src's first n positions (an exact copy of its KV cache: n <= src.n_past and
        n <= n_ctx) and nothing after them; src may be this sequence."""

class Batch:
    """Many sequences in one forward pass: up to n_rows token rows per step, all together."""

    n_rows: int

    def __init__(self, model: Model, n_rows: int) -> None:
        """Scratch for steps of up to n_rows token rows of the model."""

    def step(self, contexts: list[Sequence], ids: npt.NDArray[np.int32], counts: npt.NDArray[np.int64],
             logits: npt.NDArray[np.float32], precision: str, n_threads: int,
             n_logits: npt.NDArray[np.int64] | None = None) -> None:
        """Append counts[b] of the ids (int32, the contexts' tokens back to back) to contexts[b]
        (n distinct contexts of this model, sum(counts) <= n_rows), every weight read once for
        all of them; write each one's next-token logits into logits [n, n_vocab], or with
        n_logits those after each one's last n_logits[b] tokens (1 <= n_logits[b] <= counts[b]),
        back to back, [sum(n_logits), n_vocab]. Each row is
        what contexts[b].eval of its tokens would give alone (bit for bit in fast mode). Raises
        ValueError (bad id or count, full or repeated context) before changing any state,
        RuntimeError if a context is in use by another thread."""

    def embed(self, contexts: list[Sequence], ids: npt.NDArray[np.int32], counts: npt.NDArray[np.int64],
              hidden: npt.NDArray[np.float32], precision: str, n_threads: int) -> None:
        """As step, writing the final hidden states (after the output norm) of every token, in
        the order of ids, into hidden [sum(counts), n_embd] (no logits): each row what
        contexts[b].embed of its tokens would give alone."""
