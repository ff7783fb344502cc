"""Aitchison geometry of attention rows (docs/metrics.md §4): reference values, identities, oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attnbase.errors import StatsError
from attnbase.stats import compositional as comp

P = np.array([0.6, 0.2, 0.1, 0.1])
Q = np.array([0.3, 0.3, 0.2, 0.2])


def test_metrics_reference_values():
    zp, zq = np.log(P), np.log(Q)
    assert comp.sink_balance(zp) == pytest.approx(1.351615, abs=1e-6)
    assert comp.sink_balance(zq) == pytest.approx(0.234095, abs=1e-6)
    assert comp.aitchison_distance(zp, zq) == pytest.approx(1.141939, abs=1e-6)
    assert comp.aitchison_perp_distance(zp, zq) == pytest.approx(0.234891, abs=1e-6)
    assert comp.content_dispersion(zp) == pytest.approx(0.565952, abs=1e-6)
    assert comp.entropy(zp) == pytest.approx(1.088900, abs=1e-6)
    assert comp.binary_entropy(0.6) == pytest.approx(0.673012, abs=1e-6)


def test_entropy_change_reference():
    # s 0.2 -> 0.8, H(pi) 2.0 -> 1.5: dH_b = 0, sink part -1.05, content -0.25, share 0.8077
    ch = comp.entropy_change(0.2, 2.0, 0.8, 1.5)
    assert ch.d_binary == pytest.approx(0.0, abs=1e-12)
    assert ch.sink_part == pytest.approx(-1.05, abs=1e-12)
    assert ch.content_part == pytest.approx(-0.25, abs=1e-12)
    assert ch.d_entropy == pytest.approx(-1.30, abs=1e-12)
    assert ch.sink_part / ch.d_entropy == pytest.approx(0.8077, abs=5e-5)


def test_logits_and_probabilities_agree_with_skbio_oracle():
    skbio = pytest.importorskip("skbio.stats.composition")  # listed in tests/QUARANTINES.md
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(9), size=20)
    np.testing.assert_allclose(comp.clr(p), skbio.clr(p), atol=1e-12)
    np.testing.assert_allclose(comp.clr_from_logits(np.log(p)), skbio.clr(p), atol=1e-12)
    np.testing.assert_allclose(comp.closure(p * 7.0), skbio.closure(p * 7.0), atol=1e-15)
    x = p.copy()
    x[:, 3] = 0.0
    x = comp.closure(x)
    ours, flag = comp.multiplicative_replacement(x, delta=1e-6)
    np.testing.assert_allclose(ours, skbio.multi_replace(x, delta=1e-6), atol=1e-15)
    assert flag.all()


def test_probability_rows_are_flagged_only_where_a_zero_was_replaced():
    p = np.array([[0.5, 0.5, 0.0, 0.0], [0.5, 0.3, 0.2, 0.0]])
    z, flag = comp.logits_from_probs(p, n_keys=[2, 4])
    assert flag.tolist() == [False, True]
    assert np.isneginf(z[0, 2:]).all() and np.isfinite(z[1]).all()
    assert math.exp(z[1, 3]) == pytest.approx(1e-12)
    # the stored-run path needs no replacement: clr from logits equals clr of the probabilities
    np.testing.assert_allclose(comp.clr_from_logits(z[0])[:2], comp.clr(p[0, :2]), atol=1e-12)


def test_errors_are_one_line_and_say_what_to_do():
    with pytest.raises(StatsError, match="multiplicative_replacement"):
        comp.clr([0.5, 0.5, 0.0])
    with pytest.raises(StatsError, match="same unmasked keys"):
        comp.aitchison_distance(np.log([0.5, 0.5, 1e-9]), [0.0, 0.0, -np.inf])
    with pytest.raises(StatsError, match="NaN"):
        comp.sink_balance([0.0, np.nan, 1.0])


def test_short_rows_have_no_content_geometry():
    z = np.array([[1.0, 2.0, -np.inf], [1.0, -np.inf, -np.inf]])
    assert np.isnan(comp.content_dispersion(z)).all()
    b = comp.sink_balance(z)
    assert np.isfinite(b[0]) and np.isnan(b[1])


# --- identities on random rows (hypothesis) ----------------------------------------------------
rows = st.integers(3, 24).flatmap(
    lambda n: arrays(np.float64, (2, n), elements=st.floats(-25, 25, allow_nan=False)))


@settings(max_examples=200, deadline=None)
@given(rows)
def test_pythagoras(z):
    # d_A^2 = (b(p) - b(q))^2 + d_A_perp^2, and per row ||clr p||^2 = b^2 + C_perp^2
    zp, zq = z
    d = comp.aitchison_distance(zp, zq)
    b = comp.sink_balance(z)
    dp = comp.aitchison_perp_distance(zp, zq)
    assert d**2 == pytest.approx((b[0] - b[1]) ** 2 + dp**2, rel=1e-9, abs=1e-9)
    c = comp.clr_from_logits(z)
    np.testing.assert_allclose((c * c).sum(-1), b**2 + comp.content_dispersion(z) ** 2,
                               rtol=1e-9, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(rows)
def test_entropy_chain_rule(z):
    # H(p) = H_b(s) + (1 - s) H(pi), s = p_0
    s = comp.sink_mass_from_logits(z)
    rhs = comp.binary_entropy(s) + (1 - s) * comp.content_entropy(z)
    np.testing.assert_allclose(comp.entropy(z), rhs, rtol=0, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(rows, st.floats(-30, 30))
def test_d_a_perp_is_invariant_to_the_sink_mass(z, shift):
    zp, zq = z
    moved = zp.copy()
    moved[0] += shift
    assert comp.aitchison_perp_distance(moved, zq) == pytest.approx(
        comp.aitchison_perp_distance(zp, zq), rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(rows)
def test_entropy_change_is_exact_and_symmetric(z):
    za, zb = z
    sa, sb = comp.sink_mass_from_logits(za), comp.sink_mass_from_logits(zb)
    ha, hb = comp.content_entropy(za), comp.content_entropy(zb)
    ch = comp.entropy_change(sa, ha, sb, hb)
    assert ch.d_entropy == pytest.approx(comp.entropy(zb) - comp.entropy(za), abs=1e-9)
    back = comp.entropy_change(sb, hb, sa, ha)
    assert back.sink_part == pytest.approx(-ch.sink_part, abs=1e-12)
    assert back.content_part == pytest.approx(-ch.content_part, abs=1e-12)


def test_logit_path_matches_capture_row_stats():
    # the capture-time torch row statistics (extract.rowstats) agree with this numpy reference
    import torch

    from attnbase.extract.rowstats import row_stats

    rng = np.random.default_rng(0)
    z = rng.standard_normal((5, 12, 12)) * 3
    z[..., np.triu_indices(12, 1)[0], np.triu_indices(12, 1)[1]] = -np.inf
    got = {k: v.numpy() for k, v in row_stats(torch.from_numpy(z)).items()}
    np.testing.assert_allclose(got["sink_balance"], comp.sink_balance(z), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["content_dispersion"], comp.content_dispersion(z),
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["entropy"], comp.entropy(z), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["content_entropy"][:, 2:], comp.content_entropy(z)[:, 2:],
                               rtol=1e-9, atol=1e-12)
