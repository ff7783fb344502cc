"""``study scaling``: sink mass against log10 parameter count across runs (docs/metrics.md §5)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from attnbase.errors import StatsError
from attnbase.stats.scaling import log_fit, scaling_study

SIZES = (2e5, 3e6, 4e7, 5e8)


def _planted(db, name: str, n_params: float, sink_logit: float, seed: int) -> None:
    from synth import ingest_synthetic, make_info, make_run_arrays

    info = replace(make_info(n_layers=2, n_heads=2, causal=False), n_params=int(n_params))
    keys, z = make_run_arrays(info, n_seqs=2, T=8, sink_layers=(0, 1), sink_logit=sink_logit,
                              seed=seed)
    ingest_synthetic(db, name, info, keys, z)


def _points(db, runs):
    with db.connect(read_only=True) as con:
        n = [con.execute("SELECT n_params FROM runs WHERE run_id = ?", [r]).fetchone()[0]
             for r in runs]
        s = [con.execute("SELECT avg(sink_mass) FROM row_stats WHERE run_id = ?", [r]).fetchone()[0]
             for r in runs]
    return np.array(n, dtype=float), np.array(s)


def test_planted_scaling_is_found_and_equals_linregress(db):
    runs = [f"m{i}" for i in range(len(SIZES))]
    for i, (r, n) in enumerate(zip(runs, SIZES)):
        _planted(db, r, n, sink_logit=0.5 + 0.8 * i, seed=i)  # more sink mass per decade
    sid, res = scaling_study(db, runs)
    n, s = _points(db, runs)
    assert [res[f"n_params/{r}"] for r in runs] == list(n)
    np.testing.assert_allclose([res[f"sink_mass/{r}"] for r in runs], s, rtol=1e-12)
    ref = stats.linregress(np.log10(n), s)
    assert res["slope"] == pytest.approx(ref.slope, rel=1e-12)
    assert res["r"] == pytest.approx(ref.rvalue, rel=1e-12)
    assert res["p"] == pytest.approx(ref.pvalue, rel=1e-9)
    half = stats.t.ppf(0.975, len(runs) - 2) * ref.stderr
    assert res["slope_ci_low"] == pytest.approx(ref.slope - half, rel=1e-12)
    assert res["slope_ci_high"] == pytest.approx(ref.slope + half, rel=1e-12)
    assert res["slope_ci_low"] > 0 and res["p"] < 0.05
    with db.connect(read_only=True) as con:
        kind, ids = con.execute("SELECT kind, run_ids FROM studies WHERE study_id = ?",
                                [sid]).fetchone()
        keys = {k for (k,) in con.execute("SELECT key FROM study_results WHERE study_id = ?",
                                          [sid]).fetchall()}
    assert kind == "scaling" and ids == runs
    assert {"slope", "slope_ci_low", "slope_ci_high", "r", "p"} <= keys
    assert {f"n_params/{r}" for r in runs} | {f"sink_mass/{r}" for r in runs} <= keys


def test_negative_control_size_independent_sink_is_not_a_law(db):
    runs = [f"c{i}" for i in range(len(SIZES))]
    for i, (r, n) in enumerate(zip(runs, SIZES)):
        _planted(db, r, n, sink_logit=2.0, seed=10 + i)  # the same planted sink at every size
    _, res = scaling_study(db, runs)
    assert res["slope_ci_low"] < 0 < res["slope_ci_high"]
    assert res["p"] > 0.05


def test_refusals(db):
    with pytest.raises(StatsError, match=">= 3 runs"):
        log_fit([1e6, 1e7], [0.1, 0.2])
    with pytest.raises(StatsError, match="different sizes"):
        log_fit([1e6, 1e6, 1e6], [0.1, 0.2, 0.3])
    _planted(db, "a", 1e6, 1.0, 0)
    with db.connect() as con:
        con.execute("UPDATE runs SET n_params = NULL WHERE run_id = 'a'")
    with pytest.raises(StatsError, match="no parameter count"):
        scaling_study(db, ["a", "a2", "a3"])


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-neox", "tiny-llama", "minilm"])
def test_loaded_model_counts_every_parameter(name):
    from attnbase.extract import load_model

    lm = load_model(name, dtype="float32", device="cpu")
    assert lm.info.n_params == sum(p.numel() for p in lm.model.parameters())
    assert lm.info.sink_positions == (0,)


@pytest.mark.slow
def test_real_runs_record_their_parameter_count(tmp_path):
    """Three tiny families extracted for real: runs.n_params is the loaded model's
    ``sum(p.numel() for p in model.parameters())``, and the study fits those points."""
    from attnbase import extract_run
    from attnbase.extract import ExtractConfig, load_model
    from attnbase.warehouse import Database

    db = Database(tmp_path / "db")
    names = ("tiny-gpt2", "tiny-neox", "tiny-llama")
    for name in names:
        extract_run(db, name, ExtractConfig(model=name, n_seqs=2, seq_len=8, batch_size=2,
                                            device="cpu"), progress=False)
    n, s = _points(db, names)
    for name, got in zip(names, n):
        model = load_model(name, dtype="float32", device="cpu").model
        assert got == sum(p.numel() for p in model.parameters())
    assert len(set(n)) == 3  # three sizes
    _, res = scaling_study(db, list(names))
    assert res["slope"] == pytest.approx(stats.linregress(np.log10(n), s).slope, rel=1e-12)


def test_cli_prints_the_fit_and_refuses_two_runs(db, cli):
    runs = ["m0", "m1", "m2"]
    for i, (r, n) in enumerate(zip(runs, SIZES)):
        _planted(db, r, n, sink_logit=0.5 + 0.8 * i, seed=i)
    code, out, err = cli("study", "scaling", "--db", db.path, "--runs", ",".join(runs))
    assert code == 0, err
    assert "sink mass per decade of parameters" in out and "study scaling-m0+m1+m2-" in out
    code, out, err = cli("study", "scaling", "--db", db.path, "--runs", "m0,m1")
    assert code != 0 and ">= 3 runs" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_report_draws_the_scaling_study(db):
    """The report of any run of the study has its scaling section: the per-run table and the
    figure with the fit (reports/sections_compositional.py)."""
    import re

    from attnbase.reports import render_html

    runs = ["m0", "m1", "m2"]
    for i, (r, n) in enumerate(zip(runs, SIZES)):
        _planted(db, r, n, sink_logit=0.5 + 0.8 * i, seed=i)
    sid, res = scaling_study(db, runs)
    html = render_html(db, "m1")
    m = re.search(r'<section [^>]*data-section="scaling">(.*?)</section>', html, re.S)
    assert m, "no scaling section"
    body = m.group(1)
    assert "m1 (this run)" in body and "<svg" in body and sid in body
    assert f"slope {res['slope']:.4g} per decade" in body
    # negative control: a run outside the study has no scaling section
    _planted(db, "other", 1e6, 1.0, 9)
    assert 'data-section="scaling"' not in render_html(db, "other")
