"""Batched decode (Model.decode_batch): each row equals its sequence's own single step, at
different positions, and bad batches fail before any context changes."""

from __future__ import annotations

import numpy as np
import pytest

from pyinfer import _C
from pyinfer.model import Model

# Prompts of different lengths, so the sequences of a batch sit at different positions.
PROMPTS = [[1, 504, 3458, 282], [1, 1670, 314], [1, 2056, 1345, 17, 2800, 42, 9], [1], [1, 88, 12, 450, 33]]


@pytest.fixture(scope="module")
def fast(default_model):
    return Model.load(default_model, precision="fast", n_ctx=64)


@pytest.fixture(scope="module")
def exact(default_model):
    return Model.load(default_model, precision="exact", n_ctx=64)


def contexts(model: Model, prompts: list[list[int]]) -> list:
    out = []
    for p in prompts:
        c = model.context()
        if p:
            c.eval(p)
        out.append(c)
    return out


def run_both(model: Model, steps: int = 3, prompts: list[list[int]] = PROMPTS) -> tuple[np.ndarray, np.ndarray]:
    """Logits of `steps` greedy steps, batched and one sequence at a time: [steps, B, n_vocab]."""
    batched, single = contexts(model, prompts), contexts(model, prompts)
    got, want = [], []
    toks = [7, 300, 11, 4000, 90][: len(prompts)]
    for _ in range(steps):
        b = model.decode_batch(batched, toks)
        s = np.stack([c.eval([t]).copy() for c, t in zip(single, toks)])
        got.append(b)
        want.append(s)
        toks = list(s.argmax(axis=1))
    assert [c.n_past for c in batched] == [c.n_past for c in single] == [len(p) + steps for p in prompts]
    return np.array(got), np.array(want)


def test_fast_batch_rows_equal_single_steps_bit_for_bit(fast):
    # Activations are quantized per row and every row's dot products run in the same order
    # whatever M is, so batching changes no bit.
    got, want = run_both(fast)
    np.testing.assert_array_equal(got, want)


def test_fast_batch_from_empty_contexts_and_across_key_blocks(fast):
    # A sequence's first token, and sequences whose steps fill a block of 16 cached keys (the
    # cache then lays that block out anew), in one batch.
    long = [1] + list(range(500, 514))  # 15 tokens: the first step writes position 15
    got, want = run_both(fast, prompts=[[], long, long[:14]])
    np.testing.assert_array_equal(got, want)


def test_exact_batch_rows_match_single_steps(exact):
    # The float32 kernels block over rows, so only the rounding of the sums may differ.
    got, want = run_both(exact, steps=2)
    scale = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) <= 64 * np.finfo(np.float32).eps * scale
    np.testing.assert_array_equal(got.argmax(axis=-1), want.argmax(axis=-1))


def test_batch_of_one_and_order(fast):
    a, b = contexts(fast, PROMPTS[:2]), contexts(fast, PROMPTS[:2])
    one = fast.decode_batch([a[0]], [5])
    np.testing.assert_array_equal(one[0], b[0].eval([5]))
    # Reordered contexts give reordered rows.
    x = fast.decode_batch([a[1], a[0]], [6, 7])
    np.testing.assert_array_equal(x[0], b[1].eval([6]))
    np.testing.assert_array_equal(x[1], b[0].eval([7]))


def test_full_context_fails_before_any_change(fast):
    ok = fast.context(n_ctx=8)
    full = fast.context(n_ctx=4)
    ok.eval([1, 2])
    full.eval([1, 2, 3, 4])
    with pytest.raises(ValueError, match="full"):
        fast.decode_batch([ok, full], [5, 6])
    assert ok.n_past == 2 and full.n_past == 4
    # The cache of the sequence that had room was not written either: its next step is
    # the same as a fresh context's with the same history.
    ref = fast.context(n_ctx=8)
    ref.eval([1, 2])
    np.testing.assert_array_equal(fast.decode_batch([ok], [5])[0], ref.eval([5]))


def test_bad_batches(fast, default_model):
    a, b = fast.context(), fast.context()
    with pytest.raises(ValueError, match="vocabulary"):
        fast.decode_batch([a, b], [1, fast.n_vocab])
    with pytest.raises(ValueError, match="one per context"):
        fast.decode_batch([a, b], [1])
    with pytest.raises(ValueError, match="at least one"):
        fast.decode_batch([], [])
    with pytest.raises(ValueError, match="also context"):
        fast.decode_batch([a, a], [1, 2])
    other = Model.load(default_model, n_ctx=16)
    with pytest.raises(ValueError, match="not a context of this model"):
        fast.decode_batch([a, other.context()], [1, 2])
    assert a.n_past == 0 and b.n_past == 0


def test_native_batch_capacity_and_checks(fast, default_model):
    batch = _C.Batch(fast._native, 2)
    assert batch.n_seq == 2
    cs = [fast.context() for _ in range(3)]
    logits = np.empty((3, fast.n_vocab), np.float32)
    with pytest.raises(ValueError, match="1 to n_seq"):
        batch.decode([c._ctx for c in cs], np.array([1, 2, 3], np.int32), logits, "fast", 1)
    other = Model.load(default_model, n_ctx=16)
    with pytest.raises(ValueError, match="another model"):
        batch.decode([cs[0]._ctx, other.context()._ctx], np.array([1, 2], np.int32), logits[:2], "fast", 1)
    with pytest.raises(ValueError, match="logits"):
        batch.decode([cs[0]._ctx], np.array([1], np.int32), logits[:2], "fast", 1)
    with pytest.raises(ValueError, match="n_seq must be"):
        _C.Batch(fast._native, 0)
    assert all(c.n_past == 0 for c in cs)


def test_batch_threads_give_the_same_bits(default_model):
    one = Model.load(default_model, n_ctx=32, n_threads=1)
    two = Model.load(default_model, n_ctx=32, n_threads=2)
    x = one.decode_batch(contexts(one, PROMPTS), [3, 4, 5, 6, 7])
    y = two.decode_batch(contexts(two, PROMPTS), [3, 4, 5, 6, 7])
    np.testing.assert_array_equal(x, y)
