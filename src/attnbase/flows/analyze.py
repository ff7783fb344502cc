"""The ``analyze`` flow: one task per statistics family (or per run, if stats has no families)."""

from __future__ import annotations

from typing import Any, Sequence

from prefect import flow

from attnbase.flows import _stages, tasks
from attnbase.flows.errors import FlowStageError
from attnbase.flows.runners import make_task_runner
from attnbase.stats.defaults import NULL_DRAWS


def analyze_runs(runner: Any, db_dir: str, run_ids: Sequence[str], draws: int,
                 seed: int) -> dict[str, list[dict[str, Any]]]:
    """Submit every (run, family) to ``runner``; then each run's finishing step in the flow process."""
    families = _stages.analysis_families()
    subs: dict[str, list[tuple[str, Any]]] = {}
    for run_id in run_ids:
        if families:
            subs[run_id] = [(fam, runner.submit(tasks.analyze_family_task, parameters={
                "db_dir": db_dir, "run_id": run_id, "family": fam, "draws": draws, "seed": seed}))
                for fam in families]
        else:
            subs[run_id] = [("all", runner.submit(tasks.analyze_run_task, parameters={
                "db_dir": db_dir, "run_id": run_id, "draws": draws, "seed": seed}))]
    out: dict[str, list[dict[str, Any]]] = {}
    failed: dict[str, list[str]] = {}
    for run_id, futs in subs.items():
        results, bad = [], []
        for fam, fut in futs:
            fut.wait()
            if fut.state.is_completed():
                results.append(fut.result())
            else:
                bad.append(fam)
        if bad:
            failed[run_id] = bad
            continue
        if families:
            tasks.finish_analysis_task(db_dir, run_id)
        out[run_id] = results
    if failed:
        what = "; ".join(f"run {r!r} families {f}" for r, f in failed.items())
        raise FlowStageError(f"analysis failed for {what}; see the task logs, fix, "
                             f"and rerun `attnbase analyze` for those runs")
    return out


@flow(name="attnbase-analyze")
def analyze_flow(db: str, run_id: str, draws: int = NULL_DRAWS, seed: int = 0, task_runner: str = "local",
                 workers: int = 2) -> list[dict[str, Any]]:
    """All statistics of one extracted run, one task per family."""
    with make_task_runner(task_runner, workers) as runner:
        return analyze_runs(runner, db, [run_id], draws, seed)[run_id]
