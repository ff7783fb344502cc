"""The pipeline's ``studies`` key: validation and the studies task (plain function, no server)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnbase.flows.config import parse_pipeline_config
from attnbase.flows.errors import PipelineConfigError

sys.path.insert(0, str(Path(__file__).parent.parent / "stats"))

CAPTURE_ALL = ["keys", "queries", "logits"]


def test_studies_key_is_validated():
    cfg = parse_pipeline_config({"models": ["tiny-gpt2"], "studies": ["distances", "reversal"],
                                 "study_max_rows": 100})
    assert cfg.studies == ("distances", "reversal") and cfg.study_max_rows == 100
    assert parse_pipeline_config({"models": ["tiny-gpt2"]}).studies == ()
    with pytest.raises(PipelineConfigError, match="unknown study 'pruning'.*distances"):
        parse_pipeline_config({"models": ["m"], "studies": ["pruning"]})
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


def test_a_pipeline_offers_every_study_the_cli_runs():
    from attnbase.commands.study import register, study_app
    from attnbase.flows.studies import PIPELINE_STUDIES

    if not study_app.registered_commands:
        import typer

        register(typer.Typer())
    cli = {c.name for c in study_app.registered_commands}
    assert cli == set(PIPELINE_STUDIES) and len(cli) == 8
    from attnbase.metrics import STUDY_KINDS
    from attnbase.studies.kinds import STORED_KIND

    # every study kind whose results are registered is one a pipeline can run
    assert sorted(STORED_KIND[k] for k in PIPELINE_STUDIES) == sorted(STUDY_KINDS)
    cfg = parse_pipeline_config({"models": ["a", "b", "c"], "studies": list(PIPELINE_STUDIES),
                                 "capture": CAPTURE_ALL})
    assert cfg.studies == PIPELINE_STUDIES


def test_a_kind_that_needs_more_is_refused_in_one_line():
    with pytest.raises(PipelineConfigError, match="'paths', which reads stored logits; add "
                                                  '"logits" to capture'):
        parse_pipeline_config({"models": ["m"], "studies": ["paths"]})
    with pytest.raises(PipelineConfigError, match="'scaling', which compares 3 or more runs; "
                                                  "the config makes 2: list more models"):
        parse_pipeline_config({"models": ["a", "b"], "studies": ["scaling"]})
    assert parse_pipeline_config({"models": ["m"], "studies": ["paths"],
                                  "capture": ["logits"]}).studies == ("paths",)


@pytest.mark.slow
def test_every_study_kind_runs_through_the_flow_tasks(tmp_path):
    """Each one-run kind through the studies task on a tiny-gpt2 run, then scaling through the
    group task on three planted runs of different sizes: one ``studies`` row per kind."""
    from dataclasses import replace

    from synth import ingest_synthetic, make_info, make_run_arrays

    from attnbase.extract import ExtractConfig
    from attnbase.flows.studies import run_group_studies_task, run_studies_task
    from attnbase.runner import extract_run
    from attnbase.studies.kinds import GROUP_KINDS, RUN_KINDS, STORED_KIND
    from attnbase.warehouse import Database

    db = Database(tmp_path / "db")
    extract_run(db, "t", ExtractConfig(model="tiny-gpt2", corpus="default", n_seqs=4, seq_len=24,
                                       batch_size=4, capture=tuple(CAPTURE_ALL), device="cpu"),
                progress=False)
    out = run_studies_task.fn(str(db.path), "t", tuple(reversed(RUN_KINDS)), 40, 0, "cpu")
    assert list(out) == list(RUN_KINDS)
    for i, n_params in enumerate((2e5, 3e6, 4e7)):
        info = replace(make_info(n_layers=2, n_heads=2, causal=False), n_params=int(n_params))
        keys, z = make_run_arrays(info, n_seqs=2, T=8, sink_layers=(0, 1),
                                  sink_logit=0.5 + 0.8 * i, seed=i)
        ingest_synthetic(db, f"m{i}", info, keys, z)
    group = run_group_studies_task.fn(str(db.path), ("m0", "m1", "m2"), ("scaling", "paths"))
    assert list(group) == list(GROUP_KINDS)
    with db.connect(read_only=True) as con:
        kinds = dict(con.execute("SELECT study_id, kind FROM studies").fetchall())
        prune_model = con.execute("SELECT params->>'model' FROM studies WHERE kind = 'prune'"
                                  ).fetchone()[0]
    assert [kinds[sid] for sid in [*out.values(), *group.values()]] == [
        STORED_KIND[k] for k in RUN_KINDS + GROUP_KINDS]
    assert set(kinds.values()) == {"distances", "reversal", "clusters", "paths", "r_conventions",
                                   "entropy_change", "prune", "scaling"}
    assert prune_model == "tiny-gpt2"  # the run's own model, as the catalog records it
