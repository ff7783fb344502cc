"""Per-batch ingest for orchestrators: ``prepare_run`` -> ``run_batch`` x N -> ``finish_run``.

The same durability contract as :func:`attnbase.warehouse.ingest.extract_run` (and built from its
pieces), cut at batch boundaries so that a task runner can schedule each batch on its own:

- :func:`prepare_run` registers the run exactly as ``extract_run`` does (conflict check,
  ``--overwrite``, ``runs``/``arrays``/``batches`` rows, the store's empty arrays) and returns a
  picklable :class:`RunPlan` listing the batches the ledger still has as pending;
- :func:`run_batch` captures one batch and makes it durable (chunks fsynced, then row/col stats
  and the ledger mark in one transaction); rerunning a batch is idempotent;
- :func:`finish_run` marks the run complete once the ledger has every batch.

Concurrency. Batches of one run write disjoint chunks, so they may run in parallel threads or
processes. A loaded model is cached per process, and one model instance captures one batch at a
time (a lock): capture hooks are registered on the model's modules, so two concurrent forwards
on the same instance would record into each other's recorder. Catalog transactions that find the
file locked by another process are retried here with exponential backoff, after the capture, so
a lock never costs a second forward pass.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from attnbase import faults
from attnbase.errors import CatalogLockedError, WarehouseError
from attnbase.warehouse import ingest
from attnbase.warehouse.catalog import Database
from attnbase.warehouse.store import RunStore, array_specs

if TYPE_CHECKING:
    from attnbase.extract.config import ExtractConfig

T = TypeVar("T")


@dataclass(frozen=True)
class RunPlan:
    """What a worker needs to write batches of a registered run (picklable, no open handles)."""

    run_id: str
    cfg: "ExtractConfig"
    config_hash: str
    n_batches: int
    pending: tuple[int, ...]
    created_at: str  # the run's registration time: a new value after --overwrite


_cache_lock = threading.Lock()
#: Catalog access of this module within one process. DuckDB refuses a read-only and a read-write
#: connection to one file at the same time in one process ("different configuration"), so
#: threads take turns here; other processes are kept out by DuckDB's file lock (retried below).
_catalog_lock = threading.Lock()
_models: dict[tuple, tuple[Any, threading.Lock]] = {}
_windows: dict[tuple, Any] = {}


def _model(cfg: "ExtractConfig"):
    """The process's loaded model for ``cfg`` and the lock that serialises its captures."""
    from attnbase import extract as ex

    key = (cfg.model, cfg.dtype, cfg.device, cfg.variant, cfg.init, cfg.init_seed)
    with _cache_lock:
        if key not in _models:
            _models[key] = (ex.load_for_config(cfg), threading.Lock())
        return _models[key]


def _corpus(cfg: "ExtractConfig", lm):
    from attnbase import extract as ex

    key = (cfg.model, cfg.dtype, cfg.device, cfg.corpus, cfg.n_seqs, cfg.seq_len, cfg.seed)
    with _cache_lock:
        if key not in _windows:
            _windows[key] = ex.corpus_windows(lm, corpus=cfg.corpus, n_seqs=cfg.n_seqs,
                                              seq_len=cfg.seq_len, seed=cfg.seed)
        return _windows[key]


def _on_lock_retry(fn: Callable[[], T], tries: int = 10, backoff_s: float = 0.05) -> T:
    for k in range(tries):
        try:
            with _catalog_lock:
                return fn()
        except CatalogLockedError:
            if k == tries - 1:
                raise
            time.sleep(backoff_s * 2 ** k * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


def _db(db: Database | str) -> Database:
    return db if isinstance(db, Database) else Database(db)


def prepare_run(db: Database | str, run_id: str, cfg: "ExtractConfig", overwrite: bool = False) -> RunPlan:
    """Register ``run_id`` (or find it again) and return its plan; see the module docstring.

    Model and corpus are loaded first, so their errors happen before any catalog row exists.
    Raises :class:`RunConfigConflictError` when the run exists with another configuration.
    """
    ingest.check_run_id(run_id)
    db = _db(db)
    lm, _ = _model(cfg)
    win = _corpus(cfg, lm)
    return _on_lock_retry(lambda: _open(db, run_id, cfg, overwrite, lm.info, win))


def _open(db, run_id, cfg, overwrite, info, win) -> RunPlan:
    opened = ingest.open_for_writing(db, run_id, cfg, info=info, corpus=win.corpus,
                                     corpus_hash=win.corpus_hash, overwrite=overwrite)
    ledger = ingest.read_ledger(db, run_id)
    created = db.find_run(run_id)["created_at"]
    return RunPlan(run_id, cfg, opened.config_hash, opened.n_batches,
                   tuple(b for b, done in sorted(ledger.items()) if not done), str(created))


def run_batch(db: Database | str, plan: RunPlan, batch: int) -> int:
    """Capture batch ``batch`` of ``plan`` and make it durable; returns the batch index."""
    from attnbase import extract as ex

    if not 0 <= batch < plan.n_batches:
        raise WarehouseError(f"run {plan.run_id!r} has batches 0..{plan.n_batches - 1}, not {batch}")
    db = _db(db)
    cfg = plan.cfg
    (lm, lock) = _model(cfg)
    win = _corpus(cfg, lm)
    specs = array_specs(lm.info, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
                        dtype=cfg.dtype, capture=cfg.capture)
    with lock:
        gen = ex.capture_batches(lm, win.tokens, batch_size=cfg.batch_size, capture=cfg.capture,
                                 start_batch=batch)
        try:
            cb = next(iter(gen))
        finally:
            if hasattr(gen, "close"):
                gen.close()
    store = RunStore(db.store_path(plan.run_id), plan.run_id)
    _on_lock_retry(lambda: ingest.persist_batch(db, plan.run_id, store, specs, cb, None))
    return batch


def finish_run(db: Database | str, plan: RunPlan) -> dict:
    """Mark the run complete; raises :class:`WarehouseError` naming batches still pending."""
    db = _db(db)

    def mark() -> dict:
        ledger = ingest.read_ledger(db, plan.run_id)
        missing = sorted(b for b, done in ledger.items() if not done)
        if missing:
            raise WarehouseError(f"run {plan.run_id!r}: batches {missing} are not complete; run "
                                 f"them (or rerun the extraction, which resumes) before finishing")
        faults.point("run_finishing")
        with db.transaction() as con:
            con.execute("UPDATE runs SET status = 'complete', finished_at = ? WHERE run_id = ?",
                        [ingest.utcnow(), plan.run_id])
        return db.run_info(plan.run_id)

    return _on_lock_retry(mark)
