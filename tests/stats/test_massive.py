"""Massive activations (docs/metrics.md §6b; Sun et al. 2024): closed-form cases with a planted
activation, a Gaussian negative control, the exact median, sink coincidence, and the rows an
analysis writes."""

from __future__ import annotations

import numpy as np
import pytest

from attnbase.metrics import N
from attnbase.stats import massive
from attnbase.stats.massive import MASSIVE_LAYER_METRICS, massive_activations


def _gauss(shape=(12, 32, 48), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_a_planted_massive_value_is_found_with_its_ratio_and_place():
    x = _gauss()
    x[5, 0, 17] = -2500.0  # sign does not matter: magnitudes
    tokens = np.arange(12 * 32).reshape(12, 32) + 1000
    m = massive_activations(x, sink=(0,), tokens=tokens)
    median = float(np.median(np.abs(x.astype(np.float64))))
    assert m[N.massive_top1] == 2500.0
    assert m[N.massive_median] == pytest.approx(median, rel=1e-12)
    assert m[N.massive_ratio] == pytest.approx(2500.0 / median, rel=1e-12)
    assert (m[N.massive_seq], m[N.massive_pos], m[N.massive_dim]) == (5.0, 0.0, 17.0)
    assert m[N.massive_token] == float(tokens[5, 0])
    assert m[N.massive_flag] == 1.0
    # the 2nd and 3rd largest are the Gaussian's own two largest (pos, dim) coordinates
    rest = np.abs(x).max(axis=0)
    rest[0, 17] = np.abs(np.delete(x[:, 0, 17], 5)).max()
    rest = np.sort(rest.ravel())
    assert (m[N.massive_top2], m[N.massive_top3]) == (rest[-1], rest[-2])
    assert m[N.massive_sink_share] == pytest.approx(1 / 12)  # only sequence 5 peaks at pos 0


def test_an_activation_every_sequence_repeats_counts_once_among_the_three_largest():
    """A causal model's first token gives every sequence the same massive entry: it is the
    largest once, and the 2nd and 3rd largest are the next coordinates, not its copies."""
    x = _gauss((6, 10, 16), seed=4)
    x[:, 0, 3] = 3000.0  # the same entry in all six sequences
    x[4, 2, 5] = 700.0
    x[1, 7, 9] = -400.0
    m = massive_activations(x)
    assert (m[N.massive_top1], m[N.massive_top2], m[N.massive_top3]) == (3000.0, 700.0, 400.0)
    assert (m[N.massive_seq], m[N.massive_pos], m[N.massive_dim]) == (0.0, 0.0, 3.0)
    # negative control: distinct coordinates keep their own values
    y = _gauss((6, 10, 16), seed=4)
    y[0, 0, 3], y[1, 0, 4], y[2, 1, 3] = 3000.0, 2999.0, 2998.0
    m = massive_activations(y)
    assert (m[N.massive_top1], m[N.massive_top2], m[N.massive_top3]) == (3000.0, 2999.0, 2998.0)


def test_gaussian_residual_is_no_massive_activation():
    """Negative control: i.i.d. N(0, 1) entries; the max of 18,432 |N(0,1)| is about 4 sd and
    the median |N(0,1)| 0.674, so the ratio is about 6, far from Sun et al.'s 1,000."""
    m = massive_activations(_gauss())
    assert 3.0 < m[N.massive_ratio] < 10.0
    assert m[N.massive_flag] == 0.0
    assert m[N.massive_median] == pytest.approx(0.6745, abs=0.02)


def test_flag_needs_both_thresholds():
    x = np.full((2, 4, 8), 0.01, dtype=np.float32)
    x[0, 1, 2] = 50.0  # 5,000 x the median but below 100
    assert massive_activations(x)[N.massive_flag] == 0.0
    y = np.full((2, 4, 8), 1.0, dtype=np.float32)
    y[0, 1, 2] = 500.0  # above 100 but only 500 x the median
    assert massive_activations(y)[N.massive_flag] == 0.0
    y[0, 1, 2] = 5000.0
    assert massive_activations(y)[N.massive_flag] == 1.0


def test_sink_share_counts_sequences_peaking_at_a_sink_position():
    x = _gauss((6, 10, 16), seed=1)
    x[:, 0, 3] = 300.0  # every sequence peaks at position 0
    assert massive_activations(x, sink=(0,))[N.massive_sink_share] == 1.0
    x = _gauss((6, 10, 16), seed=1)
    x[:, 4, 3] = 300.0  # at position 4
    assert massive_activations(x, sink=(0,))[N.massive_sink_share] == 0.0
    assert massive_activations(x, sink=(0, 4))[N.massive_sink_share] == 1.0


@pytest.mark.parametrize("chunk", [1, 3, 100])
@pytest.mark.parametrize("shape", [(5, 7, 9), (4, 6, 8)])  # odd and even entry counts
def test_median_is_exact_and_chunking_changes_nothing(monkeypatch, chunk, shape):
    monkeypatch.setattr(massive, "SEQ_CHUNK", chunk)
    x = _gauss(shape, seed=2) * np.float32(3.0)
    x.ravel()[::5] = 0.0  # zeros fall in the histogram's bottom bin
    x.ravel()[1] = 1e35  # beyond the histogram's top edge
    m = massive_activations(x)
    assert m[N.massive_median] == float(np.median(np.abs(x.astype(np.float64))))
    assert m[N.massive_top1] == pytest.approx(1e35, rel=1e-6)


def test_unwritten_sequences_are_left_out():
    x = _gauss((4, 5, 6), seed=3)
    x[2:] = np.nan  # sequences of batches not written yet read as NaN
    m = massive_activations(x)
    ref = np.abs(x[:2].astype(np.float64))
    assert m[N.massive_median] == float(np.median(ref)) and m[N.massive_top1] == ref.max()
    assert np.isnan(massive_activations(np.full((2, 3, 4), np.nan))[N.massive_top1])


def test_analysis_writes_massive_rows_per_hidden_state(tmp_path):
    """A tiny run with hidden states: one row per hidden state of every massive metric, equal
    to the function on open_run's hidden block; none of them averaged into run_metrics."""
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.stats.analyze import analyze_run
    from attnbase.warehouse import Database, open_run, read_sql

    db = Database(tmp_path / "db")
    extract_run(db, "t", ExtractConfig(model="tiny-gpt2", corpus="default", n_seqs=4,
                                       seq_len=16, batch_size=2, device="cpu"), progress=False)
    analyze_run(db, "t", draws=5, gauss_draws=5, seed=0, n_boot=100)
    rows = read_sql(db.path, "SELECT layer, metric, value FROM layer_metrics WHERE run_id = 't' "
                             "AND starts_with(metric, 'massive_') ORDER BY layer, metric")
    ds = open_run(db.path, "t")
    n_hidden = ds.sizes["hidden_layer"]
    assert rows.height == n_hidden * len(MASSIVE_LAYER_METRICS)
    for layer in (0, n_hidden - 1):
        want = massive_activations(ds["hidden"].values[layer], (0,), ds["tokens"].values)
        got = {m: v for lay, m, v in rows.iter_rows() if lay == layer}
        for name in MASSIVE_LAYER_METRICS:
            assert got[name] == pytest.approx(want[name], rel=1e-12, nan_ok=True), name
    run = read_sql(db.path, "SELECT metric FROM run_metrics WHERE run_id = 't'")["metric"]
    assert not any(m.startswith("massive_") for m in run)
