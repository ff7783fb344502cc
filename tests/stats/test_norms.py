"""Norm stratification (docs/metrics.md §1): closed forms, planted outliers, the Gaussian baseline."""

import numpy as np
import pytest

from attnbase.errors import StatsError
from attnbase.stats.norms import isotropic_norm_cv, key_norm_cv, key_norm_cv_excl_sink, key_norms


@pytest.mark.parametrize("d_head", [16, 32, 64, 80, 128, 256])
def test_isotropic_gaussian_keys_match_baseline_within_2pct(d_head, rng):
    keys = rng.standard_normal((1, 50, 100, d_head)) * 3.7  # any scale
    cv = float(key_norm_cv(keys)[0])
    assert cv == pytest.approx(isotropic_norm_cv(d_head), rel=0.02)


def test_baseline_values_of_the_spec():
    got = [round(isotropic_norm_cv(d), 4) for d in (64, 80, 128, 256)]
    assert got == [0.0884, 0.0791, 0.0625, 0.0442]


def test_one_outlier_norm_key_as_computed_by_hand():
    # 8 unit-norm keys and one of norm 5 at token 3 of sequence 1: norms (1 x 8, 5)
    keys = np.zeros((2, 5, 4))
    keys[..., 0] = 1.0
    keys[1, 3] = [0.0, 3.0, 4.0, 0.0]
    keys = keys[:, :-1]  # 2 seqs x 4 tokens = 8 keys: seven of norm 1, one of norm 5
    norms = np.array([1.0] * 7 + [5.0])
    mean = norms.mean()  # 1.5
    std = np.sqrt(((norms - mean) ** 2).mean())  # sqrt(1.75)
    assert float(key_norm_cv(keys)) == pytest.approx(std / mean, abs=1e-15)
    assert float(key_norm_cv(keys)) == pytest.approx(np.sqrt(1.75) / 1.5)


def test_excl_sink_ignores_token_zero():
    keys = np.ones((3, 6, 2))
    keys[:, 0] *= 50.0  # huge sink keys
    assert float(key_norm_cv_excl_sink(keys)) == pytest.approx(0.0, abs=1e-15)
    assert float(key_norm_cv(keys)) > 1.0


def test_layer_block_gives_one_value_per_kv_head(rng):
    block = rng.standard_normal((3, 4, 10, 8))  # (kv_head, seq, pos, d_head)
    cv = key_norm_cv(block)
    assert cv.shape == (3,)
    assert cv[1] == pytest.approx(float(key_norm_cv(block[1])))


def test_key_norms_shape_and_value():
    assert key_norms(np.full((2, 3, 4), 0.5)).tolist() == [[1.0] * 3] * 2


def test_errors_name_the_shape():
    with pytest.raises(StatsError, match=r"\(\.\.\., seq, pos, d_head\)"):
        key_norm_cv(np.ones((4, 8)))
    with pytest.raises(StatsError, match="d_head"):
        isotropic_norm_cv(0)
