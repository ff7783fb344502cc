"""Inference conventions (METRICS.md §8): p-value formula, BH/Holm against statsmodels, correlations."""

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from attnbase.errors import StatsError
from attnbase.stats.inference import (
    adjust_p_values,
    bootstrap_ci,
    empirical_p_value,
    pearson,
    spearman,
)


def test_p_value_formula_by_hand():
    null = np.array([0.1, 0.5, 0.7, 0.3, 0.5])
    assert float(empirical_p_value(0.5, null)) == pytest.approx((1 + 3) / (1 + 5))  # ties count
    assert float(empirical_p_value(0.9, null)) == pytest.approx(1 / 6)  # never 0
    assert float(empirical_p_value(0.0, null)) == pytest.approx(1.0)


def test_p_value_vectorised_over_heads(rng):
    stat = rng.standard_normal((3, 4))
    null = rng.standard_normal((20, 3, 4))
    p = empirical_p_value(stat, null)
    assert p.shape == (3, 4)
    for idx in np.ndindex(3, 4):
        expect = (1 + (null[(slice(None),) + idx] >= stat[idx]).sum()) / 21
        assert p[idx] == pytest.approx(expect)


def test_p_value_nan_statistic_and_bad_shapes():
    assert np.isnan(empirical_p_value(np.nan, [1.0, 2.0]))
    with pytest.raises(StatsError, match="draws"):
        empirical_p_value(np.ones(3), np.ones((5, 4)))


@pytest.mark.parametrize("method, sm", [("bh", "fdr_bh"), ("holm", "holm")])
def test_adjustment_matches_statsmodels(method, sm, rng):
    p = rng.uniform(size=50) ** 3
    np.testing.assert_allclose(adjust_p_values(p, method), multipletests(p, method=sm)[1])


def test_bh_by_hand_and_nan_passthrough():
    p = np.array([0.01, np.nan, 0.04, 0.03, 0.2])
    q = adjust_p_values(p)
    # sorted 0.01, 0.03, 0.04, 0.2 (m = 4): 0.04, 0.04*4/3 -> min(0.0533, 0.0533), ...
    np.testing.assert_allclose(q[[0, 2, 3, 4]], [0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.2])
    assert np.isnan(q[1])
    with pytest.raises(StatsError, match="bh"):
        adjust_p_values(p, "bonferroni-ish")


def test_correlations_match_scipy(rng):
    x = rng.standard_normal(72)
    y = 0.5 * x + rng.standard_normal(72)
    r = pearson(x, y)
    ref = sps.pearsonr(x, y)
    assert r.r == pytest.approx(ref.statistic) and r.p_value == pytest.approx(ref.pvalue)
    s = spearman(x, y)
    ref = sps.spearmanr(x, y)
    assert s.r == pytest.approx(ref.statistic) and s.p_value == pytest.approx(ref.pvalue)


def test_correlation_undefined_is_nan():
    assert np.isnan(pearson([1, 1, 1, 1], [1, 2, 3, 4]).r)
    assert np.isnan(pearson([1, 2], [1, 2]).r)
    assert pearson([1, 2, np.nan, 4, 5], [2, 4, 100, 8, 10]).r == pytest.approx(1.0)


def test_bootstrap_ci_contains_r_and_is_seeded(rng):
    x = rng.standard_normal(60)
    y = 0.6 * x + rng.standard_normal(60)
    lo, hi = bootstrap_ci(x, y, seed=1, n_resamples=500)
    assert lo < pearson(x, y).r < hi
    assert (lo, hi) == bootstrap_ci(x, y, seed=1, n_resamples=500)
    lo_s, hi_s = bootstrap_ci(x, y, statistic="spearman", seed=1, n_resamples=500)
    assert lo_s < spearman(x, y).r < hi_s
    assert np.isnan(bootstrap_ci([1, 1, 1], [1, 2, 3])[0])
