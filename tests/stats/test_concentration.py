"""Concentration and onset (docs/metrics.md §3): closed forms, planted sinks, synthetic profiles."""

import numpy as np
import pytest
from synth import sink_logits, softmax, uniform_attention

from attnbase.errors import StatsError
from attnbase.stats.concentration import (
    max_share,
    mean_sink_mass,
    onset_depth,
    onset_layer,
    row_max_share,
    sink_mass,
)


def harmonic(n):
    return sum(1.0 / i for i in range(1, n + 1))


def test_uniform_causal_t128_max_share_is_0_04245():
    a = uniform_attention(128)[None]
    assert float(max_share(a)) == pytest.approx(harmonic(128) / 128, abs=1e-15)
    assert round(float(max_share(a)), 5) == 0.04245


def test_uniform_causal_row_max_share_closed_forms():
    # docs/metrics.md says 0.04245 "under both"; true for min_query=0 only (see row_max_share Notes)
    a = uniform_attention(128)[None]
    assert float(row_max_share(a, min_query=0)) == pytest.approx(harmonic(128) / 128, abs=1e-15)
    assert float(row_max_share(a)) == pytest.approx((harmonic(128) - harmonic(4)) / 124, abs=1e-15)
    assert round(float(row_max_share(a)), 6) == 0.027015


def test_uniform_encoder_rows():
    a = uniform_attention(10, causal=False)[None]
    assert float(max_share(a)) == pytest.approx(0.1)
    assert float(row_max_share(a)) == pytest.approx(0.1)


@pytest.mark.parametrize("mass", [0.3, 0.5, 0.9])
def test_planted_sink_of_known_mass_recovered_exactly(mass):
    # encoder rows of T keys: logit s on key 0 with e^s / (e^s + T - 1) = mass
    T = 16
    s = np.log(mass * (T - 1) / (1 - mass))
    a = softmax(sink_logits(T, s, causal=False))[None]
    np.testing.assert_allclose(sink_mass(a), mass, atol=1e-14)
    assert float(mean_sink_mass(a)) == pytest.approx(mass, abs=1e-14)
    assert float(max_share(a)) == pytest.approx(max(mass, (1 - mass) / (T - 1)), abs=1e-14)
    assert float(row_max_share(a)) == pytest.approx(max(mass, (1 - mass) / (T - 1)), abs=1e-14)


def test_all_attention_on_sink_gives_one():
    a = np.zeros((2, 8, 8))
    a[..., 0] = 1.0
    assert float(max_share(a)) == 1.0 == float(row_max_share(a)) == float(mean_sink_mass(a))


def test_shapes_reduce_seq_query_key(rng):
    a = softmax(rng.standard_normal((3, 2, 5, 6, 6)))  # (layer, head, seq, query, key)
    for f in (max_share, row_max_share, mean_sink_mass):
        assert f(a).shape == (3, 2)


@pytest.mark.parametrize("profile, threshold, expected", [
    ([0.04, 0.05, 0.30, 0.6, 0.7, 0.7], 0.2, 2),
    ([0.25, 0.05, 0.30], 0.2, 0),
    ([0.1, 0.15, 0.19], 0.2, None),
    ([0.1, 0.2, 0.21], 0.2, 2),  # strict: exactly at the threshold is not an onset
    ([0.1, 0.35, 0.05, 0.5], 0.3, 1),  # first crossing, even if it falls back
    ([0.1, 0.35, 0.05, 0.5], 0.4, 3),
])
def test_onset_on_synthetic_profiles(profile, threshold, expected):
    assert onset_layer(profile, threshold) == expected


def test_onset_from_layer_head_profile_averages_heads():
    prof = np.array([[0.1, 0.1], [0.5, 0.0], [0.3, 0.3]])  # layer means 0.1, 0.25, 0.3
    assert onset_layer(prof) == 1
    assert onset_layer(prof, threshold=0.26) == 2


def test_onset_depth():
    assert onset_depth(2, 12) == pytest.approx(1 / 6)
    assert onset_depth(None, 12) is None


def test_errors():
    with pytest.raises(StatsError, match="seq, query, key"):
        max_share(np.ones((4, 4)))
    with pytest.raises(StatsError, match="min_query"):
        row_max_share(np.ones((1, 4, 4)) / 4, min_query=4)
    with pytest.raises(StatsError, match="profile"):
        onset_layer(np.ones((2, 2, 2)))
