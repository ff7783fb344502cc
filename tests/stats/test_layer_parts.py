"""The analysis fan-out's pieces without a cluster: layer parts computed one by one with the
catalog moved away (as a worker on another machine sees it) and combined by write_analysis give
exactly the rows of analyze_run; and analyze_run is the same bits every time (its attention
aggregates are single-threaded sums in file order)."""

import numpy as np
import pytest
from synth import ingest_synthetic, make_info, make_run_arrays

from attnbase.errors import StatsError
from attnbase.stats.analyze import RESULT_TABLES, analysis_plan, analyze_run, write_analysis
from attnbase.stats.layer_parts import layer_part

FAST = dict(draws=5, gauss_draws=20, seed=3, n_boot=200)


@pytest.fixture
def gqa_run(db):
    info = make_info(n_layers=3, n_heads=4, n_kv_heads=2, d_head=16, causal=True)
    keys, logits = make_run_arrays(info, n_seqs=6, T=24, sink_layers=(2,), sink_logit=5.0,
                                   rank_layers=(1,), rank=2)
    ingest_synthetic(db, "g", info, keys, logits)
    return db


def snapshot(db, run):
    with db.connect(read_only=True) as con:
        return {t: con.sql(f"SELECT * EXCLUDE (run_id) FROM {t} WHERE run_id = ? ORDER BY ALL",
                           params=[run]).pl() for t in RESULT_TABLES}


def test_parts_without_the_catalog_equal_analyze_run(gqa_run):
    db = gqa_run
    analyze_run(db, "g", **FAST)
    one = snapshot(db, "g")
    analyze_run(db, "g", **FAST)
    assert all(snapshot(db, "g")[t].equals(one[t]) for t in RESULT_TABLES)  # repeatable
    plan = analysis_plan(db, "g", **FAST)
    assert [j.layer for j in plan.jobs] == [0, 1, 2] and all(j.keys and j.attention
                                                             for j in plan.jobs)
    hidden = db.catalog_path.with_name("moved.duckdb")
    db.catalog_path.rename(hidden)  # a worker has no catalog
    try:
        parts = [layer_part(job) for job in reversed(plan.jobs)]  # any order
    finally:
        hidden.rename(db.catalog_path)
    with db.transaction() as con:  # the combination replaces every row
        for t in RESULT_TABLES:
            con.execute(f"DELETE FROM {t} WHERE run_id = 'g'")
    out = write_analysis(db, plan, parts)
    two = snapshot(db, "g")
    for t in RESULT_TABLES:
        assert two[t].height > 0 and two[t].equals(one[t]), t
    assert out["seed"] == 3.0
    # negative control: another seed gives other null tests, so equality above is not vacuous
    analyze_run(db, "g", **{**FAST, "seed": 4})
    assert not snapshot(db, "g")["null_tests"].equals(one["null_tests"])


def test_missing_layer_part_is_refused(gqa_run):
    db = gqa_run
    plan = analysis_plan(db, "g", **FAST)
    parts = [layer_part(job) for job in plan.jobs[:2]]
    with pytest.raises(StatsError, match="do not match its jobs"):
        write_analysis(db, plan, parts)
    # nothing was written
    assert all(h == 0 for h in (snapshot(db, "g")[t].height for t in RESULT_TABLES))
    assert np.isfinite(parts[0].keys[0]).all()
