"""Sampling: parameter checks, each filter on a known distribution, penalties and bias on a
crafted history, seeded reproducibility, draw frequencies against the filtered
distribution, model log-probabilities, and the time per token on a full vocabulary."""

from __future__ import annotations

import ast
import inspect
import math
import time
from pathlib import Path

import numpy as np
import pytest

import pyinfer
from pyinfer import _sampling
from pyinfer.errors import ParameterTypeError
from pyinfer.sampling import Sampler, SamplingParams, log_softmax, logsumexp

N_VOCAB = 49152

# probabilities that are exact in binary, so cut-offs can sit exactly on them
P5 = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
L5 = np.log(P5).astype(np.float32)


def sampler(n_vocab: int = len(P5), **kw) -> Sampler:
    """A sampler with every filter off unless asked for."""
    base = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}
    return Sampler(SamplingParams(**{**base, **kw}), n_vocab)


def kept(logits: np.ndarray, **kw) -> set[int]:
    ids, _ = sampler(len(logits), **kw).candidates(logits)
    return set(ids.tolist())


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def chi2_bound(df: int, z: float = 3.09) -> float:
    """The 0.999 quantile of chi-square with df degrees of freedom (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


# ---- parameters


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.1}, "top_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"repeat_penalty": -1.0}, "repeat_penalty"),
        ({"presence_penalty": math.inf}, "presence_penalty"),
        ({"frequency_penalty": math.nan}, "frequency_penalty"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"logit_bias": {-1: 1.0}}, "negative"),
        ({"logit_bias": {3: math.inf}}, r"\+inf"),
        ({"logit_bias": {3: math.nan}}, "NaN"),
        ({"logit_bias": {3: 1e308}}, r"^logit_bias\[3\] = 1e\+308 is out of range.*1e\+30"),
        ({"logit_bias": {7: -1e31}}, r"^logit_bias\[7\] = -1e\+31 is out of range"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"logprobs": -1}, "logprobs"),
    ],
)
def test_out_of_range_parameters_raise_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


@pytest.mark.parametrize(
    "name, value, lo, hi",
    [
        ("top_k", 2**70, 0, 2**31 - 1),
        ("top_k", 2**31, 0, 2**31 - 1),
        ("repeat_last_n", 2**63, -1, 2**31 - 1),
        ("repeat_last_n", -(2**70), -1, 2**31 - 1),
        ("seed", 2**70, 0, 2**64 - 1),
        ("logprobs", 2**40, 0, 2**31 - 1),
    ],
)
def test_ints_out_of_range_name_the_parameter_the_value_and_the_range(name, value, lo, hi):
    with pytest.raises(ValueError, match=rf"^{name} must be in \[{lo}, {hi}\].*, got {value}$"):
        SamplingParams(**{name: value})
    SamplingParams(**{name: hi})  # the bound itself is allowed


def test_a_huge_logit_bias_id_is_refused():
    with pytest.raises(ValueError, match=rf"logit_bias token id {2**40} is too large.*2147483647"):
        SamplingParams(logit_bias={2**40: 1.0})


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": "0.5"},
        {"temperature": True},
        {"top_k": 2.0},
        {"top_k": None},
        {"top_p": "high"},
        {"repeat_last_n": 1.5},
        {"logit_bias": [(1, 2.0)]},
        {"logit_bias": {"12": 1.0}},
        {"logit_bias": {1: "x"}},
        {"seed": 1.0},
        {"logprobs": True},
    ],
)
def test_wrong_types_raise_a_type_error_that_is_also_a_value_error(kw):
    with pytest.raises(ParameterTypeError) as e:
        SamplingParams(**kw)
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)
    assert next(iter(kw)).split("_")[0] in str(e.value)


def test_parameters_are_normalized_and_frozen():
    p = SamplingParams(temperature=1, top_k=np.int64(5), logit_bias={np.int32(3): -1})
    assert type(p.temperature) is float and type(p.top_k) is int
    assert dict(p.logit_bias) == {3: -1.0} and type(next(iter(p.logit_bias))) is int
    with pytest.raises(AttributeError):
        p.temperature = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.logit_bias[4] = 1.0  # type: ignore[index]


def test_sampler_checks_against_the_vocabulary():
    with pytest.raises(ValueError, match="out of range"):
        Sampler(SamplingParams(logit_bias={10: 1.0}), 10)
    with pytest.raises(ValueError, match="logprobs"):
        Sampler(SamplingParams(logprobs=11), 10)
    s = Sampler(SamplingParams(), 10)
    with pytest.raises(ValueError, match="shape"):
        s.sample(np.zeros(11, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        s.sample(np.array([0, 1, np.nan, 0, 0, 0, 0, 0, 0, 0], np.float32))
    with pytest.raises(ValueError, match="out of range"):
        sampler(10, repeat_penalty=1.1).adjusted(np.zeros(10, np.float32), [3, 10])
    with pytest.raises(ParameterTypeError):
        s.sample([0.0] * 10)  # type: ignore[arg-type]


def test_other_float_layouts_are_accepted():
    x = np.linspace(0, 1, 20)[::2]  # float64, not contiguous
    assert sampler(10, temperature=0).sample(x) == 9


# ---- greedy and temperature


def test_greedy_is_the_argmax_and_the_lowest_id_on_ties():
    x = np.array([1.0, 3.0, 2.0, 3.0], np.float32)
    assert sampler(4, temperature=0).sample(x) == 1
    ids, probs = sampler(4, temperature=0).candidates(x)
    assert ids.tolist() == [1] and probs.tolist() == [1.0]


def test_top_k_1_is_greedy_at_any_temperature():
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = rng.normal(size=300).astype(np.float32)
        s = sampler(300, top_k=1, temperature=5.0, seed=int(rng.integers(1 << 30)))
        assert s.sample(x) == int(np.argmax(x))


def test_temperature_scales_the_distribution():
    for t in (0.25, 0.5, 1.0, 2.0, 7.0):
        ids, probs = sampler(temperature=t).candidates(L5)
        assert ids.tolist() == list(range(5))
        np.testing.assert_allclose(probs, softmax(L5 / t), rtol=1e-6)


def test_temperature_to_zero_becomes_greedy():
    x = np.array([0.0, 0.5, 0.45, -1.0], np.float32)
    ids, probs = sampler(4, temperature=1e-3).candidates(x)
    p = dict(zip(ids.tolist(), probs))
    assert p[1] == 1.0 and max(v for i, v in p.items() if i != 1) < 1e-20
    s = sampler(4, temperature=1e-3, seed=5)
    assert {s.sample(x) for _ in range(500)} == {1}


@pytest.mark.parametrize("t", [1e-38, 1e-39, 1e-45, 1e-300])
def test_a_temperature_whose_inverse_overflows_float32_is_still_the_limit(t):
    """Below about 2.9e-39, 1 / temperature is past float32's range: the best token's weight
    was NaN, and the draw fell on any token. The limit is the argmax, ties drawn alike."""
    x = np.array([0.0, 0.5, 0.45, -1.0, 0.5 - 2**-23], np.float32)
    ids, probs = sampler(5, temperature=t).candidates(x)
    p = dict(zip(ids.tolist(), probs.tolist()))
    assert p[1] == 1.0 and max(v for i, v in p.items() if i != 1) < 1e-30
    s = sampler(5, temperature=t, seed=5)
    assert {s.sample(x) for _ in range(200)} == {1}
    tied = np.array([0.5, -2.0, 0.5], np.float32)
    s = sampler(3, temperature=t, seed=6)
    assert {s.sample(tied) for _ in range(200)} == {0, 2}


# ---- filters on a known distribution


def test_top_k_keeps_the_k_best_with_lower_ids_first_on_ties():
    x = np.array([0.0, 2.0, 1.0, 2.0, 1.0, -1.0], np.float32)
    assert kept(x, top_k=1) == {1}
    assert kept(x, top_k=2) == {1, 3}
    assert kept(x, top_k=3) == {1, 2, 3}  # 2 and 4 tie: the lower id stays
    assert kept(x, top_k=6) == kept(x, top_k=0) == set(range(6))
    _ids, probs = sampler(6, top_k=2).candidates(x)
    np.testing.assert_allclose(probs, [0.5, 0.5])


@pytest.mark.parametrize("top_k", [0, 5])  # the whole-row and the top-k code paths
def test_top_p_cuts_exactly_at_the_boundary(top_k):
    # cumulative: 0.5, 0.75, 0.875, 0.9375, 1
    assert kept(L5, top_k=top_k, top_p=0.0) == {0}
    assert kept(L5, top_k=top_k, top_p=0.5) == {0}
    assert kept(L5, top_k=top_k, top_p=0.5001) == {0, 1}
    assert kept(L5, top_k=top_k, top_p=0.75) == {0, 1}
    assert kept(L5, top_k=top_k, top_p=0.7501) == {0, 1, 2}
    assert kept(L5, top_k=top_k, top_p=0.875) == {0, 1, 2}
    assert kept(L5, top_k=top_k, top_p=0.9375) == {0, 1, 2, 3}
    assert kept(L5, top_k=top_k, top_p=0.94) == set(range(5))
    _ids, probs = sampler(top_k=top_k, top_p=0.75).candidates(L5)
    np.testing.assert_allclose(probs, [2 / 3, 1 / 3], rtol=1e-6)


def test_top_p_is_relative_to_what_top_k_kept():
    # top-2 renormalized is (2/3, 1/3): 0.6 needs only the first; over all five, two
    assert kept(L5, top_k=2, top_p=0.6) == {0}
    assert kept(L5, top_p=0.6) == {0, 1}


def test_top_p_sees_the_tempered_distribution():
    # T = 0.5 squares the probabilities: normalized 0.744, 0.186, 0.047, 0.012, 0.012
    assert kept(L5, temperature=0.5, top_p=0.74) == {0}
    assert kept(L5, temperature=1.0, top_p=0.74) == {0, 1}
    assert kept(L5, temperature=0.5, top_p=0.9) == {0, 1}
    assert kept(L5, temperature=1.0, top_p=0.9) == {0, 1, 2, 3}


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.99)])  # each code path
def test_min_p_is_relative_to_the_most_likely_token(top_k, top_p):
    kw = {"top_k": top_k, "top_p": top_p}
    assert kept(L5, min_p=1.0, **kw) == {0}
    assert kept(L5, min_p=0.5001, **kw) == {0}
    assert kept(L5, min_p=0.5, **kw) == {0, 1}  # 0.25 / 0.5: exactly on the cut-off
    assert kept(L5, min_p=0.25, **kw) == {0, 1, 2}
    assert kept(L5, min_p=0.125, **kw) == set(range(5))
    # the ratio is taken after temperature: at T = 2 it is the square root
    assert kept(L5, min_p=0.5, temperature=2.0, **kw) == {0, 1, 2}


def test_min_p_after_top_p_keeps_the_shorter_cut():
    assert kept(L5, top_p=0.9375, min_p=0.25) == {0, 1, 2}
    assert kept(L5, top_p=0.75, min_p=0.125) == {0, 1}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "t, top_k, top_p, min_p",
    [
        (1.0, 0, 0.9, 0.0),  # a nucleus of thousands: the binned search
        (2.5, 0, 0.5, 0.0),
        (1.0, 0, 0.95, 0.02),
        (0.8, 40, 0.95, 0.05),  # llama.cpp's defaults
        (0.7, 0, 1.0, 0.05),
        (1.3, 1000, 0.8, 0.0),
        (1.0, 0, 1.0, 0.0),
    ],
)
def test_filters_on_a_full_vocabulary_match_a_sorting_reference(seed, t, top_k, top_p, min_p):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(N_VOCAB) * 2.0).astype(np.float32)
    x[rng.integers(0, N_VOCAB, 50)] += 6.0  # a head of likely tokens over a long tail
    x[rng.integers(0, N_VOCAB, 30)] = 1.5  # exact ties
    ids, probs = sampler(N_VOCAB, temperature=t, top_k=top_k, top_p=top_p, min_p=min_p).candidates(
        x
    )

    # reference: sort everything (ties by id), then cut as documented
    order = np.lexsort((np.arange(N_VOCAB), -x))
    if top_k:
        order = order[:top_k]
    d = (x[order].astype(np.float64) - x.max()) / t
    p = np.exp(d) / np.exp(d).sum()
    n = len(order)
    if top_p < 1:
        n = int(np.searchsorted(np.cumsum(p), top_p * (1 - 1e-6)) + 1)
    if min_p > 0:
        n = min(n, int(np.sum(d >= math.log(min_p) - 1e-6)))
    ref = order[:n]
    assert set(ids.tolist()) == set(ref.tolist())
    got = dict(zip(ids.tolist(), probs))
    np.testing.assert_allclose([got[i] for i in ref], p[:n] / p[:n].sum(), rtol=1e-5)


# ---- penalties and bias


def test_repeat_presence_and_frequency_penalties_follow_llama_cpp():
    x = np.array([2.0, -2.0, 1.0, 0.5, 0.0, 3.0], np.float32)
    history = [0, 1, 1, 3, 4]
    s = sampler(6, repeat_penalty=2.0, presence_penalty=0.3, frequency_penalty=0.1)
    y = s.adjusted(x, history)
    # positive logits divided, negative (and zero) multiplied, then count * f + presence
    expect = [2.0 / 2 - 0.4, -2.0 * 2 - 0.5, 1.0, 0.5 / 2 - 0.4, 0.0 - 0.4, 3.0]
    np.testing.assert_allclose(y, expect, rtol=1e-6)
    assert np.array_equal(s._counts, np.zeros(6, np.int32))  # scratch left clean
    np.testing.assert_array_equal(s.adjusted(x, history), y)  # and the input untouched


def test_repeat_last_n_limits_the_window():
    x = np.array([2.0, 2.0, 2.0, 2.0], np.float32)
    history = [0, 1, 2]
    y = sampler(4, repeat_penalty=2.0, repeat_last_n=2).adjusted(x, history)
    np.testing.assert_array_equal(y, [2.0, 1.0, 1.0, 2.0])
    y = sampler(4, repeat_penalty=2.0, repeat_last_n=-1).adjusted(x, history)
    np.testing.assert_array_equal(y, [1.0, 1.0, 1.0, 2.0])
    y = sampler(4, repeat_penalty=2.0, repeat_last_n=0).adjusted(x, history)
    np.testing.assert_array_equal(y, x)
    y = sampler(4, repeat_penalty=2.0).adjusted(x, np.array(history, np.int64))
    np.testing.assert_array_equal(y, [1.0, 1.0, 1.0, 2.0])


@pytest.mark.parametrize("kw", [{"repeat_penalty": 1e-300}, {"repeat_penalty": 1e300},
                                {"frequency_penalty": -1e308}, {"frequency_penalty": 1e308},
                                {"presence_penalty": 1e308, "frequency_penalty": -1e308}])
def test_extreme_penalties_keep_logits_finite(kw):
    """Any finite penalty is defined: a penalized logit past float32's range becomes its largest
    finite value of that sign (in float32 a tiny repeat_penalty was 0 and a huge frequency
    penalty inf, so the row turned into inf and NaN); an inf or NaN logit is left as it was."""
    x = np.array([2.0, -2.0, 1.0, 0.5, 0.0, 3.0], np.float32)
    history = [0, 1, 1, 3, 4]
    y = sampler(6, **kw).adjusted(x, history)
    assert np.isfinite(y).all()
    assert np.array_equal(y[[2, 5]], x[[2, 5]])  # not in the history
    big = float(np.finfo(np.float32).max)
    if kw == {"repeat_penalty": 1e-300}:
        assert y[0] == y[3] == big and -1e-30 < y[1] <= 0.0 and y[4] == 0.0
    if kw == {"frequency_penalty": -1e308}:
        assert (y[[0, 1, 3, 4]] == big).all()
    assert sampler(6, temperature=0, **kw).sample(x, history) in range(6)
    assert sampler(6, temperature=0.7, seed=1, **kw).sample(x, history) in range(6)
    z = np.array([np.inf, -np.inf, np.nan, 1.0, 0.0, 3.0], np.float32)
    w = sampler(6, **kw).adjusted(z, [0, 1, 2, 3])
    assert w[0] == np.inf and w[1] == -np.inf and np.isnan(w[2]) and np.isfinite(w[3])


def test_penalties_change_the_greedy_choice():
    x = np.array([1.0, 0.9, 0.0], np.float32)
    assert sampler(3, temperature=0).sample(x, [0]) == 0
    assert sampler(3, temperature=0, repeat_penalty=1.2).sample(x, [0]) == 1
    assert sampler(3, temperature=0, presence_penalty=0.2).sample(x, [0]) == 1


def test_logit_bias_bans_and_promotes():
    x = np.array([5.0, 4.0, 3.0], np.float32)
    assert sampler(3, temperature=0, logit_bias={0: -math.inf}).sample(x) == 1
    assert sampler(3, temperature=0, logit_bias={2: 2.5}).sample(x) == 2
    s = sampler(3, logit_bias={0: -math.inf, 1: -math.inf}, seed=3)
    assert {s.sample(x) for _ in range(200)} == {2}
    ids, probs = s.candidates(x)
    assert ids.tolist() == [2] and probs.tolist() == [1.0]
    with pytest.raises(ValueError, match="banned"):
        sampler(3, logit_bias={0: -math.inf, 1: -math.inf, 2: -math.inf}).sample(x)


@pytest.mark.parametrize("t", [0.0, 1e-30, 1.0, 100.0])
def test_the_largest_bias_allowed_forces_or_suppresses_a_token_without_overflow(t):
    row = np.linspace(-5, 5, 100).astype(np.float32)
    force = Sampler(SamplingParams(temperature=t, top_k=0, top_p=1, min_p=0, logit_bias={3: 1e30}, seed=1), 100)
    assert [force.sample(row) for _ in range(20)] == [3] * 20
    sup = Sampler(SamplingParams(temperature=t, top_k=0, top_p=1, min_p=0, logit_bias={99: -1e30}, seed=1), 100)
    assert 99 not in [sup.sample(row) for _ in range(50)]


def test_a_banned_token_is_never_drawn_from_the_whole_vocabulary():
    x = np.zeros(1000, np.float32)
    banned = {i: -math.inf for i in range(0, 1000, 2)}
    s = sampler(1000, logit_bias=banned, seed=11)
    assert all(s.sample(x) % 2 == 1 for _ in range(2000))


# ---- the draw


def test_same_seed_same_tokens_and_different_seed_different_tokens():
    rng = np.random.default_rng(7)
    rows = rng.normal(size=(200, 500)).astype(np.float32)

    def run(seed):
        s = sampler(500, temperature=1.2, top_k=50, top_p=0.95, seed=seed)
        return [s.sample(r) for r in rows]

    assert run(123) == run(123)
    assert run(123) != run(124)


def test_seed_none_draws_a_fresh_seed_that_reproduces_the_run():
    rows = np.random.default_rng(8).normal(size=(100, 300)).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a, b = Sampler(params, 300), Sampler(params, 300)
    assert a.seed != b.seed
    first = [a.sample(r) for r in rows]
    again = Sampler(
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=a.seed), 300
    )
    assert [again.sample(r) for r in rows] == first


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"temperature": 0.6},
        {"temperature": 1.5, "top_k": 4},
        {"top_p": 0.8},
        {"min_p": 0.1, "temperature": 1.3},
        {"top_k": 8, "top_p": 0.9, "min_p": 0.05, "temperature": 0.9},
    ],
)
def test_draw_frequencies_match_the_filtered_distribution(kw):
    x = np.log(np.array([0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.02])).astype(np.float32)
    s = sampler(len(x), seed=2024, **kw)
    ids, probs = s.candidates(x)
    draws = 40_000
    counts = np.bincount([s.sample(x) for _ in range(draws)], minlength=len(x))
    assert counts[np.setdiff1d(np.arange(len(x)), ids)].sum() == 0  # nothing filtered out
    expected = probs * draws
    chi2 = float(np.sum((counts[ids] - expected) ** 2 / expected))
    assert chi2 < chi2_bound(len(ids) - 1) if len(ids) > 1 else counts[ids[0]] == draws


def test_draw_picks_by_cumulative_weight():
    w = np.array([1.0, 0.0, 3.0], np.float32)
    assert _sampling.draw(w, 3, 0.0) == 0
    assert _sampling.draw(w, 3, 0.2499) == 0
    assert _sampling.draw(w, 3, 0.25) == 2
    assert _sampling.draw(w, 3, 0.999999) == 2
    assert _sampling.draw(w, 2, 0.9) == 0


# ---- log-probabilities


def test_logprobs_are_the_models_log_softmax_with_the_best_alternatives():
    rng = np.random.default_rng(3)
    x = rng.normal(size=N_VOCAB).astype(np.float32) * 3
    # the sampler's own changes (penalties, temperature, filters) do not enter
    s = sampler(N_VOCAB, logprobs=5, temperature=0.3, top_k=2, repeat_penalty=1.5, seed=1)
    token = s.sample(x, [int(np.argmax(x))])
    lp = s.logprob(x, token)
    ref = np.log(softmax(x))
    assert lp.token == token and abs(lp.logprob - ref[token]) < 1e-5
    best = np.argsort(-x, kind="stable")[:5]
    assert [t for t, _ in lp.top] == best.tolist()
    np.testing.assert_allclose([v for _, v in lp.top], ref[best], atol=1e-5)
    assert s.logprob(x, token, n_top=0).top == ()


# ---- the Cython module's stub


def test_stub_matches_the_cython_module():
    tree = ast.parse(Path(pyinfer.__file__).with_name("_sampling.pyi").read_text())
    stub = {
        f.name: [a.arg for a in f.args.args] for f in tree.body if isinstance(f, ast.FunctionDef)
    }
    module = {
        name: list(inspect.signature(obj).parameters)
        for name, obj in vars(_sampling).items()
        if callable(obj) and not name.startswith("_") and not isinstance(obj, type)
    }
    assert stub == module


# ---- speed


def test_one_token_from_a_full_vocabulary_takes_well_under_a_millisecond():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(N_VOCAB) * 2.0).astype(np.float32)
    x[rng.integers(0, N_VOCAB, 40)] += 8.0
    history = rng.integers(0, N_VOCAB, 200).tolist()
    s = Sampler(SamplingParams(seed=0, repeat_penalty=1.1), N_VOCAB)  # llama.cpp's defaults
    for _ in range(20):
        s.sample(x, history)
    times = []
    for _ in range(200):
        t = time.perf_counter()
        s.sample(x, history)
        times.append(time.perf_counter() - t)
    assert float(np.median(times)) < 1e-3


# ---- the one log-softmax


@pytest.mark.parametrize("shape, axis", [((7,), -1), ((3, 50), -1), ((4, 6, 30), 1), ((5, 9), 0)])
def test_log_softmax_and_logsumexp_match_float64(shape, axis):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    x64 = x.astype(np.float64)
    m = x64.max(axis=axis, keepdims=True)
    ref = x64 - m - np.log(np.exp(x64 - m).sum(axis=axis, keepdims=True))
    got = log_softmax(x, axis)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, ref, atol=2e-6)
    lse = logsumexp(np.moveaxis(x, axis, -1))
    np.testing.assert_allclose(lse, np.moveaxis(x64 - ref, axis, -1)[..., 0], atol=1e-6)
    with pytest.raises(ValueError, match="non-empty"):
        logsumexp(np.zeros((3, 0), np.float32))
