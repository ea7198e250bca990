"""Llama-shaped GGUFs whose matrices mix the K-quants with Q5_0 and Q8_0, as a Q4_K_M file
does, load and generate in both precisions on every ISA path: the exact path matches the
NumPy forward pass on the dequantized weights to float32 rounding, the fast path (int8
kernels on the repacked K-quants) to the activations' int8 rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyinfer import reference
from pyinfer.gguf import GGMLType, GGUFReader, GGUFWriter
from pyinfer.model import Model

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB = 256, 4, 2, 512, 96
MATRICES = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
# Each layer's matrices in turn take the three types, so every role meets each of them.
TYPES = [GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q6_K]


def write_kquant_llama(path: Path, types: list[GGMLType] = TYPES, seed: int = 0,
                       role_types: dict[str, GGMLType] | None = None) -> None:
    """Two layers, width 256; matrix i of layer l takes types[(i + l) % len(types)], or its
    role's type from role_types (then the embedding is Q4_K and the output head Q6_K too)."""
    rng = np.random.default_rng(seed)
    hd = N_EMBD // N_HEAD
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    for k, v in [("block_count", 2), ("embedding_length", N_EMBD), ("feed_forward_length", N_FF),
                 ("attention.head_count", N_HEAD), ("attention.head_count_kv", N_HEAD_KV),
                 ("context_length", 128)]:
        w.add(f"llama.{k}", v, 4)
    w.add("llama.rope.freq_base", 10000.0)
    w.add("llama.attention.layer_norm_rms_epsilon", 1e-5)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(N_VOCAB, N_EMBD), GGMLType.Q4_K)
    shapes = {"attn_q": (N_EMBD, N_EMBD), "attn_k": (N_HEAD_KV * hd, N_EMBD), "attn_v": (N_HEAD_KV * hd, N_EMBD),
              "attn_output": (N_EMBD, N_EMBD), "ffn_gate": (N_FF, N_EMBD), "ffn_up": (N_FF, N_EMBD),
              "ffn_down": (N_EMBD, N_FF)}
    for layer in range(2):
        p = f"blk.{layer}."
        w.add_tensor(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
        w.add_tensor(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
        for i, name in enumerate(MATRICES):
            t = role_types[name] if role_types else types[(i + layer) % len(types)]
            w.add_tensor(f"{p}{name}.weight", mat(*shapes[name]), t)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    w.add_tensor("output.weight", 4 * mat(N_VOCAB, N_EMBD), GGMLType.Q6_K)
    w.write()


@pytest.fixture(scope="module")
def kquant_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kquant") / "kquant.gguf"
    write_kquant_llama(path)
    return path


def test_file_holds_the_three_types(kquant_model):
    r = GGUFReader(kquant_model)
    types = {t.type for name, t in r.tensors.items() if not name.endswith("norm.weight")}
    assert types == set(TYPES)


def greedy(model: Model, prompt: list[int], n_new: int) -> tuple[list[int], np.ndarray]:
    """Greedy continuation token by token (prefill, then one-token decode steps): the ids and
    the logits every step was chosen from, [n_new, n_vocab]."""
    ctx = model.context(n_ctx=64)
    logits = ctx.eval(prompt).copy()
    ids, seen = list(prompt), []
    for _ in range(n_new):
        seen.append(logits)
        ids.append(int(np.argmax(logits)))
        logits = ctx.eval([ids[-1]]).copy()
    return ids, np.array(seen)


# Largest logit error allowed, as a fraction of the largest reference logit: float32 against
# float64 through two layers is a few ulps (2e-5 is ~100x what the scalar path shows); int8
# activations come to about 0.01 (the tiny model of test_model allows 0.15).
TOLERANCE = {"exact": 2e-5, "fast": 0.05}


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_generates_as_the_reference(kquant_model, isa, precision):
    prompt, n_new = [3, 17, 42, 0, 79, 5], 10
    model = Model.load(kquant_model, precision=precision, n_threads=2, n_ctx=64)
    # Every matrix type here has the interleaved layout; the scalar path does not repack.
    assert (model.repacked_bytes > 0) == (isa != "scalar")
    ids, logits = greedy(model, prompt, n_new)
    # The reference forward pass over the same ids gives the logits every step saw.
    ref = reference.forward(GGUFReader(kquant_model), ids[:-1])[len(prompt) - 1:]
    scale = np.abs(ref).max()
    tol = TOLERANCE[precision] * scale
    err = np.abs(logits - ref).max()
    assert err <= tol, (isa, precision, err, scale)
    # Each chosen token is the reference's choice wherever the reference's top two differ by
    # more than twice the error allowed.
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * tol
    if precision == "exact":
        assert clear.sum() >= n_new // 2
    np.testing.assert_array_equal(np.array(ids[len(prompt):])[clear], np.argmax(ref, axis=1)[clear])
    # Prefill of the whole sequence at once gives the decode steps' logits.
    np.testing.assert_allclose(model.logits(ids[:-1])[len(prompt) - 1:], logits, rtol=0, atol=tol)
    if precision == "fast":
        # The int8 kernels did run, and their error is that of int8 activations: more than
        # the exact path's, within the bound.
        exact = Model.load(kquant_model, precision="exact", n_threads=2, n_ctx=64)
        exact_logits = exact.logits(ids[:-1])[len(prompt) - 1:]
        assert np.abs(exact_logits - ref).max() < err


# The matrices of a Q4_K_M file as llama.cpp's quantizer writes them: Q4_K, with Q6_K for
# the output head and for attn_v and ffn_down on some layers; Gemma 3's file adds Q5_0 and
# Q8_0 matrices.
Q4_K_M_LIKE = {"attn_q": GGMLType.Q4_K, "attn_k": GGMLType.Q4_K, "attn_v": GGMLType.Q6_K,
               "attn_output": GGMLType.Q5_0, "ffn_gate": GGMLType.Q4_K, "ffn_up": GGMLType.Q8_0,
               "ffn_down": GGMLType.Q6_K}


def test_q4_k_m_like_mix(tmp_path, isa):
    """A Q4_K_M-like mix (Q4_K, Q6_K, Q5_0, Q8_0 matrices, a Q6_K output head): both precisions
    against the reference, the fast one through the repacked int8 kernels, and its decode
    steps the same bits whether each step runs alone or the prompt is prefilled at once up to
    them (each kernel's result depends on its own row only)."""
    path = tmp_path / "q4_k_m.gguf"
    write_kquant_llama(path, role_types=Q4_K_M_LIKE)
    r = GGUFReader(path)
    assert {t.type for name, t in r.tensors.items() if not name.endswith("norm.weight")} == {
        GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q5_0, GGMLType.Q8_0}
    prompt = [3, 17, 42, 0, 79, 5]
    ref = reference.forward(r, prompt)
    scale = np.abs(ref).max()
    exact = Model.load(path, precision="exact", n_threads=2).logits(prompt)
    assert np.abs(exact - ref).max() <= TOLERANCE["exact"] * scale
    fast_model = Model.load(path, precision="fast", n_threads=2)
    assert (fast_model.repacked_bytes > 0) == (isa != "scalar")
    fast = fast_model.logits(prompt)
    assert np.abs(fast - ref).max() <= TOLERANCE["fast"] * scale
    assert not np.array_equal(fast, exact)  # the int8 kernels did run
    # One thread or two: the same bits.
    one = Model.load(path, precision="fast", n_threads=1).logits(prompt)
    np.testing.assert_array_equal(one.view(np.uint32), fast.view(np.uint32))
