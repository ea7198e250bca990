"""Embeddings: the final hidden states the C++ forward pass hands out are what its output head
reads (hidden @ output^T gives its logits), pooled and normalized as asked, the same one text at
a time or many evaluated together in batched forward passes, and served by
Llama.create_embedding and the server's /v1/embeddings."""

from __future__ import annotations

import numpy as np
import pytest

from pyinfer import Model, reference
from pyinfer.errors import ContextOverflowError

TEXTS = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell sharply today."]


@pytest.fixture(scope="module")
def exact(default_model):
    return Model.load(default_model, n_ctx=128, precision="exact")


def test_hidden_states_are_what_the_output_head_reads(exact):
    ids = exact.tokenize("The capital of France is Paris, and the capital of Spain is Madrid.")
    hidden = exact.context().hidden(ids)
    logits = exact.context().eval(ids, all_logits=True)
    w = reference.load_model(exact.reader)["weights"]["output.weight"].astype(np.float64)
    np.testing.assert_allclose(hidden.astype(np.float64) @ w.T, logits, rtol=0, atol=2e-3)
    assert hidden.shape == (len(ids), exact.config.n_embd) and np.isfinite(hidden).all()


def test_pooling_and_normalization(exact):
    ids = exact.tokenize(TEXTS[0])
    h = exact.context().hidden(ids).astype(np.float64)
    np.testing.assert_allclose(exact.embed(TEXTS[0], normalize=False), h.mean(axis=0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(exact.embed(TEXTS[0], pooling="last", normalize=False), h[-1], atol=1e-6)
    np.testing.assert_allclose(exact.embed(TEXTS[0], pooling="cls", normalize=False), h[0], atol=1e-6)
    e = exact.embed(TEXTS)
    assert e.shape == (3, exact.config.n_embd)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(e[1], exact.embed(TEXTS[1]))  # alone or among others
    sims = e @ e.T
    assert sims[0, 1] > sims[0, 2] and sims[0, 1] > sims[1, 2]  # the two cat sentences are closest
    np.testing.assert_array_equal(exact.embed([exact.tokenize(TEXTS[2])])[0], e[2])  # ids as input


@pytest.fixture(scope="module")
def fast(default_model):
    return Model.load(default_model, n_ctx=128, precision="fast")


LONG = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest. " * 3


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_texts_are_embedded_together_as_they_are_alone(fast, exact, precision, monkeypatch):
    from pyinfer.model import Batch

    m = fast if precision == "fast" else exact
    texts = [*TEXTS, LONG, "Hi"]
    alone = np.stack([m.embed(t) for t in texts])
    passes = []
    real = Batch.embed

    def counted(self, contexts, tokens):
        passes.append([len(t) for t in tokens])
        return real(self, contexts, tokens)

    monkeypatch.setattr(Batch, "embed", counted)
    together = m.embed(texts)
    assert len(passes) == 1 and len(passes[0]) == len(texts)  # one forward pass for all five
    passes.clear()
    # 16 rows a pass: the long text (58 tokens) is continued over passes, beside the others.
    small = m.embed(texts, n_rows=16)
    assert len(passes) > 4 and all(sum(p) <= 16 for p in passes)
    if precision == "fast":
        # The same bits: the batched pass computes each row as the text's own pass does.
        np.testing.assert_array_equal(together, alone)
        np.testing.assert_array_equal(small, alone)
    else:
        # Float rounding only (the exact kernels block over rows): well under 1e-5 of a unit vector.
        np.testing.assert_allclose(together, alone, rtol=0, atol=1e-5)
        np.testing.assert_allclose(small, alone, rtol=0, atol=1e-5)


def test_batch_embed_gives_each_contexts_hidden_states(fast):
    from pyinfer.model import Batch

    ids = [fast.tokenize(t) for t in TEXTS]
    rows = Batch(fast, 64).embed([fast.context(n_ctx=len(t)) for t in ids], ids)
    assert rows.shape == (sum(map(len, ids)), fast.config.n_embd)
    np.testing.assert_array_equal(rows, np.concatenate([fast.context().hidden(t) for t in ids]))
    with pytest.raises(ValueError, match="more than n_rows = 4"):
        Batch(fast, 4).embed([fast.context(), fast.context()], ids[:2])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Batch(fast, 64).embed([fast.context()], [[fast.n_vocab]])


def test_bad_embedding_requests(exact):
    with pytest.raises(ValueError, match="pooling must be one of"):
        exact.embed("x", pooling="max")
    with pytest.raises(ValueError, match="at least one text"):
        exact.embed([])
    with pytest.raises(ContextOverflowError, match="more than n_ctx = 128"):
        exact.embed("word " * 400)
    assert exact.embed("still fine").shape == (exact.config.n_embd,)


def test_llama_embeddings(default_model):
    from pyinfer import Llama

    llm = Llama(model_path=str(default_model), n_ctx=128, embedding=True, verbose=False)
    out = llm.create_embedding(TEXTS[:2])
    assert out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1]
    v = np.array(out["data"][0]["embedding"])
    assert v.shape == (llm.model.config.n_embd,) and abs(np.linalg.norm(v) - 1) < 1e-5
    assert out["usage"]["prompt_tokens"] == sum(len(llm.model.tokenize(t)) for t in TEXTS[:2])
    raw = llm.embed(TEXTS[0])
    np.testing.assert_allclose(np.array(raw) / np.linalg.norm(raw), v, atol=1e-6)
    assert len(llm.embed(TEXTS)) == 3
