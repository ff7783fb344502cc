"""The pipeline's ``studies`` key: validation and the studies task (plain function, no server)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnbase.flows.config import parse_pipeline_config
from attnbase.flows.errors import PipelineConfigError

sys.path.insert(0, str(Path(__file__).parent.parent / "stats"))


def test_studies_key_is_validated():
    cfg = parse_pipeline_config({"models": ["tiny-gpt2"], "studies": ["distances", "reversal"],
                                 "study_max_rows": 100})
    assert cfg.studies == ("distances", "reversal") and cfg.study_max_rows == 100
    assert parse_pipeline_config({"models": ["tiny-gpt2"]}).studies == ()
    with pytest.raises(PipelineConfigError, match="unknown study 'prune'.*distances"):
        parse_pipeline_config({"models": ["m"], "studies": ["prune"]})
    with pytest.raises(PipelineConfigError, match='capture "queries" and "keys".*or add "logits"'):
        parse_pipeline_config({"models": ["m"], "studies": ["distances"], "capture": ["keys"]})
    # the default capture derives the logits from queries and keys: studies need nothing more
    assert parse_pipeline_config({"models": ["m"], "studies": ["distances"]}).studies == ("distances",)


@pytest.mark.slow
def test_studies_task_runs_distances_then_reversal_and_clusters(tmp_path):
    from synth import ingest_synthetic, make_info, make_run_arrays

    from attnbase.flows.studies import run_studies_task
    from attnbase.warehouse import Database

    db = Database(tmp_path / "db")
    info = make_info(n_layers=2, n_heads=3)
    keys, z = make_run_arrays(info, n_seqs=4, T=10, sink_layers=(1,), seed=5)
    ingest_synthetic(db, "s", info, keys, z)
    out = run_studies_task.fn(str(db.path), "s", ("clusters", "distances", "reversal"), 30, 0)
    assert list(out) == ["distances", "reversal", "clusters"]
    with db.connect(read_only=True) as con:
        kinds = {k for (k,) in con.execute("SELECT kind FROM studies").fetchall()}
        rows = con.execute("SELECT params->>'rows' FROM studies WHERE kind = 'distances'").fetchone()
    assert kinds == {"distances", "reversal", "clusters"} and int(rows[0]) == 30
