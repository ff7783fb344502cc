"""The only place flows touch the stages: thin, late-bound calls into warehouse, stats and reports.

Every function here resolves its stage at call time, so that (1) importing ``attnbase.flows``
does not import torch or open a catalog, and (2) tests can monkeypatch one seam.
The database travels between processes as its directory (a ``str``), never as an open
:class:`~attnbase.warehouse.Database`, because Dask workers are separate processes.

Catalog concurrency. DuckDB lets one *process* hold a database file for writing, and within a
process refuses a read-only connection while a read-write one is open (and vice versa). Every
stage call that touches the catalog therefore goes through :func:`retry_on_lock`, which retries
:class:`~attnbase.errors.CatalogLockedError` (another process: Dask workers) and the in-process
conflict with exponential backoff and jitter; ``warehouse.batches`` additionally serialises its
own catalog transactions per process, after the capture, so a conflict never redoes a forward. We
chose retrying over funnelling writes to the flow process because a batch's catalog payload is
its ``row_stats``/``col_stats`` (one row per attention row: layers x heads x seqs x positions),
which would otherwise be pickled through Dask back to the flow process, and because the
warehouse keeps every write a short transaction, so a worker waits milliseconds, not minutes.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, TypeVar

from attnbase.errors import CatalogLockedError, WarehouseError

T = TypeVar("T")

#: Seconds of the first lock retry; doubled on each further try (with +-50 % jitter).
LOCK_BACKOFF_S = 0.05
LOCK_MAX_TRIES = 12  # ~0.05 * (2**12 - 1) ~ 200 s of waiting in the worst case


def retry_on_lock(fn: Callable[[], T], *, tries: int = LOCK_MAX_TRIES,
                  backoff_s: float = LOCK_BACKOFF_S, sleep: Callable[[float], Any] = time.sleep) -> T:
    """Call ``fn()``; on :class:`CatalogLockedError` wait ``backoff_s * 2**k`` (jittered) and retry.

    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise CatalogLockedError("catalog.duckdb is locked")
    ...     return "ok"
    >>> retry_on_lock(flaky, sleep=lambda s: None), len(calls)
    ('ok', 3)
    """
    for k in range(tries):
        try:
            return fn()
        except WarehouseError as err:
            if not is_lock_conflict(err) or k == tries - 1:
                raise
            sleep(backoff_s * (2 ** k) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


def is_lock_conflict(err: Exception) -> bool:
    """A catalog held by someone else: another process (:class:`CatalogLockedError`) or, in this
    process, a connection of the other read-only/read-write kind (DuckDB: "different
    configuration"), which threads of one process meet when they open the catalog at once."""
    return isinstance(err, CatalogLockedError) or "different configuration" in str(err)


def open_db(db_dir: str):
    from attnbase.warehouse import Database

    return Database(db_dir)


def _batch_api():
    """The warehouse's per-batch ingest API (prepare_run / run_batch / finish_run)."""
    from attnbase.warehouse import ingest

    if all(hasattr(ingest, n) for n in ("prepare_run", "run_batch", "finish_run")):
        return ingest
    from attnbase.warehouse import batches

    return batches


def prepare_run(db_dir: str, run_id: str, cfg, overwrite: bool):
    """Register the run (or find it again) -> RunPlan with the ledger's pending batches."""
    api = _batch_api()
    return retry_on_lock(lambda: api.prepare_run(open_db(db_dir), run_id, cfg, overwrite))


def run_batch(db_dir: str, plan, batch: int):
    """Capture and write one batch, then mark it complete in the ledger."""
    api = _batch_api()
    return retry_on_lock(lambda: api.run_batch(open_db(db_dir), plan, batch))


def finish_run(db_dir: str, plan):
    api = _batch_api()
    return retry_on_lock(lambda: api.finish_run(open_db(db_dir), plan))


def analysis_families() -> tuple[str, ...]:
    """Names of the statistics families stats.analyze can run one at a time; () if it cannot."""
    from attnbase.stats import analyze

    fams = getattr(analyze, "FAMILIES", None)
    if fams is None or not hasattr(analyze, "analyze_family"):
        return ()
    return tuple(fams)


def analyze_family(db_dir: str, run_id: str, family: str, draws: int, seed: int):
    from attnbase.stats import analyze

    return retry_on_lock(lambda: analyze.analyze_family(open_db(db_dir), run_id, family,
                                                        draws=draws, seed=seed))


def finish_analysis(db_dir: str, run_id: str):
    """Whatever stats does after its families (views, run-level summaries); nothing if it has none."""
    from attnbase.stats import analyze

    fn = getattr(analyze, "finish_analysis", None)
    if fn is None:
        return None
    return retry_on_lock(lambda: fn(open_db(db_dir), run_id))


def analyze_run(db_dir: str, run_id: str, draws: int, seed: int):
    from attnbase.stats import analyze

    return retry_on_lock(lambda: analyze.analyze_run(open_db(db_dir), run_id, draws=draws, seed=seed))


def build_report(db_dir: str, run_id: str, compare: tuple[str, ...] = (), out_dir: str | None = None):
    from attnbase.reports import build_report as _build

    return _build(db_dir, run_id, compare=tuple(compare), out_dir=out_dir)
