"""Key geometry (docs/metrics.md §2): VE@k, its Gauss reference values, rank-r keys, the shuffle null."""

import numpy as np
import pytest

from attnbase.errors import StatsError
from attnbase.stats.geometry import (
    centred_spectrum,
    gauss_null_ve,
    shuffle_null_ve,
    shuffle_tokens,
    ve_at_k,
)

#: docs/metrics.md §2: Gauss-null VE@8 at T = 128 (the paper's Gauss column).
GAUSS_REFERENCE = {64: 0.294, 80: 0.263, 128: 0.212, 256: 0.160}


@pytest.mark.parametrize("d_head, expected", sorted(GAUSS_REFERENCE.items()))
def test_gauss_null_reproduces_reference_values(d_head, expected):
    draws = gauss_null_ve(128, d_head, k=8, draws=200, seed=0)
    assert draws.shape == (200, 1)
    assert float(draws.mean()) == pytest.approx(expected, abs=0.003)


def test_gauss_null_is_per_sequence_not_pooled(rng):
    # pooled over 19,200 tokens the same computation gives ~0.137 for d_head = 64 (docs/metrics.md)
    pooled = float(ve_at_k(rng.standard_normal((19200, 64)), 8))
    assert pooled == pytest.approx(0.137, abs=0.005)


def test_gauss_null_fast_path_agrees_with_ve_at_k():
    a = gauss_null_ve(32, 12, k=3, draws=50, seed=7)
    x = np.random.default_rng(7).standard_normal((50, 12, 32), dtype=np.float32)
    b = ve_at_k(np.swapaxes(x, -1, -2).astype(np.float64), 3)  # same draws, (pos, d) layout
    np.testing.assert_allclose(a.ravel(), b, atol=1e-5)


@pytest.mark.parametrize("rank", [1, 2, 5, 8])
def test_rank_r_keys_have_ve_at_r_equal_1(rank, rng):
    a = rng.standard_normal((6, 64, rank))
    b = rng.standard_normal((6, rank, 32))
    keys = a @ b + rng.standard_normal((6, 1, 32))  # plus a per-sequence offset: centring removes it
    np.testing.assert_allclose(ve_at_k(keys, rank), 1.0, atol=1e-12)
    if rank > 1:
        assert np.all(ve_at_k(keys, rank - 1) < 1 - 1e-6)


def test_ve_uses_the_smaller_gram_matrix_either_way(rng):
    tall = rng.standard_normal((4, 40, 10))  # T > d: d x d covariance
    wide = rng.standard_normal((4, 10, 40))  # T < d: T x T Gram
    for x in (tall, wide):
        sv = np.linalg.svd(x - x.mean(-2, keepdims=True), compute_uv=False)
        ref = (sv[:, :3] ** 2).sum(-1) / (sv**2).sum(-1)
        np.testing.assert_allclose(ve_at_k(x, 3), ref, rtol=1e-10)


def test_ve_equals_classical_mds_of_squared_distances(rng):
    x = rng.standard_normal((20, 6))
    d2 = ((x[:, None] - x[None]) ** 2).sum(-1)
    j = np.eye(20) - 1.0 / 20
    ev = np.sort(np.linalg.eigvalsh(-0.5 * j @ d2 @ j))[::-1]
    ev = np.clip(ev, 0, None)
    assert float(ve_at_k(x, 2)) == pytest.approx(ev[:2].sum() / ev.sum(), rel=1e-10)
    np.testing.assert_allclose(centred_spectrum(x), ev[:6], atol=1e-10)


def test_ve_layer_block_shape(rng):
    assert ve_at_k(rng.standard_normal((3, 5, 16, 8)), 2).shape == (3, 5)


def test_shuffle_keeps_each_dimension_marginal_and_destroys_joint_structure(rng):
    a = rng.standard_normal((64, 1))
    keys = np.hstack([a, 2 * a, -a, a + 0.01 * rng.standard_normal((64, 1))])  # rank ~1
    y = shuffle_tokens(keys, seed=3)
    np.testing.assert_array_equal(np.sort(y, axis=0), np.sort(keys, axis=0))
    assert not np.array_equal(y, keys)
    assert float(ve_at_k(keys, 1)) > 0.999
    null = shuffle_null_ve(keys, k=1, draws=20, seed=0)
    assert null.shape == (20,)
    assert float(null.max()) < 0.8


def test_shuffle_null_is_seeded_and_shaped(rng):
    keys = rng.standard_normal((2, 3, 16, 8))  # (kv_head, seq, pos, d_head)
    a = shuffle_null_ve(keys, k=2, draws=5, seed=11)
    b = shuffle_null_ve(keys, k=2, draws=5, seed=11)
    assert a.shape == (5, 2, 3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, shuffle_null_ve(keys, k=2, draws=5, seed=12))


def test_k_at_least_rank_is_exactly_one_in_statistic_and_nulls(rng):
    keys = rng.standard_normal((4, 16, 6))
    assert np.all(ve_at_k(keys, 8) == 1.0)
    assert np.all(shuffle_null_ve(keys, k=8, draws=3) == 1.0)
    assert np.all(gauss_null_ve(16, 6, k=8, draws=3) == 1.0)


def test_errors():
    with pytest.raises(StatsError, match="pos >= 2"):
        ve_at_k(np.ones((1, 4)))
    with pytest.raises(StatsError, match="positive integer"):
        ve_at_k(np.ones((3, 4)), k=0)
    with pytest.raises(StatsError, match="n_pos"):
        gauss_null_ve(1, 4)


def test_shuffle_null_draws_the_exact_permutation_distribution(rng):
    # T = 4 tokens, 2 dimensions: VE@1 of a shuffle depends only on the relative permutation of
    # the two columns, uniform over the 24 of S_4 under the null; compare every sequence's
    # draws with that exact distribution (chi-square over the distinct values)
    import itertools

    from scipy.stats import chisquare

    keys = rng.standard_normal((2, 4, 2))  # (seq, pos, d_head)
    draws = 4800
    null = shuffle_null_ve(keys, k=1, draws=draws, seed=7)  # (draws, seq)
    for s in range(2):
        exact = np.array([float(ve_at_k(np.stack([keys[s, :, 0], keys[s, list(p), 1]], -1), 1))
                          for p in itertools.permutations(range(4))])
        values, counts = np.unique(exact.round(5), return_counts=True)
        got = np.array([np.sum(np.isclose(null[:, s], v, atol=1e-5)) for v in values])
        assert got.sum() == draws  # every draw is one of the exact values (float32 shuffle path)
        assert chisquare(got, counts / counts.sum() * draws).pvalue > 1e-3


def test_ve_with_shuffle_null_is_ve_at_k_and_shuffle_null_ve_in_one(rng):
    from attnbase.stats.geometry import ve_with_shuffle_null

    keys = rng.standard_normal((3, 5, 40, 12)) * rng.uniform(0.1, 10, 12)  # (kv, seq, pos, d)
    ve, null = ve_with_shuffle_null(keys, k=4, draws=3, seed=9)
    assert ve.shape == (3, 5) and null.shape == (3, 3, 5)
    np.testing.assert_allclose(ve, ve_at_k(keys, 4), atol=1e-6)
    np.testing.assert_array_equal(null, shuffle_null_ve(keys, k=4, draws=3, seed=9))
