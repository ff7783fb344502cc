"""The ``analyze`` flow: one task per statistics family (or per run, if stats has no families),
or, on a Dask cluster, one task per (run, layer).

Fan-out rule: with ``task_runner = "dask"`` a run's analysis is split into its layers
(:mod:`attnbase.stats.layer_parts`): each worker reads one layer of the run's store and
statistics files (a local path or an ``s3://`` URL, never the catalog) and returns its results;
the flow process combines them (null tests and q-values over all heads, means, onset,
``r_cv_share``) and alone writes the catalog, so the rows equal those of ``attnbase analyze``
exactly. With the local runner a run is one task in this process (threads over kv heads),
which is faster for small runs on one machine (benchmarks/RESULTS.md: "analysis fanned out").
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from prefect import flow

from attnbase.flows import _stages, tasks
from attnbase.flows.errors import FlowStageError
from attnbase.flows.runners import make_task_runner
from attnbase.stats.defaults import NULL_DRAWS


def analyze_runs(runner: Any, db_dir: str, run_ids: Sequence[str], draws: int,
                 seed: int, fan_out: bool = False,
                 wait: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Submit every (run, family) to ``runner``; then each run's finishing step in the flow
    process. ``fan_out`` (the Dask runner): every (run, layer) instead, see the module doc.
    ``wait``: a run's analysis waits for another process holding the run's lease instead of
    refusing."""
    if fan_out:
        return analyze_layers(runner, db_dir, run_ids, draws, seed)
    families = _stages.analysis_families()
    subs: dict[str, list[tuple[str, Any]]] = {}
    for run_id in run_ids:
        if families:
            subs[run_id] = [(fam, runner.submit(tasks.analyze_family_task, parameters={
                "db_dir": db_dir, "run_id": run_id, "family": fam, "draws": draws, "seed": seed}))
                for fam in families]
        else:
            subs[run_id] = [("all", runner.submit(tasks.analyze_run_task, parameters={
                "db_dir": db_dir, "run_id": run_id, "draws": draws, "seed": seed,
                "wait": wait}))]
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


def analyze_layers(runner: Any, db_dir: str, run_ids: Sequence[str], draws: int,
                   seed: int) -> dict[str, list[dict[str, Any]]]:
    """Every (run, layer) to ``runner`` at once; each run's parts combined and written here."""
    versions = _stages.versions()
    plans = {run_id: _stages.analysis_plan(db_dir, run_id, draws, seed) for run_id in run_ids}
    subs = {run_id: [(job.layer, runner.submit(tasks.analyze_layer_task, parameters={
        "job": job, "versions": versions})) for job in plan.jobs]
        for run_id, plan in plans.items()}
    for run_id, plan in plans.items():  # while the workers run
        _stages.prime_analysis(db_dir, plan)
    out: dict[str, list[dict[str, Any]]] = {}
    failed: dict[str, list[int]] = {}
    why: list[str] = []
    for run_id, futs in subs.items():
        parts, bad = [], []
        for layer, fut in futs:
            fut.wait()
            if fut.state.is_completed():
                parts.append(fut.result())
                continue
            bad.append(layer)
            err = fut.state.result(raise_on_failure=False)
            if isinstance(err, BaseException) and not why:
                why.append(str(err).strip().splitlines()[0] if str(err).strip()
                           else type(err).__name__)
        if bad:
            failed[run_id] = bad
            continue
        t0 = time.perf_counter()
        tasks.write_analysis_task(db_dir, plans[run_id], parts)
        out[run_id] = [{"run_id": run_id, "family": "layers", "layers": len(parts),
                        "worker_seconds": round(sum(p.seconds for p in parts), 3),
                        "write_seconds": round(time.perf_counter() - t0, 3)}]
    if failed:
        what = "; ".join(f"run {r!r} layers {b}" for r, b in failed.items())
        first = f" (first error: {why[0]})" if why else ""
        raise FlowStageError(f"analysis failed for {what}{first}; fix it and rerun the same "
                             "command (the result tables of a run are replaced whole)")
    return out


@flow(name="attnbase-analyze")
def analyze_flow(db: str, run_id: str, draws: int = NULL_DRAWS, seed: int = 0, task_runner: str = "local",
                 workers: int = 2, dask_address: str = "") -> list[dict[str, Any]]:
    """All statistics of one extracted run: one task per family, or per layer on Dask."""
    with make_task_runner(task_runner, workers, dask_address) as runner:
        return analyze_runs(runner, db, [run_id], draws, seed,
                            fan_out=task_runner == "dask")[run_id]
