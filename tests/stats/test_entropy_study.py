"""``study entropy``: exact sink/content split of an entropy change between two states (§4)."""

from __future__ import annotations

import numpy as np
import pytest

from attnbase.errors import StatsError
from attnbase.stats import compositional as comp
from attnbase.stats.entropy_study import entropy_study


@pytest.fixture
def two_checkpoints(db):
    from synth import ingest_synthetic, make_info, make_run_arrays

    info = make_info(n_layers=3, n_heads=2)
    keys, early = make_run_arrays(info, n_seqs=4, T=10, seed=0)
    _, late = make_run_arrays(info, n_seqs=4, T=10, sink_layers=(1, 2), sink_logit=3.0, seed=1)
    ingest_synthetic(db, "early", info, keys, early)
    ingest_synthetic(db, "late", info, keys, late)
    return db, early, late


def test_split_per_layer_matches_a_direct_computation(two_checkpoints):
    db, early, late = two_checkpoints
    sid, summary = entropy_study(db, runs=("early", "late"))
    za, zb = early[..., 2:, :].astype(np.float64), late[..., 2:, :].astype(np.float64)
    ch = comp.entropy_change(comp.sink_mass_from_logits(za), comp.content_entropy(za),
                             comp.sink_mass_from_logits(zb), comp.content_entropy(zb))
    for l in range(3):
        sink = ch.sink_part[l].mean()
        dh = comp.entropy(zb[l]).mean() - comp.entropy(za[l]).mean()
        assert summary[f"L{l}"]["d_entropy"] == pytest.approx(dh, abs=1e-9)
        assert summary[f"L{l}"]["sink_part"] == pytest.approx(sink, abs=1e-9)
        assert summary[f"L{l}"]["sink_share"] == pytest.approx(sink / dh, rel=1e-7)
    # layers with a new sink lose entropy mostly through the sink
    assert summary["L2"]["d_entropy"] < 0 and summary["L2"]["sink_share"] > 0.5
    with db.connect(read_only=True) as con:
        n, worst = con.execute(
            "SELECT count(*), max(abs(d_entropy - sink_part - content_part)) FROM entropy_change "
            "WHERE study_id = ?", [sid]).fetchone()
        resid = con.execute("SELECT value FROM study_results WHERE study_id = ? AND "
                            "key = 'split_max_residual'", [sid]).fetchone()[0]
        kind, runs = con.execute("SELECT kind, run_ids FROM studies WHERE study_id = ?",
                                 [sid]).fetchone()
    assert n == 6 and worst < 1e-12 and resid < 1e-9
    assert kind == "entropy_change" and runs == ["early", "late"]
    with db.connect(read_only=True) as con:
        share = con.execute("SELECT value FROM study_summary WHERE runs = 'early,late' "
                            "AND key = 'sink_share/L2'").fetchone()[0]
    assert share == pytest.approx(summary["L2"]["sink_share"])


def test_layer_mode_and_refusals(two_checkpoints, tmp_path):
    db, early, _ = two_checkpoints
    sid, summary = entropy_study(db, run="early", layers=(0, 2))
    assert set(summary) == {"L2", "all"}
    from synth import ingest_synthetic, make_info, make_run_arrays

    info = make_info(n_layers=3, n_heads=2)
    keys, z = make_run_arrays(info, n_seqs=5, T=10, seed=3)
    ingest_synthetic(db, "other", info, keys, z)
    with pytest.raises(StatsError, match="same windows"):
        entropy_study(db, runs=("early", "other"))
    with pytest.raises(StatsError, match="out of range"):
        entropy_study(db, run="early", layers=(0, 7))
