"""Inference conventions (docs/metrics.md §8): p-value formula, BH/Holm against statsmodels, correlations."""

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


# --- null tests (docs/metrics.md §8) ------------------------------------------------------------

def test_clt_mean_test_closed_form():
    from scipy.stats import norm

    from attnbase.stats.inference import clt_mean_test

    # 3 sequences x 2 draws: per-sequence means 1, 2, 3 and variances (ddof 1) 2, 0.5, 0
    null = np.array([[0.0, 2.0], [1.5, 2.5], [3.0, 3.0]])
    t = clt_mean_test(2.5, null, draws=50, seed=0)  # one head: statistic () and null (3, 2)
    assert float(t.null_mean) == pytest.approx(2.0)
    # sqrt(sum var_s) / n, times sqrt(1 + 1/D) for the error of the estimated null mean
    sd = np.sqrt(2.5) / 3 * np.sqrt(1.5)
    assert float(t.null_sd) == pytest.approx(sd)
    assert float(t.z) == pytest.approx(0.5 / sd)
    assert float(t.p_value) == pytest.approx(norm.sf(0.5 / sd))
    assert t.p_method == "clt_normal" and t.draws == 50
    # a NaN sequence is left out of n
    t2 = clt_mean_test(2.5, np.vstack([null, [np.nan, np.nan]]), draws=50, seed=0)
    assert float(t2.null_sd) == pytest.approx(sd)


def test_clt_mean_test_is_calibrated_under_the_null():
    # 4000 "heads" of 50 sequences, each with its own null distribution; the observed value is
    # one more draw from it (exchangeable): z ~ N(0, 1), p ~ U(0, 1), empirical p too
    from scipy.stats import kstest

    from attnbase.stats.inference import clt_mean_test

    rng = np.random.default_rng(3)
    mu = rng.uniform(0.2, 0.6, (4000, 50, 1))
    sd = rng.uniform(0.01, 0.1, (4000, 50, 1))
    x = mu + sd * rng.standard_normal((4000, 50, 3))  # observed + D = 2 draws per sequence
    t = clt_mean_test(x[..., 0].mean(-1), x[..., 1:], seq_observed=x[..., 0], draws=200, seed=1)
    assert abs(t.z.mean()) < 0.05 and abs(t.z.std() - 1) < 0.05
    assert kstest(t.p_value, "uniform").pvalue > 0.01
    assert np.mean(t.p_empirical < 0.05) == pytest.approx(0.05, abs=0.012)
    # without the sqrt(1 + 1/D) term z would be too wide: sd sqrt(1.5) = 1.22
    assert np.mean(t.p_value < 0.05) == pytest.approx(0.05, abs=0.012)


def test_empirical_p_floor_is_flagged_and_clt_p_goes_below_it():
    from attnbase.stats.inference import clt_mean_test

    rng = np.random.default_rng(0)
    null = rng.normal(0.3, 0.05, (2, 256, 2))
    t = clt_mean_test([0.3, 0.5], null, draws=200, seed=0)
    assert t.p_at_floor.tolist() == [False, True]
    assert t.p_empirical[1] == pytest.approx(1 / 201)
    assert t.p_value[1] < 1e-100  # far below the floor 1/201: not bounded by the draws


def test_pooled_clt_mean_test_and_normal_fit():
    from attnbase.stats.inference import normal_fit_test, pooled_clt_mean_test

    pool = np.tile([0.2, 0.4], 500)  # mean 0.3, sd (ddof 1) 0.1 * sqrt(1000/999)
    s = 0.1 * np.sqrt(1000 / 999)
    t = pooled_clt_mean_test([0.3, 0.31, np.nan], pool, [100, 100, 0], draws=300, seed=2)
    np.testing.assert_allclose(t.null_sd[:2], s * np.sqrt(1 / 100 + 1 / 1000))
    np.testing.assert_allclose(t.z[:2], [0.0, 0.01 / (s * np.sqrt(0.011))])
    assert np.isnan(t.z[2]) and np.isnan(t.p_value[2])
    f = normal_fit_test(1.0, np.array([-1.0, 1.0, -1.0, 1.0]))
    assert float(f.null_sd) == pytest.approx(np.sqrt(4 / 3) * np.sqrt(1.25))
    assert f.p_method == "normal_fit" and f.draws == 4


def test_degenerate_null_gives_p_one_not_a_half():
    from attnbase.stats.inference import clt_mean_test

    t = clt_mean_test([1.0], np.ones((1, 5, 2)), draws=10)  # VE@k = 1 when k >= rank
    assert float(t.z[0]) == 0.0 and float(t.p_value[0]) == 1.0 and float(t.p_empirical[0]) == 1.0


def test_null_test_errors():
    from attnbase.stats.inference import clt_mean_test, pooled_clt_mean_test

    with pytest.raises(StatsError, match="D >= 2"):
        clt_mean_test(0.5, np.ones((4, 1)))
    with pytest.raises(StatsError, match="statistic.shape"):
        clt_mean_test([0.5, 0.6], np.ones((4, 2)))
    with pytest.raises(StatsError, match="seq_observed"):
        clt_mean_test(0.5, np.ones((4, 2)), seq_observed=np.ones(3))
    with pytest.raises(StatsError, match="at least 2"):
        pooled_clt_mean_test(0.5, [0.1], 10)


def test_clt_mean_test_on_a_sample_of_sequences_is_calibrated():
    # 400 sequences per head whose null means differ (between-sequence sd 0.05 >> within 0.02);
    # shuffled copies for 40 of them: null_sd counts the sampling error, z stays N(0, 1)
    from scipy.stats import kstest

    from attnbase.stats.inference import clt_mean_test

    rng = np.random.default_rng(5)
    heads, n, m = 3000, 400, 40
    mu = rng.normal(0.4, 0.05, (heads, n, 1))
    x = mu + 0.02 * rng.standard_normal((heads, n, 3))  # observed + D = 2 draws
    obs = x[..., 0]
    idx = np.argsort(rng.random((heads, n)), axis=-1)[:, :m]
    null = np.take_along_axis(x[..., 1:], idx[..., None], axis=1)
    t = clt_mean_test(obs.mean(-1), null, seq_observed=np.take_along_axis(obs, idx, 1),
                      n_seqs=n, draws=200, seed=3)
    assert abs(t.z.mean()) < 0.06 and abs(t.z.std() - 1) < 0.06
    assert kstest(t.p_value, "uniform").pvalue > 0.01
    assert np.mean(t.p_empirical < 0.05) == pytest.approx(0.05, abs=0.013)
    with pytest.raises(StatsError, match="seq_observed is required"):
        clt_mean_test(obs.mean(-1)[:2], null[:2], n_seqs=n)
