"""Resource budgets stated up front: a context that would not fit in memory is refused before
allocating, with both figures; n_batch is capped at n_ctx; n_threads at the cores available."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from pyinfer import Model
from pyinfer.model import default_threads


@pytest.fixture(scope="module")
def model(default_model: Path) -> Model:
    return Model.load(default_model)


def test_a_context_too_large_for_memory_is_refused_with_both_figures(model: Model) -> None:
    with pytest.raises(MemoryError, match=r"n_ctx=1000000000 .* needs 46,080,0\d\d\.\d MB .* over the [\d,.]+ MB available"):
        model.context(n_ctx=10**9)
    m = Model(model.reader, memory_limit=50_000_000)
    need = m.context_nbytes(2048, 512)
    with pytest.raises(MemoryError, match=re.escape(f"{need / 1e6:,.1f} MB") + r".* over the 50\.0 MB limit"):
        m.context(n_ctx=2048)
    assert m.context(n_ctx=256).n_ctx == 256  # a smaller one fits
    # The model still answers after the refusals.
    ids = model.tokenize("The sky is")
    np.testing.assert_array_equal(m.context(n_ctx=64).eval(ids), model.context(n_ctx=64).eval(ids))


def test_context_nbytes_counts_the_kv_cache(model: Model) -> None:
    for n_ctx in (1, 100, 4096):
        ctx = model.context(n_ctx=n_ctx)
        assert ctx.kv_nbytes < model.context_nbytes(n_ctx, ctx.n_batch) <= ctx.kv_nbytes + ctx.n_batch * 65536


def test_n_batch_is_capped_at_n_ctx(model: Model) -> None:
    ctx = model.context(n_ctx=100, n_batch=10**6)
    assert ctx.n_batch == 100
    assert model.context_nbytes(100, ctx.n_batch) < 10_000_000


def test_n_threads_over_the_cores_warns_and_is_capped(model: Model) -> None:
    cores = default_threads()
    with pytest.warns(RuntimeWarning, match=f"n_threads=2000 exceeds the {cores} cores"):
        m = Model(model.reader, n_threads=2000)
    assert m.n_threads == cores
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Model(model.reader, n_threads=cores).n_threads == cores
