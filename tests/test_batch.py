"""Batched steps (Model.decode_batch, Batch.step): each sequence's row equals its own
evaluation alone, at different positions, with decode rows and prompt chunks mixed in one
step; a copied prefix (Context.copy_prefix) is the cache evaluating it would have made; bad
batches fail before any context changes."""

from __future__ import annotations

import numpy as np
import pytest

from pyinfer import _C
from pyinfer.model import Batch, Model

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
    assert batch.n_rows == 2
    cs = [fast.context() for _ in range(3)]
    logits = np.empty((3, fast.n_vocab), np.float32)
    ones = np.ones(3, np.int64)
    with pytest.raises(ValueError, match="1 to n_rows \\(2\\) sequences"):
        batch.step([c._ctx for c in cs], np.array([1, 2, 3], np.int32), ones, logits, "fast", 1)
    with pytest.raises(ValueError, match="needs >= 1"):
        batch.step([cs[0]._ctx], np.array([], np.int32), np.zeros(1, np.int64), logits[:1], "fast", 1)
    with pytest.raises(ValueError, match="sum"):
        batch.step([cs[0]._ctx], np.array([1], np.int32), np.array([2], np.int64), logits[:1], "fast", 1)
    other = Model.load(default_model, n_ctx=16)
    with pytest.raises(ValueError, match="another model"):
        batch.step([cs[0]._ctx, other.context()._ctx], np.array([1, 2], np.int32), ones[:2], logits[:2], "fast", 1)
    with pytest.raises(ValueError, match="logits"):
        batch.step([cs[0]._ctx], np.array([1], np.int32), ones[:1], logits[:2], "fast", 1)
    with pytest.raises(ValueError, match="n_rows must be"):
        _C.Batch(fast._native, 0)
    assert all(c.n_past == 0 for c in cs)


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_mixed_step_rows_equal_each_sequence_alone(default_model, precision):
    """Decode rows and prompt chunks of different lengths in one forward pass: each row is its
    sequence's own evaluation (bit for bit on the fast path; float rounding on the exact)."""
    model = Model.load(default_model, precision=precision, n_ctx=64)
    batch = Batch(model, 24)
    mixed, alone = contexts(model, PROMPTS), contexts(model, PROMPTS)
    tokens = [[7], [300, 301, 302, 303, 304, 305, 306, 307, 308], [11], [4000, 4001, 17], [90]]
    got = batch.step(mixed, tokens)
    want = np.stack([c.eval(t) for c, t in zip(alone, tokens)])
    if precision == "fast":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
    assert [c.n_past for c in mixed] == [c.n_past for c in alone]
    # The caches match too: the next single steps agree.
    for a, b in zip(mixed, alone):
        np.testing.assert_allclose(a.eval([5]), b.eval([5]), rtol=0, atol=0 if precision == "fast" else 1e-3)
    with pytest.raises(ValueError, match="more than n_rows"):
        batch.step(mixed[:2], [[1] * 20, [2] * 5])
    with pytest.raises(ValueError, match="tokens\\[1\\] must be a non-empty"):
        batch.step(mixed[:2], [[1], []])


@pytest.mark.parametrize("kv_dtype", ["float32", "float16", "q8_0"])
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 40])
def test_copied_prefix_is_the_evaluated_one(default_model, kv_dtype, n):
    """A context holding a copy of another's first n positions continues exactly as one that
    evaluated them itself, whatever the source holds past n (a source with a complete key
    block at n, or a partial one) and whatever the sizes of the two contexts."""
    model = Model.load(default_model, precision="fast", n_ctx=64, kv_dtype=kv_dtype)
    rng = np.random.default_rng(n)
    ids = rng.integers(1, model.n_vocab, 48).tolist()
    src = model.context()
    src.eval(ids)
    dst = model.context(n_ctx=48)
    dst.eval([5, 6, 7])  # stale contents, dropped by the copy
    dst.copy_prefix(src, n)
    assert dst.n_past == n
    fresh = model.context(n_ctx=48)
    rest = ids[n:n + 5] if n < len(ids) else [3]
    if n:
        fresh.eval(ids[:n])
    np.testing.assert_array_equal(dst.eval(rest, all_logits=True), fresh.eval(rest, all_logits=True))
    # A copy from itself is a truncation.
    src.copy_prefix(src, n)
    assert src.n_past == n


def test_copy_prefix_refuses_what_does_not_fit(fast, default_model):
    src, dst = fast.context(), fast.context(n_ctx=8)
    src.eval(list(range(1, 11)))
    with pytest.raises(ValueError, match="the source holds 10"):
        dst.copy_prefix(src, 11)
    with pytest.raises(ValueError, match="room for 8"):
        dst.copy_prefix(src, 9)
    with pytest.raises(ValueError, match=r"n must be an integer in \[0, 2147483647\], got -1"):
        dst.copy_prefix(src, -1)
    with pytest.raises(ValueError, match="same model"):
        dst.copy_prefix(Model.load(default_model, n_ctx=16).context(), 1)
    assert dst.n_past == 0 and src.n_past == 10


def test_batch_threads_give_the_same_bits(default_model):
    one = Model.load(default_model, n_ctx=32, n_threads=1)
    two = Model.load(default_model, n_ctx=32, n_threads=2)
    x = one.decode_batch(contexts(one, PROMPTS), [3, 4, 5, 6, 7])
    y = two.decode_batch(contexts(two, PROMPTS), [3, 4, 5, 6, 7])
    np.testing.assert_array_equal(x, y)


def test_a_step_returns_the_rows_a_sequence_asks_for(fast):
    """logit_rows: a sequence verifying guessed tokens gets the row after each of its last k
    tokens, what its own eval(all_logits=True) gives, beside sequences that get one row."""
    toks = [[7, 300, 11, 4000], [90], [5, 6, 7]]
    want = [c.eval(t, all_logits=True).copy() for c, t in zip(contexts(fast, PROMPTS[:3]), toks)]
    batch = Batch(fast, 16)
    cs = contexts(fast, PROMPTS[:3])
    got = batch.step(cs, toks, logit_rows=[4, 1, 2])
    assert got.shape == (7, fast.n_vocab)
    np.testing.assert_array_equal(got[:4], want[0])
    np.testing.assert_array_equal(got[4], want[1][0])
    np.testing.assert_array_equal(got[5:], want[2][1:])
    assert [c.n_past for c in cs] == [len(p) + len(t) for p, t in zip(PROMPTS[:3], toks)]
    fresh = contexts(fast, PROMPTS[:2])
    for bad, match in (([0, 1], r"logit_rows\[0\] must be an int from 1 to 4"),
                       ([1, 2], r"logit_rows\[1\] must be an int from 1 to 1"),
                       ([1], "one per context"), ([True, 1], r"logit_rows\[0\]")):
        with pytest.raises(ValueError, match=match):
            batch.step(fresh, toks[:2], logit_rows=bad)
    with pytest.raises(ValueError, match=r"asks for the logits of 5 tokens: 1 to its 4"):
        native = _C.Batch(fast._native, 8)
        native.step([c._ctx for c in fresh], np.array(toks[0] + toks[1], np.int32), np.array([4, 1], np.int64),
                    np.empty((6, fast.n_vocab), np.float32), "fast", 1, np.array([5, 1], np.int64))
    with pytest.raises(ValueError, match="n_logits must be"):
        native.step([c._ctx for c in fresh], np.array(toks[0] + toks[1], np.int32), np.array([4, 1], np.int64),
                    np.empty((5, fast.n_vocab), np.float32), "fast", 1, np.array([4], np.int64))
    assert [c.n_past for c in fresh] == [len(p) for p in PROMPTS[:2]]  # refused: nothing changed
