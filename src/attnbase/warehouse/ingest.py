"""Extraction into the warehouse: ``extract_run`` and its resumable batch loop.

Order of durability for every batch ``k``:

1. its chunks are written to the run store (each chunk a temp file renamed into place) and
   fsynced;
2. one DuckDB transaction deletes any ``row_stats``/``col_stats`` rows of the batch's seq range,
   inserts the batch's rows and marks ``batches[k]`` complete.

A crash between 1 and 2 leaves chunks the ledger does not count; the next ``extract_run`` with the
same run name and configuration starts again at the first incomplete batch and rewrites them.
Writes of batch ``k`` run in a background thread while batch ``k+1`` is computed.

Environment knobs:

* ``ATTNBASE_CRASH_AFTER_BATCH=k`` (fault injection for tests): the process SIGKILLs itself right
  after batch ``k`` is durable (after step 2).
* ``ATTNBASE_FSYNC=0`` skips the fsync of step 1 (about 40% of the store write time on CPU, see
  benchmarks/RESULTS.md). The run stays consistent against a killed process; after a power loss
  a batch the ledger counts may have lost chunks, which then fail their crc32c check on read
  (ArrayCorruptError) instead of reading silently wrong.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from attnbase import faults
from attnbase.errors import RunConfigConflictError, WarehouseError
from attnbase.warehouse.catalog import Database, RunRecord, insert_rows, to_arrow
from attnbase.warehouse.store import ArraySpec, RunStore, array_specs

if TYPE_CHECKING:
    from attnbase.extract.config import ExtractConfig
    from attnbase.extract.types import CapturedBatch, ModelInfo

CRASH_ENV = "ATTNBASE_CRASH_AFTER_BATCH"
FSYNC_ENV = "ATTNBASE_FSYNC"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str) -> None:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise WarehouseError(
            f"invalid run name {run_id!r}: use 1-128 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit)"
        )


def utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def extract_run(db: Database | str | Path, run_id: str, cfg: "ExtractConfig", overwrite: bool = False,
                progress: bool = True) -> RunRecord:
    """Extract ``cfg`` into run ``run_id`` of ``db``; resumable, idempotent.

    Loads the model and corpus windows first, so that model and corpus errors happen before any
    directory or catalog row exists. Then registers the run (``runs``, ``arrays``, the
    ``batches`` ledger) and writes every batch from the first incomplete one. A complete run
    with the same configuration is not recomputed; a run of the same name with a different
    ``config_hash`` raises :class:`RunConfigConflictError` unless ``overwrite`` (which deletes
    the old run's store and catalog rows first).
    """
    from attnbase import extract as ex

    check_run_id(run_id)
    db = db if isinstance(db, Database) else Database(db)
    lm = ex.load_for_config(cfg)  # the model, re-initialised and ablated as cfg says
    win = ex.corpus_windows(lm, corpus=cfg.corpus, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len,
                            seed=cfg.seed)

    def batches(start: int) -> Iterable["CapturedBatch"]:
        return ex.capture_batches(lm, win.tokens, batch_size=cfg.batch_size, capture=cfg.capture,
                                  start_batch=start)

    return ingest_batches(db, run_id, cfg, info=lm.info, corpus=win.corpus,
                          corpus_hash=win.corpus_hash, batches=batches, overwrite=overwrite,
                          progress=progress)


def ingest_batches(db: Database, run_id: str, cfg: "ExtractConfig", *, info: "ModelInfo",
                   corpus: str, corpus_hash: str,
                   batches: Callable[[int], Iterable["CapturedBatch"]],
                   overwrite: bool = False, progress: bool = True,
                   background_write: bool = True) -> RunRecord:
    """The storage half of :func:`extract_run`: ``batches(start_batch)`` yields CapturedBatches.

    Separate from model loading so that it can be driven by any batch source (tests feed
    synthetic batches).
    """
    opened = open_for_writing(db, run_id, cfg, info=info, corpus=corpus, corpus_hash=corpus_hash,
                              overwrite=overwrite)
    config_hash, specs, n_batches, store = (opened.config_hash, opened.specs, opened.n_batches,
                                            opened.store)
    if opened.complete:
        done = read_ledger(db, run_id)
        return RunRecord(run_id, "complete", config_hash, len(done), sum(done.values()), 0,
                         store.path)

    ledger = read_ledger(db, run_id)
    todo = [b for b, complete in sorted(ledger.items()) if not complete]
    written = 0
    if todo:
        try:
            written = _write_batches(db, run_id, store, specs, batches, todo, cfg,
                                     progress=progress, background=background_write)
        except BaseException:
            _mark_failed(db, run_id)
            raise
    faults.point("run_finishing")
    with db.transaction() as con:
        con.execute("UPDATE runs SET status = 'complete', finished_at = ? WHERE run_id = ?",
                    [utcnow(), run_id])
    return RunRecord(run_id, "complete", config_hash, n_batches, n_batches, written, store.path)


@dataclass(frozen=True)
class OpenedRun:
    """A run registered (or found again) and ready for batches: what :func:`open_for_writing` returns."""

    config_hash: str
    specs: list[ArraySpec]
    n_batches: int
    store: RunStore
    complete: bool  # already complete: nothing was changed


def open_for_writing(db: Database, run_id: str, cfg: "ExtractConfig", *, info: "ModelInfo",
                     corpus: str, corpus_hash: str, overwrite: bool = False) -> OpenedRun:
    """Register ``run_id`` or find it again, the one place where a run is opened for writing.

    ``overwrite`` deletes an existing run first; an existing run with another config hash raises
    :class:`RunConfigConflictError`; a complete run is returned untouched; an unfinished one is
    marked running again. The store's arrays exist (preallocated) when this returns.
    """
    check_run_id(run_id)
    config_hash = cfg.config_hash(model_revision=info.model_revision, corpus_hash=corpus_hash)
    specs = array_specs(info, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
                        dtype=cfg.dtype, capture=cfg.capture)
    n_batches = math.ceil(cfg.n_seqs / cfg.batch_size)
    store = RunStore(db.store_path(run_id), run_id)

    existing = db.find_run(run_id)
    if existing is not None and overwrite:
        db.delete_run(run_id)
        existing = None
    if existing is not None and existing["config_hash"] != config_hash:
        raise RunConfigConflictError(conflict_message(run_id, existing, cfg, config_hash))
    if existing is not None and existing["status"] == "complete":
        return OpenedRun(config_hash, specs, n_batches, store, complete=True)
    if existing is None:
        # a directory without a catalog row is debris of a run deleted or never registered
        shutil.rmtree(db.run_dir(run_id), ignore_errors=True)
        register_run(db, run_id, cfg, info, corpus, corpus_hash, config_hash, specs, n_batches)
    else:
        with db.transaction() as con:
            con.execute("UPDATE runs SET status = 'running', finished_at = NULL WHERE run_id = ?",
                        [run_id])
    store.create(specs)
    return OpenedRun(config_hash, specs, n_batches, store, complete=False)


def conflict_message(run_id: str, existing: dict, cfg: "ExtractConfig", config_hash: str) -> str:
    old = json.loads(existing["config"]) if existing.get("config") else {}
    new = cfg.hash_fields(model_revision="?", corpus_hash="?")
    diffs = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in new.items()
             if k in old and old.get(k) != v and v != "?"]
    what = "; ".join(diffs) if diffs else "model weights or corpus changed"
    return (f"run {run_id!r} already exists with a different configuration "
            f"(config_hash {existing['config_hash']} vs {config_hash}: {what}); "
            "choose another --run name or pass --overwrite to replace it")


def register_run(db: Database, run_id: str, cfg, info, corpus: str, corpus_hash: str,
              config_hash: str, specs: list[ArraySpec], n_batches: int) -> None:
    import attnbase

    config = dict(cfg.hash_fields(model_revision=info.model_revision, corpus_hash=corpus_hash))
    config["device"] = cfg.device
    row = {
        "run_id": run_id, "model": info.model, "model_revision": info.model_revision,
        "family": info.family, "n_layers": info.n_layers, "n_heads": info.n_heads,
        "n_kv_heads": info.n_kv_heads, "d_head": info.d_head, "d_model": info.d_model,
        "rotary": bool(info.rotary), "causal": bool(info.causal), "sink_token": info.sink_token,
        "n_seqs": cfg.n_seqs, "seq_len": cfg.seq_len, "corpus": corpus,
        "corpus_hash": corpus_hash, "dtype": cfg.dtype, "config_hash": config_hash,
        "status": "running", "created_at": utcnow(), "finished_at": None,
        "attnbase_version": attnbase.__version__, "config": json.dumps(config, sort_keys=True),
    }
    cols = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    b = cfg.batch_size
    with db.transaction() as con:
        con.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", list(row.values()))
        for s in specs:
            con.execute(
                "INSERT INTO arrays VALUES (?, ?, ?, ?, ?, ?, ?)",
                [run_id, s.name, f"{db.store_relpath(run_id)}/{s.name}", list(s.dims),
                 list(s.shape), list(s.chunks), s.dtype],
            )
        con.executemany(
            "INSERT INTO batches VALUES (?, ?, ?, ?, 'pending', NULL)",
            [[run_id, k, k * b, min(b, cfg.n_seqs - k * b)] for k in range(n_batches)],
        )


def read_ledger(db: Database, run_id: str) -> dict[int, bool]:
    with db.connect(read_only=True) as con:
        rows = con.execute("SELECT batch, status = 'complete' FROM batches WHERE run_id = ?",
                           [run_id]).fetchall()
    return {int(b): bool(c) for b, c in rows}


def _mark_failed(db: Database, run_id: str) -> None:
    try:
        with db.transaction() as con:
            con.execute("UPDATE runs SET status = 'failed' WHERE run_id = ?", [run_id])
    except Exception:  # the original error matters more
        pass


def persist_batch(db: Database, run_id: str, store: RunStore, specs: list[ArraySpec],
             cb: "CapturedBatch", crash_after: int | None) -> None:
    """Make one batch durable: chunks (fsynced), then stats + ledger in one transaction."""
    store.write_batch(cb, specs, fsync=os.environ.get(FSYNC_ENV, "1") != "0")
    lo, hi = cb.first_seq, cb.first_seq + cb.n_seqs
    rows = to_arrow(cb.row_stats)
    cols = to_arrow(cb.col_stats)
    with db.transaction() as con:
        insert_rows(con, "row_stats", run_id, rows, where="seq >= ? AND seq < ?", params=(lo, hi))
        insert_rows(con, "col_stats", run_id, cols, where="seq >= ? AND seq < ?", params=(lo, hi))
        faults.point("stats_written")
        n = con.execute(
            "UPDATE batches SET status = 'complete', written_at = ? "
            "WHERE run_id = ? AND batch = ? AND first_seq = ? AND n_seqs = ? RETURNING batch",
            [utcnow(), run_id, cb.batch, cb.first_seq, cb.n_seqs],
        ).fetchall()
        if len(n) != 1:
            raise WarehouseError(
                f"run {run_id!r}: captured batch {cb.batch} (seqs {lo}..{hi - 1}) does not match "
                "the run's batch ledger"
            )
    faults.point("ledger_updated")
    if crash_after is not None and cb.batch == crash_after:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _progress_bar(enabled: bool):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("batches"),
        TextColumn("{task.fields[tps]:>9,.0f} tok/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


def _write_batches(db: Database, run_id: str, store: RunStore, specs: list[ArraySpec],
                   batches: Callable[[int], Iterable["CapturedBatch"]], todo: list[int], cfg,
                   *, progress: bool, background: bool) -> int:
    crash = os.environ.get(CRASH_ENV)
    crash_after = int(crash) if crash not in (None, "") else None
    expected = set(todo)
    todo_set = frozenset(todo)
    start = todo[0]
    written = 0
    tokens = 0
    t0 = time.perf_counter()
    total = len(todo)
    with _progress_bar(progress) as bar:
        task = bar.add_task(f"extract {run_id}", total=total, tps=0.0)

        def done(cb) -> None:
            nonlocal written, tokens
            written += 1
            tokens += cb.n_seqs * cfg.seq_len
            bar.update(task, advance=1, tps=tokens / max(time.perf_counter() - t0, 1e-9))

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnbase-write") if background else None
        pending: Future | None = None
        try:
            for cb in batches(start):
                if cb.batch not in todo_set:  # complete already (e.g. batches after a --repair)
                    continue
                if pending is not None:
                    pending.result()
                    pending = None
                if pool is None:
                    persist_batch(db, run_id, store, specs, cb, crash_after)
                    done(cb)
                else:
                    def job(cb=cb):
                        persist_batch(db, run_id, store, specs, cb, crash_after)
                        done(cb)

                    pending = pool.submit(job)
                expected.discard(cb.batch)
            if pending is not None:
                pending.result()
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
    if expected:
        raise WarehouseError(
            f"run {run_id!r}: the capture ended before batches {sorted(expected)} were produced"
        )
    return written
