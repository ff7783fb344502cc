"""Routing vs filtering (S-D) structure of W_Q W_K^T (docs/metrics.md §7): closed forms, span = dense."""

import numpy as np
import pytest

from attnbase.errors import StatsError
from attnbase.stats import spectral


def random_heads(rng, n=3, d_model=24, d_head=4):
    return rng.standard_normal((n, d_model, d_head)), rng.standard_normal((n, d_model, d_head))


def test_frobenius_split(rng):
    w_q, w_k = random_heads(rng)
    m = w_q @ np.swapaxes(w_k, -1, -2)
    s, a = spectral.sd_parts(m)
    np.testing.assert_allclose((m ** 2).sum((-2, -1)), (s ** 2).sum((-2, -1)) + (a ** 2).sum((-2, -1)))
    np.testing.assert_allclose(s, np.swapaxes(s, -1, -2))
    np.testing.assert_allclose(a, -np.swapaxes(a, -1, -2))
    # the span core carries the same norms: ||M||^2 = ||S||^2 + ||A||^2 there too
    cs, ca = spectral.sd_parts(spectral.span_core(w_q, w_k))
    np.testing.assert_allclose((cs ** 2).sum((-2, -1)), (s ** 2).sum((-2, -1)))
    np.testing.assert_allclose((ca ** 2).sum((-2, -1)), (a ** 2).sum((-2, -1)))


def test_single_rotation_plane_routing_erank_two():
    d_model = 10
    e = np.eye(d_model)
    w_q = e[:, [0, 1]]
    w_k = np.stack([e[:, 1], -e[:, 0]], axis=1)  # M = e0 e1^T - e1 e0^T: a pure rotation plane
    r = spectral.sd_metrics(w_q, w_k)
    assert r["routing_fraction"] == pytest.approx(1.0)
    assert r["routing_erank"] == pytest.approx(2.0, abs=1e-12)
    assert r["routing_erank_pr"] == pytest.approx(2.0, abs=1e-12)
    assert np.isnan(r["filtering_erank"])  # S = 0
    # eigenvalues +-i: real part 0, none unstable
    assert r["n_unstable"] == 0 and r["max_real_eig"] == pytest.approx(0.0, abs=1e-12)
    # a symmetric positive form: no routing, every eigenvalue unstable
    p = spectral.sd_metrics(w_q, w_q)
    assert p["routing_fraction"] == pytest.approx(0.0, abs=1e-12)
    assert p["n_unstable"] == 2 and p["max_real_eig"] == pytest.approx(1.0)


def test_eigenvalues_of_small_product_are_nonzero_eigenvalues_of_m(rng):
    w_q, w_k = random_heads(rng, n=1, d_model=12, d_head=3)
    small = np.sort_complex(np.linalg.eigvals(w_k[0].T @ w_q[0]))
    big = np.linalg.eigvals(w_q[0] @ w_k[0].T)
    big = np.sort_complex(big[np.abs(big) > 1e-9 * np.abs(big).max()])
    np.testing.assert_allclose(small, big, atol=1e-9)


@pytest.mark.parametrize("d_model,d_head", [(24, 4), (16, 8), (6, 4)])
def test_span_equals_dense(rng, d_model, d_head):
    w_q, w_k = random_heads(rng, n=5, d_model=d_model, d_head=d_head)
    span, dense = spectral.sd_metrics(w_q, w_k), spectral.sd_metrics_dense(w_q, w_k)
    assert set(span) == set(dense) == set(spectral.SD_HEAD_METRICS)
    for name in spectral.SD_HEAD_METRICS:
        np.testing.assert_allclose(span[name], dense[name], rtol=1e-8, atol=1e-9, err_msg=name)


def test_singular_values_of_routing_come_in_pairs(rng):
    w_q, w_k = random_heads(rng, n=1)
    _, a = spectral.sd_parts(spectral.span_core(w_q, w_k))
    sv = np.linalg.svd(a[0], compute_uv=False)
    np.testing.assert_allclose(sv[0::2], sv[1::2], rtol=1e-8, atol=1e-10)


def test_bilinear_logits_expand_the_biases(rng):
    x = rng.standard_normal((2, 5, 8))
    w_q, w_k = rng.standard_normal((8, 3)), rng.standard_normal((8, 3))
    b_q, b_k = rng.standard_normal(3), rng.standard_normal(3)
    want = (x @ w_q + b_q) @ np.swapaxes(x @ w_k + b_k, -1, -2) * 0.5
    np.testing.assert_allclose(spectral.bilinear_logits(x, w_q, w_k, b_q, b_k, 0.5), want)


def test_sd_tables_layer_profile(rng):
    layers = [random_heads(rng, n=4) for _ in range(3)]
    t = spectral.sd_tables(layers)
    hm, lm = t["head_metrics"], t["layer_metrics"]
    assert len(hm["value"]) == 3 * 4 * len(spectral.SD_HEAD_METRICS)
    re = hm["value"][hm["metric"] == "routing_erank"].reshape(3, 4)
    ids, prof = spectral.cascade(re.ravel(), np.repeat(np.arange(3), 4))
    got = lm["value"][lm["metric"] == "routing_erank"]
    np.testing.assert_allclose(got, prof)
    np.testing.assert_allclose(got, re.mean(1))
    share = lm["value"][lm["metric"] == "share_unstable"]
    n_unst = hm["value"][hm["metric"] == "n_unstable"].reshape(3, 4)
    np.testing.assert_allclose(share, (n_unst > 0).mean(1))


def test_shape_errors():
    with pytest.raises(StatsError, match="w_q and w_k"):
        spectral.sd_metrics(np.zeros((4, 2)), np.zeros((4, 3)))


def test_docstring_examples():
    import doctest

    assert doctest.testmod(spectral, raise_on_error=True).attempted >= 3
