"""The run writer: the warehouse's one write path for extraction runs. It knows no models.

``RunWriter.open(db, run_id, spec)`` registers a run described by a
:class:`~attnbase.contract.RunSpec` (or finds it again: resume), ``writer.write(cb)`` makes one
:class:`~attnbase.contract.CapturedBatch` durable, ``writer.finish()`` marks the run complete.
Whatever produces the batches (a model, a test's synthetic arrays) lives above the warehouse:
:mod:`attnbase.runner`.

Order of durability for every batch ``k`` (each step is a named fault point,
:data:`attnbase.faults.POINTS`):

1. its chunks are written to the run store, one array per call (``chunk_written`` after each; a
   chunk is a temp file renamed into place) and fsynced (``chunks_durable``);
2. its ``row_stats``/``col_stats`` are written as one Parquet file each (temp file, fsync,
   rename; ``stats_written``), replacing any earlier file of the same batch;
3. one catalog transaction marks ``batches[k]`` complete (``ledger_updated``). A caller that
   streams many batches (the runner) may defer this mark (``commit(..., ledger_every=s)``): the
   marks of the batches made durable in ``s`` seconds go in one transaction (the first batch's
   at once), and
   :meth:`RunWriter.flush_ledger`, :meth:`RunWriter.finish` and :meth:`RunWriter.mark` write
   any still deferred. Each catalog open and close takes time and (DuckDB calls glibc's
   ``malloc_trim``) hands the process's free heap back to the kernel, which the next forward
   faults in again (benchmarks/RESULTS.md: "catalog transaction per batch").

A crash anywhere before 3 leaves data the ledger does not count; the next open with the same
run name and configuration lists batch ``k`` as pending again and the rewrite replaces it.
:meth:`RunWriter.stage` is step 1 without its fsync (the CPU part), :meth:`RunWriter.commit` the
rest (mostly waiting for the disk); :meth:`RunWriter.write` is both.
Only then does :meth:`RunWriter.finish` mark the run complete (``run_finishing`` before it).

A writer holds no open handles (only paths and the spec), so it pickles: the flows send it to
worker processes, which each write disjoint batches.

Environment knobs:

* ``ATTNBASE_CRASH_AFTER_BATCH=k`` (fault injection for tests, kept from before
  :mod:`attnbase.faults`): the process SIGKILLs itself right after batch ``k`` is durable (step 3;
  deferred ledger marks are written first).
* ``ATTNBASE_FSYNC=0`` skips the fsyncs of steps 1 and 2. The run stays consistent against a
  killed process; after a power loss a batch the ledger counts may have lost chunks, which then
  fail their crc32c check on read (ArrayCorruptError) instead of reading silently wrong.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from attnbase import faults
from attnbase.contract import ArraySpec, CapturedBatch, RunSpec, spec_arrays
from attnbase.errors import RunConfigConflictError, WarehouseError
from attnbase.warehouse.runs import statfiles
from attnbase.warehouse.catalog import statledger
from attnbase.warehouse.database import Database, delete_run_bytes
from attnbase.warehouse.runs.handle import RunHandle, run_handle
from attnbase.warehouse.runs.store import RunStore

CRASH_ENV = "ATTNBASE_CRASH_AFTER_BATCH"
FSYNC_ENV = "ATTNBASE_FSYNC"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

#: Values of ``runs.status`` (catalog migration 2 added 'interrupted').
STATUSES = ("running", "complete", "failed", "interrupted")


def check_run_id(run_id: str) -> None:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise WarehouseError(
            f"invalid run name {run_id!r}: use 1-128 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit)"
        )


def utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def _fsync_enabled() -> bool:
    return os.environ.get(FSYNC_ENV, "1") != "0"


def _crash_after() -> int | None:
    v = os.environ.get(CRASH_ENV)
    return int(v) if v not in (None, "") else None


@dataclass
class RunWriter:
    """An open (registered) run, ready for batches. Build it with :meth:`open`.

    ``pending`` lists the batches the ledger had as not complete when the writer was opened;
    ``complete`` says the run was already complete (then nothing was changed and ``pending`` is
    empty); ``created_at`` identifies this incarnation of the run (a new value after overwrite).
    """

    db_path: Path
    lock_timeout: float
    run_id: str
    spec: RunSpec
    pending: tuple[int, ...]
    complete: bool
    created_at: str
    #: ``s3://bucket/prefix/<run_id>`` where the run's bytes live, None for ``DIR/runs/<run_id>``
    #: (:mod:`attnbase.warehouse.runs.location`); a writer sent to another process writes there.
    store_url: str | None = None
    #: a team database's address (``postgresql://...``), None for the directory ``db_path``
    db_url: str | None = None

    # --- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, db: Database, run_id: str, spec: RunSpec, *,
             overwrite: bool = False, store: str | None = None,
             wait: bool = False) -> "RunWriter":
        """Register ``run_id`` or find it again: the one place where a run is opened for writing.

        ``overwrite`` deletes an existing run first; an existing run with another config hash
        raises :class:`RunConfigConflictError` at once (never retried: it cannot go away by
        waiting); a complete run is returned untouched; an unfinished one is marked running
        again. The store's arrays exist (preallocated) when this returns.

        ``store``: an ``s3://bucket/prefix`` root; the run's Zarr store and statistics files go
        under ``<store>/<run_id>/`` (None: the catalog's default, :meth:`CatalogBackend.default_store`,
        else under DIR, or where an existing run already lives).
        Resuming a run with another ``store`` than the one it lives in is refused.

        The writer holds the run's lease (:mod:`attnbase.warehouse.catalog.lease`) until
        :meth:`finish` or :meth:`mark`: a second writer of the run refuses in one line naming
        this one, or with ``wait`` waits for it.
        """
        from attnbase.warehouse.runs import location

        check_run_id(run_id)
        if store is None:  # a team database whose data location is on object storage
            store = db.catalog.default_store()
        url = location.run_base(store, run_id) if store is not None else None
        held = db.catalog.acquire_lease(run_id, "extract", wait=wait,
                                         config_hash=spec.config_hash)
        try:
            writer = cls._open_held(db, run_id, spec, overwrite, store, url)
        except BaseException:
            held.release()
            raise
        if writer.complete:
            held.release()
        else:
            writer.__dict__["_lease"] = held
        return writer

    @classmethod
    def _open_held(cls, db: Database, run_id: str, spec: RunSpec, overwrite: bool,
                   store: str | None, url: str | None) -> "RunWriter":
        existing = db.find_run(run_id)
        if existing is not None and overwrite:
            db.delete_run(run_id)
            existing = None
        if existing is not None and existing["config_hash"] != spec.config_hash:
            raise RunConfigConflictError(conflict_message(run_id, existing, spec))
        if existing is not None and existing["status"] != "complete":
            other = device_conflict(existing, spec)
            if other:
                raise RunConfigConflictError(other)
        if existing is not None:
            have = existing.get("store_url")
            if store is not None and have != url:
                how = f"--store {have.rsplit('/', 1)[0]}" if have else "no --store"
                raise RunConfigConflictError(
                    f"run {run_id!r} lives at {have or db.run_dir(run_id)}, not {url}; pass "
                    f"{how} to resume it, or --overwrite to re-extract it at {url}")
            url = have
        writer = cls(db.path, db.lock_timeout, run_id, spec, (), False, "", url, db.url)
        writer.__dict__["_database"] = db  # this process's Database (:meth:`_db`)
        if existing is not None and existing["status"] == "complete":
            writer.complete = True
            writer.created_at = str(existing["created_at"])
            return writer
        if existing is None:
            # a directory without a catalog row is debris of a run deleted or never registered
            delete_run_bytes(writer.db_path, writer.run)
            _register(db, writer.run, spec)
            db.forget_location(run_id)
            if writer.run.remote:
                statfiles.ensure_run_schema_files(writer.run)
        else:
            writer._set_status("running", finished=False)
        writer._store().create(spec_arrays(spec))
        # a pending batch's file, a .partial file, a stray copy: never read, removed here
        with db.connect(read_only=True, stats=False) as con:
            keep = [r.path for r in statledger.listed(con, run_id)]
        statledger.remove_unlisted(writer.run, keep)
        writer.pending = tuple(b for b, done in sorted(writer.ledger().items()) if not done)
        writer.created_at = str(db.find_run(run_id)["created_at"])
        return writer

    # --- parts ---------------------------------------------------------------------------
    def _db(self) -> Database:
        # one Database per writer and process: the one it was opened with, or (a writer sent
        # to another process: it is not pickled) one made from its fields, so the catalog's
        # migration check runs once, not once per batch
        db = self.__dict__.get("_database")
        if db is None:
            db = self.__dict__["_database"] = Database(self.db_url or self.db_path,
                                                        lock_timeout=self.lock_timeout)
        return db

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_database", "_unmarked", "_marked_at", "_lease")}

    def release(self) -> None:
        """Give the run's lease back (:meth:`finish` and :meth:`mark` do)."""
        held = self.__dict__.pop("_lease", None)
        if held is not None:
            held.release()

    @property
    def run(self) -> RunHandle:
        """Where the run's bytes live (the writer's own record: a worker needs no catalog)."""
        return run_handle(self.db_path, self.run_id, self.store_url)

    def _store(self) -> RunStore:
        return self.run.store()

    @property
    def arrays(self) -> list[ArraySpec]:
        """The arrays a batch writes: the run's arrays less the derived ones."""
        return [s for s in spec_arrays(self.spec) if not s.derived]

    @property
    def n_batches(self) -> int:
        return self.spec.n_batches

    @property
    def store_path(self):
        return self._store().path

    def ledger(self) -> dict[int, bool]:
        """``{batch: complete}`` as the catalog has it now."""
        return read_ledger(self._db(), self.run_id)

    # --- writing -------------------------------------------------------------------------
    def write(self, cb: CapturedBatch, *, release: bool = False) -> None:
        """Make one batch durable (chunks, then statistics files, then the ledger mark):
        :meth:`stage` then :meth:`commit`.

        ``release``: the caller hands the batch over; its arrays are dropped as they are
        written (peak memory of a capture overlapping the previous batch's write)."""
        self.commit(self.stage(cb, release=release))

    def stage(self, cb: CapturedBatch, *, release: bool = False,
              threads: int | None = None) -> "StagedBatch":
        """Step 1 of a batch without its fsync: every chunk written (temp file renamed into
        place), nothing counted yet. This is the CPU part of a write (checksums, compression,
        copies into the page cache); :meth:`commit` is mostly waiting for the disk, so a caller
        can run it in the background while it computes the next batch. ``threads``: chunks
        encoded and written at once (default :data:`~attnbase.warehouse.runs.store.CHUNK_THREADS`)."""
        lo, n = self.spec.batch_range(cb.batch) if 0 <= cb.batch < self.n_batches else (-1, -1)
        if (cb.first_seq, cb.n_seqs) != (lo, n):
            raise WarehouseError(
                f"run {self.run_id!r}: captured batch {cb.batch} (seqs {cb.first_seq}.."
                f"{cb.first_seq + cb.n_seqs - 1}) does not match the run's batch ledger "
                f"({self.n_batches} batches of {self.spec.batch_size})"
            )
        kw = {} if threads is None else {"threads": threads}
        self._store().write_batch(cb, self.arrays, release=release,
                                  on_chunk=lambda: faults.point("chunk_written"), **kw)
        return StagedBatch(cb.batch, cb.row_stats, cb.col_stats)

    def write_unledgered(self, cb: CapturedBatch) -> dict:
        """Steps 1 and 2 of a batch (chunks and statistics files durable: every PUT returned)
        and its ledger entry, returned instead of written: what a worker of a fanned-out flow
        does, so that only the coordinator writes the catalog (:meth:`mark_batches`). Needs no
        access to the catalog (nor, for a run on object storage, to DIR)."""
        staged = self.stage(cb)
        files = self._make_durable(staged)
        return {"run_id": self.run_id, "batch": int(staged.batch), "files": files,
                "created_at": self.created_at}

    def mark_batches(self, entries: list[dict]) -> None:
        """The coordinator's half of :meth:`write_unledgered`: mark the entries' batches
        complete in one transaction (entries of another incarnation of the run are refused)."""
        stale = [e for e in entries if e.get("created_at") not in (None, self.created_at)]
        if stale or any(e["run_id"] != self.run_id for e in entries):
            raise WarehouseError(f"run {self.run_id!r}: ledger entries from another run or "
                                 "incarnation; rerun the flow to rewrite those batches")
        if entries:
            self._mark_complete(sorted({int(e["batch"]) for e in entries}),
                                [f for e in entries for f in e["files"]])

    def _make_durable(self, staged: "StagedBatch") -> list:
        """Steps 1 (the fsync; nothing on object storage) and 2; returns the statistics files
        (:class:`~attnbase.warehouse.catalog.statledger.FileRecord`, listed by the ledger mark)."""
        fsync = _fsync_enabled()
        first_seq, n_seqs = self.spec.batch_range(staged.batch)  # checked by stage()
        if fsync:
            self._store().sync_batch(self.arrays, first_seq)
        faults.point("chunks_durable")
        rows_per_layer = self.spec.info.n_heads * n_seqs * self.spec.seq_len
        files = statfiles.write_batch_stats(self.run, staged.batch,
                                            staged.row_stats, staged.col_stats, fsync=fsync,
                                            rows_per_group=rows_per_layer)
        faults.point("stats_written")
        return files

    def commit(self, staged: "StagedBatch", *, ledger_every: float = 0.0) -> None:
        """Steps 1 (the fsync) to 3 of a staged batch: chunks durable, statistics files,
        ledger mark. ``ledger_every`` > 0 defers the mark until that many seconds have passed
        since the last one (see the module docstring); the caller then ends with
        :meth:`finish`, :meth:`mark` or :meth:`flush_ledger`."""
        files = self._make_durable(staged)
        if ledger_every <= 0:
            # this batch alone (writers of one run in several threads, the flows, each mark
            # their own batch: nothing shared between them)
            self._mark_complete([staged.batch], files)
        else:
            self.__dict__.setdefault("_unmarked", []).append((staged.batch, files))
            last = self.__dict__.get("_marked_at", float("-inf"))  # the first batch: at once
            if time.monotonic() - last >= ledger_every:
                self.flush_ledger()
        if _crash_after() == staged.batch:
            self.flush_ledger()
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def flush_ledger(self) -> int:
        """Mark every batch whose ledger mark was deferred complete, in one catalog transaction
        (step 3; ``ledger_updated`` once per batch); returns how many."""
        unmarked = self.__dict__.get("_unmarked") or []
        if unmarked:
            self._mark_complete([b for b, _ in unmarked], [f for _, fs in unmarked for f in fs])
        self.__dict__["_unmarked"] = []
        self.__dict__["_marked_at"] = time.monotonic()
        return len(unmarked)

    def _mark_complete(self, batches: list[int], files: list) -> None:
        """Mark ``batches`` complete and list their statistics ``files`` in one transaction:
        from its commit on, readers see exactly these batches' rows."""
        with self._db().ledger() as led:
            led.set_status(self.run_id, batches, "complete", utcnow())
            led.record(self.run_id, files)
        for _ in batches:
            faults.point("ledger_updated")

    def finish(self) -> dict:
        """Mark the run complete; :class:`WarehouseError` naming batches still pending."""
        self.flush_ledger()
        missing = sorted(b for b, done in self.ledger().items() if not done)
        if missing:
            raise WarehouseError(f"run {self.run_id!r}: batches {missing} are not complete; run "
                                 "them (or rerun the extraction, which resumes) before finishing")
        faults.point("run_finishing")
        self._set_status("complete", finished=True)
        self.release()
        return self._db().run_info(self.run_id)

    def mark(self, status: str) -> None:
        """Record that writing stopped: ``'failed'`` or ``'interrupted'`` (best effort: the
        error that stopped it matters more than this status)."""
        if status not in ("failed", "interrupted"):
            raise WarehouseError(f"a run can be marked 'failed' or 'interrupted', not {status!r}")
        try:
            self.flush_ledger()  # the deferred batches are durable: count them
        except Exception:
            pass
        try:
            self._set_status(status, finished=False)
        except Exception:
            pass
        self.release()

    def _set_status(self, status: str, *, finished: bool) -> None:
        with self._db().transaction(stats=False) as con:
            con.execute("UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?",
                        [status, utcnow() if finished else None, self.run_id])


@dataclass
class StagedBatch:
    """A batch whose chunks are written but not yet durable or counted (:meth:`RunWriter.stage`):
    what :meth:`RunWriter.commit` needs (its seqs follow from ``batch``: ``RunSpec.batch_range``)."""

    batch: int
    row_stats: dict
    col_stats: dict


def conflict_message(run_id: str, existing: dict, spec: RunSpec) -> str:
    return config_conflict_message(run_id, existing, spec.config_dict(), spec.config_hash)


def config_conflict_message(run_id: str, existing: dict, new: dict, config_hash: str) -> str:
    """One line naming what differs between a stored run's ``config`` JSON and ``new`` (fields
    whose new value is ``"?"`` are unknown and skipped; the device never enters the hash)."""
    old = json.loads(existing["config"]) if existing.get("config") else {}
    diffs = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in new.items()
             if k in old and k not in PROVENANCE_KEYS and v != "?" and old.get(k) != v]
    # a field recorded only where it differs from its default (variant, init, bos, store_dtype):
    # on one side only; provenance (device, torch, ...) is not configuration
    diffs += [f"{k} (default) -> {new[k]!r}" for k in new
              if old and k not in old and k not in PROVENANCE_KEYS and new[k] != "?"]
    diffs += [f"{k} {old[k]!r} -> (default)" for k in old
              if k not in new and k not in PROVENANCE_KEYS]
    what = "; ".join(diffs) if diffs else "model weights or corpus changed"
    return (f"run {run_id!r} already exists with a different configuration "
            f"(config_hash {existing['config_hash']} vs {config_hash}: {what}); "
            "choose another --run name or pass --overwrite to replace it")


#: Fields of a run's config that say what computed it, outside its hash (runner.run_provenance)
PROVENANCE_KEYS = ("device", "device_name", "torch", "cuda", "stats_backend",
                   "forward_threads")

#: Provenance fields a resume must share with the run's first batches: one run's numbers come
#: from one kind of device (a GPU's matmuls and softmax round otherwise than the CPU's).
DEVICE_FIELDS = ("device_kind", "device_name")


def _device_of(config: dict) -> dict:
    dev = config.get("device")
    if not dev or dev == "auto" or "device_name" not in config:
        return {}  # a run registered before the device was recorded: nothing to compare
    kind = str(dev).partition(":")[0]
    # GPUs of two models round differently; CPUs are one kind (a resume on another host's CPU
    # is allowed: its kernels are the same library's)
    return {"device_kind": kind, **({"device_name": config["device_name"]} if kind == "cuda" else {})}


def device_conflict(existing: dict, spec: RunSpec) -> str | None:
    """One line when resuming ``existing`` would mix devices, else None."""
    old = _device_of(json.loads(existing["config"]) if existing.get("config") else {})
    new = _device_of(spec.config_dict())
    diffs = [f"{k} {old[k]!r} -> {new[k]!r}" for k in DEVICE_FIELDS
             if k in old and k in new and old[k] != new[k]]
    if not diffs:
        return None
    return (f"run {existing['run_id']!r} was started on another device ({'; '.join(diffs)}); "
            f"resume it with --device {json.loads(existing['config'])['device']} on the same "
            "kind of machine, or pass --overwrite to restart it here")


def insert_run(con, run_id: str, spec: RunSpec, store_url: str | None = None) -> None:
    """Insert the ``runs`` row of ``spec`` (status ``running``) on an open transaction."""
    from attnbase._version import __version__

    info = spec.info
    row = {
        "run_id": run_id, "model": info.model, "model_revision": info.model_revision,
        "family": info.family, "n_layers": info.n_layers, "n_heads": info.n_heads,
        "n_kv_heads": info.n_kv_heads, "d_head": info.d_head, "d_model": info.d_model,
        "rotary": bool(info.rotary), "causal": bool(info.causal), "sink_token": info.sink_token,
        "n_seqs": spec.n_seqs, "seq_len": spec.seq_len, "corpus": spec.corpus,
        "corpus_hash": spec.corpus_hash, "dtype": spec.dtype, "config_hash": spec.config_hash,
        "status": "running", "created_at": utcnow(), "finished_at": None,
        "attnbase_version": __version__, "config": spec.config,
        "store_url": store_url, "sink_positions": list(info.sink_positions),
        "n_params": info.n_params,
    }
    con.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                list(row.values()))


def _register(db: Database, run: RunHandle, spec: RunSpec) -> None:
    """The run's catalog rows: its batches, pending, in the ledger first (a run the catalog
    lists always has them; ledger rows left by a run of that name registered no further or
    deleted are replaced), then ``runs``, ``arrays`` and ``seq_sources`` in one transaction."""
    run_id, store_rel = run.run_id, run.catalog_store_path
    with db.ledger() as led:
        led.forget(run_id)
        led.add_batches(run_id, [(k, *spec.batch_range(k)) for k in range(spec.n_batches)])
    with db.transaction(stats=False) as con:
        insert_run(con, run_id, spec, run.url)
        for s in spec_arrays(spec):
            con.execute(
                "INSERT INTO arrays (run_id, name, path, dims, shape, chunks, dtype, derived, "
                "derivation) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, s.name, f"{store_rel}/{s.name}", list(s.dims),
                 list(s.shape), list(s.chunks), s.dtype, s.derived, s.derivation],
            )
        if spec.sources:
            con.executemany("INSERT INTO seq_sources VALUES (?, ?, ?, ?, ?, ?, ?)",
                            [[run_id, i, s.file, *s.box] for i, s in enumerate(spec.sources)])


def read_ledger(db: Database, run_id: str) -> dict[int, bool]:
    with db.connect(read_only=True) as con:
        rows = con.execute("SELECT batch, status = 'complete' FROM batches WHERE run_id = ?",
                           [run_id]).fetchall()
    return {int(b): bool(c) for b, c in rows}
