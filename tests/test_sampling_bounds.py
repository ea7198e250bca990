"""The Cython sampling helpers refuse out-of-range ids and short or empty buffers with a
ValueError instead of reading or writing past an array."""

from __future__ import annotations

import numpy as np
import pytest

from pyinfer import _sampling

X = np.linspace(-1, 1, 10, dtype=np.float32)
E = np.empty(0, np.float32)
I32 = np.zeros(10, np.int32)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: _sampling.exp_sum(E, 0.0, 1.0, E), "empty"),
        (lambda: _sampling.exp_sum(X, 0.0, 1.0, np.empty(3, np.float32)), "shorter"),
        (lambda: _sampling.top_ids(E, 3, I32), "non-empty row"),
        (lambda: _sampling.top_ids(X, 0, I32), "k >= 1"),
        (lambda: _sampling.top_ids(X, -5, I32), "k >= 1"),
        (lambda: _sampling.top_ids(X, 5, np.zeros(2, np.int32)), "shorter than k"),
        (lambda: _sampling.apply_penalties(X.copy(), [3, 10], I32.copy(), 1.1, 0.0, 0.0), "token id 10"),
        (lambda: _sampling.apply_penalties(X.copy(), [-1], I32.copy(), 1.1, 0.0, 0.0), "token id -1"),
        (lambda: _sampling.apply_penalties(X.copy(), [1], np.zeros(2, np.int32), 1.1, 0.0, 0.0), "counts"),
        (lambda: _sampling.apply_bias(X.copy(), np.array([2**30], np.int32), np.ones(1, np.float32)), "token id"),
        (lambda: _sampling.apply_bias(X.copy(), np.array([-3], np.int32), np.ones(1, np.float32)), "token id -3"),
        (lambda: _sampling.apply_bias(X.copy(), np.array([1, 2], np.int32), np.ones(1, np.float32)), "2 ids but 1"),
        (lambda: _sampling.filter_candidates(E, 0.0, 1.0, 0, 1.0, 0.0, I32, X.copy(), X.copy()), "empty"),
        (lambda: _sampling.draw(X, 0, 0.5), "c = 0"),
        (lambda: _sampling.draw(X, 11, 0.5), "c = 11"),
    ],
)
def test_bad_input_is_refused(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call()


def test_bias_within_range_still_applies() -> None:
    x = X.copy()
    _sampling.apply_bias(x, np.array([0, 9], np.int32), np.array([1.0, -1.0], np.float32))
    assert x[0] == X[0] + 1 and x[9] == X[9] - 1 and (x[1:9] == X[1:9]).all()
