"""Tasks through ``task.fn`` with fake stages: each task is one stage call, nothing more."""

from __future__ import annotations

import pytest

from attnbase.extract.config import ExtractConfig
from attnbase.flows import _stages, tasks
from attnbase.flows.config import PipelineConfigError
from attnbase.flows.runners import make_task_runner


def test_prepare_and_batch_tasks_call_the_stage(fake_stages):
    cfg = ExtractConfig(model="tiny-gpt2", n_seqs=10, batch_size=4)
    plan = tasks.prepare_run_task.fn("db", "r1", cfg, False)
    assert plan.pending == (0, 1, 2)
    out = tasks.extract_batch.fn("db", plan, 1)
    assert out["run_id"] == "r1" and out["batch"] == 1 and out["seconds"] >= 0
    assert fake_stages.captures[("r1", 1)] == 1
    assert fake_stages.ledger["r1"] == set()  # a worker's task never writes the ledger...
    _stages.mark_batches(plan, [out])  # ...the coordinator marks the entry it returned
    assert fake_stages.ledger["r1"] == {1}
    assert tasks.prepare_run_task.fn("db", "r1", cfg, False).pending == (0, 2)  # ledger resumes


def test_tasks_do_not_retry_one_policy_lives_in_the_warehouse():
    """No Prefect task of any flows module retries; the one retry policy is the catalog's lock
    wait (DuckDBFileBackend.open)."""
    import importlib
    import pkgutil

    from prefect import Task

    import attnbase.flows

    found = []
    for info in pkgutil.iter_modules(attnbase.flows.__path__):
        mod = importlib.import_module(f"attnbase.flows.{info.name}")
        found += [t for t in vars(mod).values() if isinstance(t, Task)]
    assert {t.name for t in found} >= {"studies", tasks.extract_batch.name}
    for t in found:
        assert not t.retries, t.name
    # nor does a batch task answer from a cache: the rerun after a crash removes the files of
    # every batch the ledger did not count (tests/flows/test_flow_real.py shows it)
    assert tasks.extract_batch.cache_key_fn is None and not tasks.extract_batch.persist_result
    assert _stages.open_db("x").lock_timeout == _stages.FLOW_LOCK_TIMEOUT_S


def test_config_conflict_fails_the_prepare_task_at_once(tmp_path):
    """A real conflict through the real stage: one call, no retry, the one-line message."""
    import time

    from fakes_path import ensure_fakes_path  # noqa: F401  (tests/warehouse on sys.path)
    from fakes import fake_batches, fake_config, fake_info

    from attnbase.errors import RunConfigConflictError
    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database
    from attnbase.warehouse.runs.writer import RunWriter

    info, cfg = fake_info(), fake_config()
    ingest_batches(Database(tmp_path), "c", cfg, info=info, corpus="default", corpus_hash="c",
                   batches=fake_batches(info, cfg), progress=False)
    spec = fake_config(seq_len=8).run_spec(info, corpus="default", corpus_hash="c")
    t0 = time.perf_counter()
    with pytest.raises(RunConfigConflictError, match="seq_len 6 -> 8"):
        RunWriter.open(_stages.open_db(str(tmp_path)), "c", spec)
    assert time.perf_counter() - t0 < 5


def test_analysis_and_report_tasks(fake_stages):
    assert tasks.analyze_family_task.fn("db", "r1", "norms", 10, 0)["family"] == "norms"
    tasks.finish_analysis_task.fn("db", "r1")
    assert tasks.analyze_run_task.fn("db", "r2", 10, 0)["family"] == "all"
    assert fake_stages.analyzed == [("r1", "norms"), ("r1", "<finish>"), ("r2", "all")]
    out = tasks.build_report_task.fn("db", "r1", ["r2"], None)
    assert fake_stages.reports == [("r1", ("r2",))] and out["html"].endswith("r1/report.html")


def test_make_task_runner_kinds():
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    local = make_task_runner("local", 3)
    assert isinstance(local, ThreadPoolTaskRunner)
    dask = make_task_runner("dask", 2)
    assert isinstance(dask, DaskTaskRunner)
    assert dask.cluster_kwargs["processes"] is True and dask.cluster_kwargs["n_workers"] == 2
    with pytest.raises(PipelineConfigError, match="unknown task runner 'ray'"):
        make_task_runner("ray")


def test_analysis_families_falls_back_to_analyze_run(monkeypatch):
    import sys
    import types

    mod = types.ModuleType("attnbase.stats.analyze")
    mod.analyze_run = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "attnbase.stats.analyze", mod)
    import attnbase.stats as stats_pkg

    monkeypatch.setattr(stats_pkg, "analyze", mod, raising=False)
    assert _stages.analysis_families() == ()
    mod.FAMILIES = ("norms", "geometry")
    mod.analyze_family = lambda *a, **k: None
    assert _stages.analysis_families() == ("norms", "geometry")


def test_a_worker_with_other_versions_is_refused_in_one_line(fake_stages):
    """The coordinator's attnbase/torch/transformers travel with every batch task; a worker
    that differs refuses before capturing anything (its bytes would differ)."""
    from attnbase.flows.errors import FlowStageError

    cfg = ExtractConfig(model="tiny-gpt2", n_seqs=10, batch_size=4)
    plan = tasks.prepare_run_task.fn("db", "r1", cfg, False)
    mine = _stages.versions()
    assert set(mine) == {"attnbase", "torch", "transformers"}
    assert tasks.extract_batch.fn("db", plan, 0, versions=mine)["batch"] == 0  # same: runs
    with pytest.raises(FlowStageError) as err:
        tasks.extract_batch.fn("db", plan, 1, versions={**mine, "torch": "0.0.1"})
    msg = str(err.value)
    assert "\n" not in msg and "refused" in msg and "torch" in msg and "0.0.1" in msg
    assert fake_stages.captures[("r1", 1)] == 0  # nothing captured
    # the analysis fan-out's layer tasks likewise (before reading anything of the job)
    with pytest.raises(FlowStageError, match=r"refused: .*transformers .*\(coordinator 9.9\)"):
        tasks.analyze_layer_task.fn(None, versions={**mine, "transformers": "9.9"})


def test_store_and_dask_address_keys():
    from attnbase.flows.config import parse_pipeline_config

    cfg = parse_pipeline_config({"models": ["tiny-gpt2"], "task_runner": "dask",
                                 "dask_address": "tcp://10.0.0.5:8786", "store": "s3://bkt/runs"})
    assert (cfg.dask_address, cfg.store) == ("tcp://10.0.0.5:8786", "s3://bkt/runs")
    for bad, word in (({"dask_address": "tcp://h:1"}, "needs task_runner"),
                      ({"task_runner": "dask", "dask_address": "h:8786"}, "dask_address"),
                      ({"store": "s3://Bad_Bucket/x"}, "bucket")):
        with pytest.raises(PipelineConfigError) as err:
            parse_pipeline_config({"models": ["tiny-gpt2"], **bad})
        assert word in str(err.value) and "\n" not in str(err.value)
