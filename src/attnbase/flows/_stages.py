"""The only place flows touch the stages: thin, late-bound calls into the runner, stats and reports.

Every function here resolves its stage at call time, so that (1) importing ``attnbase.flows``
does not import torch or open a catalog, and (2) tests can monkeypatch one seam.
The database travels between processes as its directory (a ``str``), never as an open
:class:`~attnbase.warehouse.Database`, because Dask workers are separate processes.

Retries: none here. A catalog held by another process (a Dask worker committing its batch) is
waited for inside the warehouse, the one retry policy of the write path
(:meth:`attnbase.warehouse.catalog.duckdb_file.DuckDBFileBackend.open`, ``lock_timeout`` =
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


def prepare_run(db_dir: str, run_id: str, cfg, overwrite: bool, store: str | None = None,
                wait: bool = False):
    """Register the run (or find it again) -> RunPlan with the ledger's pending batches;
    ``wait``: for another process holding the run's lease, instead of refusing."""
    from attnbase import runner

    return runner.prepare_run(open_db(db_dir), run_id, cfg, overwrite, store=store, wait=wait)


def run_batch(db_dir: str, plan, batch: int):
    """Capture and write one batch (chunks and statistics files in the run's store); return
    its ledger entry: the coordinator marks it (a worker never writes the catalog)."""
    from attnbase import runner

    return runner.run_batch_unledgered(plan, batch)


def mark_batches(plan, entries: list[dict]) -> None:
    """In the coordinator (the flow process): count the workers' batches in the ledger."""
    plan.writer.mark_batches(entries)


#: The packages whose versions a worker must share with the coordinator (the bytes of a batch
#: depend on them).
VERSIONED = ("attnbase", "torch", "transformers")


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from attnbase._version import __version__

    out = {"attnbase": __version__}
    for name in VERSIONED[1:]:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def check_versions(expected: dict[str, str] | None) -> None:
    """A worker whose attnbase, torch or transformers differs from the coordinator's refuses
    its task with one line."""
    if not expected:
        return
    mine = versions()
    diff = [f"{k} {mine.get(k)} (coordinator {v})" for k, v in expected.items() if mine.get(k) != v]
    if diff:
        import socket

        from attnbase.flows.errors import FlowStageError

        raise FlowStageError(f"worker {socket.gethostname()} (PID {__import__('os').getpid()}) "
                             f"refused: it runs {', '.join(diff)}; install the coordinator's "
                             "versions on every worker")


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


def analyze_run(db_dir: str, run_id: str, draws: int, seed: int, wait: bool = False):
    from attnbase.stats import analyze

    return analyze.analyze_run(open_db(db_dir), run_id, draws=draws, seed=seed, wait=wait)


def analysis_plan(db_dir: str, run_id: str, draws: int, seed: int):
    """In the coordinator: the run's analysis checked against the catalog, as layer jobs that
    name the run's bytes by path or URL (a worker never opens the catalog)."""
    from attnbase.stats import analyze

    return analyze.analysis_plan(open_db(db_dir), run_id, draws=draws, seed=seed)


def analyze_layer(job):
    """On a worker: one layer's part of a run's analysis (reads the run's store and statistics
    files, returns the results)."""
    from attnbase.stats.layer_parts import layer_part

    return layer_part(job)


def prime_analysis(db_dir: str, plan) -> None:
    """In the coordinator while the workers run: the run's Gauss-null pool (cached in DIR)."""
    from attnbase.stats import analyze

    if not plan.depth_only:
        analyze.gauss_pool_of(open_db(db_dir), plan)


def write_analysis(db_dir: str, plan, parts):
    """In the coordinator: combine the layer parts and write the result tables (one
    transaction)."""
    from attnbase.stats import analyze

    return analyze.write_analysis(open_db(db_dir), plan, parts)


def build_report(db_dir: str, run_id: str, compare: tuple[str, ...] = (), out_dir: str | None = None):
    from attnbase.reports import build_report as _build

    return _build(open_db(db_dir), run_id, compare=tuple(compare), out_dir=out_dir)
