"""Clusters that are not one outlier, and intervals over the text (docs/metrics.md §5).

The planted models are small synthetic head-distance arrays (no model, no catalog): per-sequence
partial sums ``n_s (M + e_s)`` around known population matrices ``M``, so the true reversal rate
is the rate of ``M_with`` vs ``M_drop``.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnbase.stats import convention
from attnbase.stats.text_bootstrap import SeqParts, percentile_interval, unit_of_seq, widen

W, D = ("x", "with_sink"), ("x", "drop_sink")


def _points_distances(x: np.ndarray) -> np.ndarray:
    return np.linalg.norm(x[:, None] - x[None], axis=-1)


# --- clusters ----------------------------------------------------------------------------------
def test_a_planted_71_plus_1_split_is_refused():
    rng = np.random.default_rng(0)
    x = np.vstack([rng.standard_normal((71, 8)), np.full((1, 8), 30.0)])  # one far outlier
    d = _points_distances(x)
    # without the rule, silhouette picks exactly the split the issue saw: 71 + 1, ARI 1
    loose = convention.cluster_agreement(d, d, draws=199, seed=1, min_cluster=1)
    assert loose.k == 2 and loose.sizes_with == (71, 1) and loose.ari == 1.0
    assert loose.null_distinct == 2 and loose.ari_p_normal is None  # a two-valued null: no fit
    r = convention.cluster_agreement(d, d, draws=199, seed=1)
    assert r.min_cluster == 4 == convention.min_cluster_size(72)
    assert r.k is None and r.ari is None and r.ari_p is None and r.sizes_with == ()
    assert 2 in r.refused


def test_a_planted_3_way_split_is_found_with_its_sizes():
    rng = np.random.default_rng(1)
    centres = np.repeat(np.eye(3) * 10, [30, 24, 18], axis=0)
    d = _points_distances(centres + rng.standard_normal(centres.shape))
    r = convention.cluster_agreement(d, d, draws=999, seed=1)
    assert r.k == 3 and r.sizes_with == (30, 24, 18) and r.ari == 1.0
    assert r.null_distinct >= convention.NORMAL_FIT_MIN_DISTINCT  # many values: a normal fit
    assert r.ari_p_normal is not None and r.ari_p_normal < 1e-6 and r.p_at_floor
    # negative control: unrelated drop_sink distances give an ARI near 0 and a large p
    y = rng.standard_normal((72, 8))
    other = convention.cluster_agreement(d, _points_distances(y), draws=199, seed=1)
    assert other.k == 3 and abs(other.ari) < 0.1 and other.ari_p > 0.05


# --- the bootstrap over the text ---------------------------------------------------------------
def _planted(rng, n=12, seqs=40, sigma=0.3):
    """Population matrices and per-sequence partial sums around them; ``(true_rate, parts)``."""
    def sym(a):
        a = (a + a.T) / 2
        np.fill_diagonal(a, 0.0)
        return a

    m_with = sym(rng.random((n, n)))
    m_drop = 0.6 * m_with + 0.4 * sym(rng.random((n, n)))
    flips, total = convention._exact_flips(m_with, m_drop)
    rows = rng.integers(20, 40, size=seqs).astype(float)
    iu = np.triu_indices(n, 1)
    common = rng.normal(0, sigma, (seqs, len(iu[0])))  # the text moves both conventions alike
    sums = {W: rows[:, None] * (m_with[iu] + common + rng.normal(0, sigma / 2, common.shape)),
            D: rows[:, None] * (m_drop[iu] + common + rng.normal(0, sigma / 2, common.shape))}
    return flips / total, SeqParts(sums, rows, n)


def test_the_bootstrap_ci_covers_the_true_rate_in_90_percent_of_planted_models():
    rng = np.random.default_rng(2026)
    hits, widths = 0, []
    for rep in range(100):
        true, parts = _planted(rng)
        r = convention.reversal_over_text(parts, W, D, boot=200, seed=rep)
        assert r.exact and r.units == 40 and r.ci_low <= r.rate <= r.ci_high
        hits += r.ci_low <= true <= r.ci_high
        widths.append(r.ci_high - r.ci_low)
    assert hits >= 90, f"coverage {hits}/100"
    assert min(widths) > 0  # never a zero-width CI


def test_sampled_triplets_add_their_error_and_identical_conventions_never_give_zero_width():
    rng = np.random.default_rng(5)
    _, parts = _planted(rng, n=30)
    exact = convention.reversal_over_text(parts, W, D, boot=100, seed=0)
    sampled = convention.reversal_over_text(parts, W, D, boot=100, seed=0, draws=2000,
                                            force_sampled=True)
    assert not sampled.exact and sampled.triplet_se > 0
    assert sampled.ci_high - sampled.ci_low > exact.ci_high - exact.ci_low
    assert sampled.ci_low <= exact.rate <= sampled.ci_high
    same = SeqParts({W: parts.sums[W], D: parts.sums[W]}, parts.n_rows, parts.n_heads)
    r = convention.reversal_over_text(same, W, D, boot=50, seed=0)
    assert r.rate == 0 and r.ci_floor and r.ci_low == 0 and r.ci_high > 0


def test_a_replicate_is_a_weighted_sum_of_the_parts():
    rng = np.random.default_rng(3)
    _, parts = _planted(rng, n=5, seqs=4)
    w = np.array([2.0, 0.0, 1.0, 1.0])
    got = parts.matrices([W], w)[W]
    iu = np.triu_indices(5, 1)
    want = (w @ parts.sums[W]) / (w @ parts.n_rows)
    assert np.allclose(got[iu], want) and np.allclose(got, got.T) and not got.diagonal().any()
    assert unit_of_seq(130).max() == 63 and np.bincount(unit_of_seq(130)).min() == 2
    assert percentile_interval([0.2] * 10) == (0.2, 0.2)
    assert widen(0.3, 0.3, 0.3, 0.0) == (0.3, 0.3)
    with pytest.raises(Exception, match=">= 2 sequences"):
        next(SeqParts({W: parts.sums[W][:1]}, parts.n_rows[:1], 5).replicates([W], 5))


def test_ari_spread_over_sequence_resamples():
    rng = np.random.default_rng(4)
    centres = np.repeat(np.eye(3) * 4, 8, axis=0)
    x = centres + rng.standard_normal(centres.shape)
    m = _points_distances(x)
    iu = np.triu_indices(24, 1)
    rows = np.full(20, 10.0)
    noisy = rows[:, None] * (m[iu] + rng.normal(0, 1.5, (20, len(iu[0]))))
    parts = SeqParts({W: noisy, D: noisy + rows[:, None] * rng.normal(0, 1.5, noisy.shape)},
                     rows, 24)
    lo, hi, mean, sd = convention.ari_over_text(parts, W, D, 3, boot=60, seed=0)
    assert -1 <= lo < hi <= 1 and sd > 0 and lo <= mean <= hi
