"""The compiled pairwise Jensen-Shannon pass of head distances (stats/jskernel.py)."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import jensenshannon

from attnbase.stats.jskernel import js_pair_sums, logf


def test_float32_logarithm_is_accurate_to_a_few_ulp():
    x = np.logspace(-30, 0, 200_001).astype(np.float32)
    x = np.concatenate([x, np.float32(1) - np.logspace(-7, -1, 1000).astype(np.float32)])
    got, ref = logf(x).astype(np.float64), np.log(x.astype(np.float64))
    # absolute error relative to |log x|, or to 1 near x = 1 where log x -> 0
    err = np.abs(got - ref) / np.maximum(np.abs(ref), 1.0)
    assert err.max() < 3e-7


def test_pair_sums_match_scipy_jensen_shannon_over_each_rows_prefix(rng):
    R, N, K = 7, 6, 40
    n_keys = rng.integers(3, K + 1, size=R)
    p = rng.dirichlet(np.full(K, 0.3), size=(R, N))
    p[:, :2, 0] += 3.0  # two heads with a heavy sink
    p[np.broadcast_to(np.arange(K)[None, None, :] >= n_keys[:, None, None], p.shape)] = 0.0
    p /= p.sum(-1, keepdims=True)
    h = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
    got = js_pair_sums(p, n_keys, h)
    # scipy's jensenshannon is the square root of the divergence (natural log here)
    ref = np.zeros((N, N))
    for r in range(R):
        for a in range(N):
            for b in range(N):
                if a != b:
                    ref[a, b] += jensenshannon(p[r, a], p[r, b]) ** 2
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-6)
    assert np.array_equal(got, got.T) and np.all(np.diag(got) == 0)


def test_identical_rows_and_an_empty_block(rng):
    p = np.tile(rng.dirichlet(np.ones(16)), (3, 4, 1))
    h = -(p * np.log(p)).sum(-1)
    # float rounding may leave a tiny positive; no negative value survives the clamp
    got = js_pair_sums(p, np.full(3, 16), h)
    assert np.all(got >= 0) and got.max() < 1e-5
    assert np.array_equal(js_pair_sums(np.zeros((0, 4, 16)), np.zeros(0, int), np.zeros((0, 4))),
                          np.zeros((4, 4)))
