"""Prefect tasks: each wraps exactly one stage call from :mod:`attnbase.flows._stages`.

Retries: none at this level. The write path has one retry policy, in the warehouse: a catalog
held by another process is waited for (``DuckDBFileBackend.open``, see
:mod:`attnbase.flows._stages`).
Every other failure is either deterministic (a bad config, an unknown model, a run-config
conflict: a retry fails the same way after its delay) or a crash the resume ledger already
recovers from: rerunning the flow submits exactly the batches still pending.

Caching: none. The resume ledger (``batches`` and ``stat_files``) is the source of truth: a flow
submits a batch task only for the batches the ledger lists as pending, and the run's next writer
removes the files of those batches (:func:`attnbase.warehouse.catalog.statledger.remove_unlisted`), so a
batch task's earlier result (a worker wrote the batch, the flow died before marking it) names
files that are gone: every pending batch is computed again.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from attnbase.flows import _stages


def plan_pending(plan: Any) -> tuple[int, ...]:
    """Batch indices the ledger lists as not yet complete."""
    return tuple(int(b) for b in plan.pending)


@task(name="prepare-run", task_run_name="prepare {run_id}", cache_policy=NO_CACHE)
def prepare_run_task(db_dir: str, run_id: str, cfg: Any, overwrite: bool = False,
                     store: str | None = None, wait: bool = False) -> Any:
    """Register ``run_id`` in the catalog (or find it again) and return its RunPlan."""
    return _stages.prepare_run(db_dir, run_id, cfg, overwrite, store, wait)


@task(name="extract-batch", task_run_name="extract {plan.run_id} batch {batch}",
      cache_policy=NO_CACHE, persist_result=False)
def extract_batch(db_dir: str, plan: Any, batch: int,
                  versions: dict[str, str] | None = None) -> dict[str, Any]:
    """Capture one batch and write its chunks and statistics files to the run's store; return
    its ledger entry (``run_id``, ``batch``, ``files``, ``created_at``, ``seconds``), which the
    flow process marks in the catalog: a worker never opens the catalog.

    ``versions``: the coordinator's attnbase/torch/transformers; a worker that differs refuses.
    """
    _stages.check_versions(versions)
    t0 = time.perf_counter()
    entry = dict(_stages.run_batch(db_dir, plan, batch))
    entry["seconds"] = round(time.perf_counter() - t0, 3)
    return entry


@task(name="finish-run", task_run_name="finish {plan.run_id}", cache_policy=NO_CACHE)
def finish_run_task(db_dir: str, plan: Any) -> Any:
    """Mark the run complete once the ledger has every batch."""
    return _stages.finish_run(db_dir, plan)


@task(name="analyze-family", task_run_name="analyze {run_id} {family}", cache_policy=NO_CACHE)
def analyze_family_task(db_dir: str, run_id: str, family: str, draws: int, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    _stages.analyze_family(db_dir, run_id, family, draws, seed)
    return {"run_id": run_id, "family": family, "seconds": round(time.perf_counter() - t0, 3)}


@task(name="finish-analysis", task_run_name="finish analysis {run_id}", cache_policy=NO_CACHE)
def finish_analysis_task(db_dir: str, run_id: str) -> None:
    _stages.finish_analysis(db_dir, run_id)


@task(name="analyze-run", task_run_name="analyze {run_id}", cache_policy=NO_CACHE)
def analyze_run_task(db_dir: str, run_id: str, draws: int, seed: int,
                     wait: bool = False) -> dict[str, Any]:
    """All statistics of a run in one task (when stats offers no per-family entry point)."""
    t0 = time.perf_counter()
    _stages.analyze_run(db_dir, run_id, draws, seed, wait)
    return {"run_id": run_id, "family": "all", "seconds": round(time.perf_counter() - t0, 3)}


@task(name="analyze-layer", task_run_name="analyze {job.run_id} layer {job.layer}",
      cache_policy=NO_CACHE, persist_result=False)
def analyze_layer_task(job: Any, versions: dict[str, str] | None = None) -> Any:
    """One layer's part of a run's analysis (:mod:`attnbase.stats.layer_parts`), on a worker:
    reads the run's store and statistics files, returns the results to the flow process,
    which alone writes the catalog. A worker whose versions differ refuses (one line)."""
    _stages.check_versions(versions)
    return _stages.analyze_layer(job)


@task(name="write-analysis", task_run_name="write analysis {plan.run_id}", cache_policy=NO_CACHE,
      persist_result=False)
def write_analysis_task(db_dir: str, plan: Any, parts: list[Any]) -> dict[str, Any]:
    """In the flow process: combine a run's layer parts and write its result tables."""
    return _stages.write_analysis(db_dir, plan, parts)


@task(name="build-report", task_run_name="report {run_id}", cache_policy=NO_CACHE)
def build_report_task(db_dir: str, run_id: str, compare: tuple[str, ...] = (),
                      out_dir: str | None = None) -> Any:
    return _stages.build_report(db_dir, run_id, tuple(compare), out_dir)
