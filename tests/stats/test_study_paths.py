"""``attnbase study paths``: path products of a run's captured attention into studies."""

import numpy as np
import pytest
from synth import ingest_synthetic, make_info, make_run_arrays, softmax

from attnbase.studies.paths import paths_study
from attnbase.errors import StatsError
from attnbase.stats.depth import path_ratio_draws


def test_paths_study_rows_match_the_statistic(db):
    info = make_info(n_layers=3, n_heads=2, d_head=4, causal=True)
    keys, logits = make_run_arrays(info, n_seqs=3, T=8, sink_layers=(1, 2), sink_logit=3.0)
    ingest_synthetic(db, "p", info, keys, logits)
    sid, res = paths_study(db, "p", draws=5, seed=2)
    want = path_ratio_draws(softmax(logits.astype(np.float64)), draws=5, seed=2)
    for k in (1, 2, 3):
        assert res[f"ratio_median/{k}"] == pytest.approx(np.median(want[k]), rel=1e-5)
        assert res[f"ratio_mean/{k}"] == pytest.approx(want[k].mean(), rel=1e-5)
        assert res[f"n/{k}"] == 15
    with db.connect(read_only=True) as con:
        kind, runs = con.execute("SELECT kind, run_ids FROM studies WHERE study_id=?", [sid]).fetchone()
        n = con.execute("SELECT count(*) FROM study_results WHERE study_id=?", [sid]).fetchone()[0]
    assert kind == "paths" and runs == ["p"] and n == len(res) == 3 * 8
    # longer paths collapse further (medians decrease with length on this sink-heavy run)
    med = [res[f"ratio_median/{k}"] for k in (1, 2, 3)]
    assert med[0] > med[1] > med[2]
    # re-running replaces the study; the other order is another study
    paths_study(db, "p", draws=5, seed=2)
    sid2, _ = paths_study(db, "p", draws=5, seed=2, order="ascending")
    with db.connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM studies").fetchone()[0] == 2
    assert sid2 != sid


def test_paths_study_errors(db):
    info = make_info(n_layers=2, n_heads=2, d_head=4)
    keys, logits = make_run_arrays(info, n_seqs=2, T=6)
    ingest_synthetic(db, "k", info, keys, logits)
    with db.transaction() as con:  # a run that did not capture logits
        con.execute("DELETE FROM arrays WHERE run_id='k' AND name='attn_logits'")
    with pytest.raises(StatsError, match="no 'attn_logits' array"):
        paths_study(db, "k")
    with pytest.raises(StatsError, match="unknown --order"):
        paths_study(db, "k", order="reverse")
