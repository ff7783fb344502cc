"""The only place flows touch the stages: thin, late-bound calls into the runner, stats and reports.

Every function here resolves its stage at call time, so that (1) importing ``attnbase.flows``
does not import torch or open a catalog, and (2) tests can monkeypatch one seam.
The database travels between processes as its directory (a ``str``), never as an open
:class:`~attnbase.warehouse.Database`, because Dask workers are separate processes.

Retries: none here. A catalog held by another process (a Dask worker committing its batch) is
waited for inside the warehouse, the one retry policy of the write path
(:meth:`attnbase.warehouse.catalog.Database._open`, ``lock_timeout`` =
:data:`FLOW_LOCK_TIMEOUT_S` for the flows' databases); every other error, a run-config conflict
included, fails the task at once and the ledger makes a rerun resume.
"""

from __future__ import annotations

from typing import Any

#: Seconds a flow's catalog connection waits for another process's lock. Each batch commits
#: one ledger row (its statistics are files), so a waiting worker waits milliseconds; the bound
#: is generous for a loaded machine, and a lock held longer than this is a real failure.
FLOW_LOCK_TIMEOUT_S = 60.0


def open_db(db_dir: str):
    from attnbase.warehouse import Database

    return Database(db_dir, lock_timeout=FLOW_LOCK_TIMEOUT_S)


def prepare_run(db_dir: str, run_id: str, cfg, overwrite: bool):
    """Register the run (or find it again) -> RunPlan with the ledger's pending batches."""
    from attnbase import runner

    return runner.prepare_run(open_db(db_dir), run_id, cfg, overwrite)


def run_batch(db_dir: str, plan, batch: int):
    """Capture and write one batch, then mark it complete in the ledger."""
    from attnbase import runner

    return runner.run_batch(plan, batch)


def finish_run(db_dir: str, plan):
    from attnbase import runner

    return runner.finish_run(plan)


def analysis_families() -> tuple[str, ...]:
    """Names of the statistics families stats.analyze can run one at a time; () if it cannot."""
    from attnbase.stats import analyze

    fams = getattr(analyze, "FAMILIES", None)
    if fams is None or not hasattr(analyze, "analyze_family"):
        return ()
    return tuple(fams)


def analyze_family(db_dir: str, run_id: str, family: str, draws: int, seed: int):
    from attnbase.stats import analyze

    return analyze.analyze_family(open_db(db_dir), run_id, family, draws=draws, seed=seed)


def finish_analysis(db_dir: str, run_id: str):
    """Whatever stats does after its families (views, run-level summaries); nothing if it has none."""
    from attnbase.stats import analyze

    fn = getattr(analyze, "finish_analysis", None)
    if fn is None:
        return None
    return fn(open_db(db_dir), run_id)


def analyze_run(db_dir: str, run_id: str, draws: int, seed: int):
    from attnbase.stats import analyze

    return analyze.analyze_run(open_db(db_dir), run_id, draws=draws, seed=seed)


def build_report(db_dir: str, run_id: str, compare: tuple[str, ...] = (), out_dir: str | None = None):
    from attnbase.reports import build_report as _build

    return _build(db_dir, run_id, compare=tuple(compare), out_dir=out_dir)
