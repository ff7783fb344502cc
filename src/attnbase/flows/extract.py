"""The ``extract`` flow: one task per pending batch of one or more runs, resumable via the ledger."""

from __future__ import annotations

import time
from typing import Any, Sequence

from prefect import flow, get_run_logger

from attnbase.extract.config import ExtractConfig
from attnbase.contract import DEFAULT_CAPTURE
from attnbase.flows import tasks
from attnbase.flows.errors import FlowStageError
from attnbase.flows.runners import make_task_runner


def extract_runs(runner: Any, db_dir: str, shards: Sequence[tuple[str, ExtractConfig]],
                 overwrite: bool = False, store: str | None = None,
                 wait: bool = False) -> dict[str, dict[str, Any]]:
    """Prepare every run, submit all their pending batches at once, then finish each run.

    Must be called inside a flow with a *started* task runner. Registration and finishing run
    in the flow process (one short catalog transaction each); the batches of all runs go to
    ``runner`` together, so shards (model x corpus) proceed in parallel. Each batch task writes
    its chunks and statistics files to the run's store (``store``: ``s3://...`` shared by
    workers on any machine) and returns its ledger entry; only this process, the coordinator,
    writes the catalog (a mark per finished batch), so DuckDB's one-writer rule holds. Raises
    :class:`FlowStageError` naming the run and batches that failed; runs
    whose batches all succeeded are finished first, and the failed ones stay resumable.
    ``wait``: a run another process is writing is waited for (its lease), then resumed or
    found complete, instead of refused.
    """
    t0 = time.perf_counter()
    # every shard's model-free checks first, so a bad corpus or --seq-len fails the flow in
    # seconds, before any model loads or any run is registered (as the extract command does)
    from attnbase.runner import preflight_run

    for run_id, cfg in shards:
        preflight_run(run_id, cfg)
    from attnbase.flows import _stages

    plans = {run_id: tasks.prepare_run_task(db_dir, run_id, cfg, overwrite, store, wait)
             for run_id, cfg in shards}
    versions = _stages.versions()
    futures = {
        run_id: [(b, runner.submit(tasks.extract_batch,
                                   parameters={"db_dir": db_dir, "plan": plan, "batch": b,
                                               "versions": versions}))
                 for b in tasks.plan_pending(plan)]
        for run_id, plan in plans.items()
    }
    out: dict[str, dict[str, Any]] = {}
    failed: dict[str, list[int]] = {}
    why: list[str] = []
    for run_id, futs in futures.items():
        bad = []
        for b, fut in futs:
            fut.wait()
            if not fut.state.is_completed():
                bad.append(b)
                err = fut.state.result(raise_on_failure=False)
                if isinstance(err, BaseException) and not why:
                    why.append(str(err).strip().splitlines()[0] if str(err).strip()
                               else type(err).__name__)
                continue
            _stages.mark_batches(plans[run_id], [fut.result()])  # the coordinator's write
        if bad:
            failed[run_id] = bad
            continue
        tasks.finish_run_task(db_dir, plans[run_id])
        out[run_id] = {"submitted": [b for b, _ in futs], "status": "complete"}
    log = get_run_logger()
    log.info("extracted %d run(s) in %.1f s", len(out), time.perf_counter() - t0)
    if failed:
        what = "; ".join(f"run {r!r} batches {b}" for r, b in failed.items())
        first = f" (first error: {why[0]})" if why else ""
        raise FlowStageError(f"extraction failed for {what}{first}; rerun the same command "
                             f"to resume (finished batches are kept)")
    return out


@flow(name="attnbase-extract")
def extract_flow(db: str, run_id: str, model: str, corpus: str = "default", seqs: int = 8,
                 seq_len: int = 64, batch_size: int = 4, dtype: str = "float32",
                 capture: list[str] | None = None, seed: int = 0, device: str = "cpu",
                 overwrite: bool = False, task_runner: str = "local",
                 workers: int = 2, bos: str = "auto", store: str | None = None,
                 dask_address: str = "") -> dict[str, Any]:
    """Extract one run, a task per pending batch; rerunning it resumes where the ledger stopped."""
    cfg = ExtractConfig(model=model, corpus=corpus, n_seqs=seqs, seq_len=seq_len,
                        batch_size=batch_size, dtype=dtype, capture=tuple(capture or DEFAULT_CAPTURE), seed=seed,
                        device=device, bos=bos)
    with make_task_runner(task_runner, workers, dask_address) as runner:
        return extract_runs(runner, db, [(run_id, cfg)], overwrite, store)[run_id]
