"""The catalog: ``DIR/catalog.duckdb`` and the layout of a database directory.

Connections are short-lived (one per operation) so that ``attnbase sql`` can read between the
writes of a running extraction: DuckDB lets one process hold a file for writing at a time.

The one retry policy of the write path lives here, in :meth:`Database._open`: a catalog held by
another process is a transient fault, waited for with exponential backoff up to ``lock_timeout``
seconds, then :class:`CatalogLockedError`. Nothing above retries catalog access again, and no
other error is retried anywhere (a run-config conflict fails at once). Within one process DuckDB
refuses a read-only and a read-write connection to the same file at the same time; threads of a
process therefore take turns by mode (:class:`_ModeLock`: any number of connections of one mode,
the other mode waits), so that conflict never reaches DuckDB. A new catalog is built and
migrated aside and published whole (:meth:`Database._create`): making one holds no lock.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb
import numpy as np
import pyarrow as pa

from attnbase.errors import CatalogLockedError, RunNotFoundError, WarehouseError
from attnbase.warehouse.catalog import migrations
from attnbase.warehouse.runs.handle import RunHandle, run_handle

CATALOG_FILE = "catalog.duckdb"
#: Database.run's default: look the run's location up in the catalog
_LOOK_UP = object()

#: Tables that carry a ``run_id`` column (deleted with a run). ``row_stats``/``col_stats`` are
#: views over per-run files (:mod:`attnbase.warehouse.runs.statfiles`), deleted with the run's files.
RUN_TABLES = ("head_metrics", "null_tests", "layer_metrics", "run_metrics", "stat_files",
              "batches", "arrays", "seq_sources", "runs")

#: Seconds a connection waits for a catalog held by another process (or, in this process, by a
#: connection of the other mode) before :class:`CatalogLockedError`.
LOCK_TIMEOUT_S = 5.0
#: Longest pause between two read-only open attempts: a writer releases the file only between
#: its transactions (a few ms to tens of ms), which a reader backing off to 250 ms mostly
#: misses (the service's readers waited up to 2.3 s beside 0.3 s write transactions with 20 ms
#: gaps; with 10 ms polling, one transaction). A failed open costs well under a millisecond.
READ_RETRY_MAX_S = 0.01

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOCK_PID = re.compile(r"Conflicting lock is held in (.+?) \(PID (\d+)\)")


@dataclass(frozen=True)
class RunRecord:
    """What :func:`~attnbase.warehouse.extract_run` did to a run."""

    run_id: str
    status: str
    config_hash: str
    n_batches: int
    batches_done: int
    batches_written: int  # by this call (0 when the run was already complete)
    store_path: Path


def _is_lock(err: Exception) -> bool:
    """A lock held by another process (released when that process's connection closes)."""
    return "could not set lock" in str(err).lower()


class _ModeLock:
    """Connections of one process to one catalog file: many of one mode, or wait.

    A mode is ``(read_only, configuration)``: DuckDB shares one database instance between the
    connections of a process that open a file with the same mode and refuses any other ("different
    configuration") while one is open. ``acquire(mode)`` succeeds while no connection of another
    mode is open; a thread that holds the lock may take it again in the same mode (nested short
    connections).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._mode: Any = None  # (read_only, configuration) of the open connections
        self._count = 0

    def acquire(self, mode: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._count and self._mode != mode:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    if self._count and self._mode != mode:
                        return False
            self._mode = mode
            self._count += 1
            return True

    def release(self) -> None:
        with self._cond:
            self._count -= 1
            if self._count == 0:
                self._mode = None
                self._cond.notify_all()


def _mode(read_only: bool, config: dict | None) -> tuple:
    return (bool(read_only), tuple(sorted((k, repr(v)) for k, v in (config or {}).items())))


#: Settings DuckDB refuses at connect time ("before the database is started"), applied after.
#: Boolean settings DuckDB takes only on a started database, applied in this order (the lock
#: last). ``parquet_metadata_cache``: the service's (statistics files are written once).
_LATE_SETTINGS = ("parquet_metadata_cache", "enable_external_access", "lock_configuration")


def _apply_late_settings(con, root: str, late: dict, remote_dirs: Sequence[str] = ()) -> None:
    from attnbase.warehouse.runs.statschema import SCHEMAS

    try:
        if late.get("enable_external_access") is False:
            dirs = [f"{root}/{t}/" for t in SCHEMAS] + [f"{t}/" for t in SCHEMAS] + list(remote_dirs)
            listed = ", ".join("'" + d.replace("'", "''") + "'" for d in dirs)
            con.execute(f"SET allowed_directories = [{listed}]")
        for key in _LATE_SETTINGS:
            if key in late:  # GLOBAL: the instance's, so its cursors have it too (a plain SET
                # of a setting with a session scope, parquet_metadata_cache, stays this one's)
                con.execute(f"SET GLOBAL {key} = {str(bool(late[key])).lower()}")
    except duckdb.Error:
        # a connection sharing the database instance of an open one of this same configuration:
        # the settings are in force already (locked), or about to be (that connection is
        # between its SETs): wait for the lock, briefly
        deadline = time.monotonic() + 2.0
        while True:
            locked = con.execute("SELECT current_setting('lock_configuration')").fetchall()[0][0]
            if locked:
                return
            if time.monotonic() >= deadline:
                con.close()
                raise
            time.sleep(0.01)


_mode_locks: dict[Path, _ModeLock] = {}
_mode_locks_guard = threading.Lock()


def _mode_lock(path: Path) -> _ModeLock:
    key = path.resolve()
    with _mode_locks_guard:
        return _mode_locks.setdefault(key, _ModeLock())


_ledger_locks: dict[Path, threading.Lock] = {}


def _ledger_lock(path: Path) -> threading.Lock:
    key = path.resolve()
    with _mode_locks_guard:
        return _ledger_locks.setdefault(key, threading.Lock())


def _lock_message(path: Path, err: Exception) -> str:
    m = _LOCK_PID.search(str(err))
    who = f" by {m.group(1)} (PID {m.group(2)})" if m else " by another process"
    return f"catalog {path} is locked{who}; wait for it to finish or use another --db"


def to_arrow(columns: Any) -> pa.Table:
    """A polars/pandas DataFrame, pyarrow Table or mapping of 1-D arrays as a pyarrow Table."""
    if isinstance(columns, pa.Table):
        return columns
    if hasattr(columns, "to_arrow"):  # polars
        return columns.to_arrow()
    if isinstance(columns, dict):
        return pa.table({k: np.asarray(v) for k, v in columns.items()})
    return pa.Table.from_pandas(columns, preserve_index=False)


class Database:
    """A database directory: ``DIR/catalog.duckdb`` plus ``DIR/runs/<run_id>/store.zarr``.

    The constructor only stores the path; the directory and catalog are created, and pending
    migrations applied, on the first writing connection.
    """

    def __init__(self, path: str | Path, *, lock_timeout: float = LOCK_TIMEOUT_S) -> None:
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self._migrated = False
        self.remote_views = None  # the last open's TEMP views of runs on object storage
        self._store_urls: dict[str, str | None] = {}  # runs.store_url by run (Database.run)

    @classmethod
    def of(cls, db: "Database | str | Path") -> "Database":
        """``db`` itself, or the Database of a directory given as a str or Path."""
        return db if isinstance(db, Database) else cls(db)

    def __repr__(self) -> str:
        return f"Database({str(self.path)!r})"

    # --- layout --------------------------------------------------------------------------
    @property
    def catalog_path(self) -> Path:
        return self.path / CATALOG_FILE

    def run_dir(self, run_id: str) -> Path:
        """Where a local run of this name lives (``DIR/runs/<run_id>``)."""
        return run_handle(self.path, run_id, None).base

    def store_url(self, run_id: str) -> str | None:
        """``runs.store_url`` of ``run_id``: the ``s3://`` URL its bytes live under, or None
        for a local run (also for a run not registered). Cached per Database (a run's location
        is fixed while it exists; :meth:`forget_location` after deleting or registering one)."""
        if run_id not in self._store_urls:
            url = None
            if self.catalog_path.exists():
                with self.connect(read_only=True) as con:
                    row = con.execute("SELECT store_url FROM runs WHERE run_id = ?",
                                      [run_id]).fetchone()
                url = row[0] if row else None
                if row is None:
                    return None  # not registered (yet): not cached
            self._store_urls[run_id] = url
        return self._store_urls[run_id]

    def forget_location(self, run_id: str) -> None:
        self._store_urls.pop(run_id, None)

    def run(self, run_id: str, store_url: "str | None | object" = _LOOK_UP) -> RunHandle:
        """Where ``run_id``'s bytes live (:mod:`attnbase.warehouse.runs.handle`). ``store_url``: its
        ``runs.store_url`` as read elsewhere (the service's snapshot of the catalog), so that
        locating the run opens no connection to the catalog file; by default looked up
        (:meth:`store_url`)."""
        url = self.store_url(run_id) if store_url is _LOOK_UP else store_url
        return run_handle(self.path, run_id, url)

    def store_path(self, run_id: str):
        """The run's Zarr store: ``DIR/runs/<run_id>/store.zarr`` or ``<store_url>/store.zarr``."""
        return self.run(run_id).store_path

    def exists(self) -> bool:
        return self.catalog_path.exists()

    # --- connections ---------------------------------------------------------------------
    def _open(self, read_only: bool, config: dict | None = None,
              stats: bool = True) -> duckdb.DuckDBPyConnection:
        """Connect, waiting up to ``lock_timeout`` for another process's lock (the one retry
        policy: see the module docstring).

        Relative paths in the catalog's views (``row_stats``/``col_stats`` over Parquet files)
        resolve against DIR: ``file_search_path`` is part of every connection's configuration.
        ``config`` is DuckDB's connect-time configuration (the SQL face's sandbox); settings that
        DuckDB only accepts on a started database (``enable_external_access = false``,
        ``lock_configuration``) are applied right after connecting, in that order, and a
        sandbox that forbids file access keeps reading the statistics directories
        (``allowed_directories``), nothing else.
        """
        root = str(self.path.resolve())
        conf = dict(config or {})
        late = {k: conf.pop(k) for k in _LATE_SETTINGS if k in conf}
        conf["file_search_path"] = root
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.02
        while True:
            try:
                con = duckdb.connect(str(self.catalog_path), read_only=read_only, config=conf)
                break
            except duckdb.Error as err:
                if not _is_lock(err):
                    msg = str(err).strip().splitlines()[0]
                    raise WarehouseError(f"cannot open catalog {self.catalog_path}: {msg}") from err
                if time.monotonic() >= deadline:
                    raise CatalogLockedError(_lock_message(self.catalog_path, err)) from None
                time.sleep(delay)
                delay = min(delay * 2, READ_RETRY_MAX_S if read_only else 0.25)
        # not for the write path's own transactions (ledger marks, registrations: stats=False),
        # which never read them
        if self._migrated and stats:
            from attnbase.warehouse.runs.statfiles import attach_remote_views

            self.remote_views = attach_remote_views(con)  # a cursor of con makes them again
            remote_dirs = self.remote_views.dirs
        else:
            remote_dirs = []
        if late:
            _apply_late_settings(con, root, late, remote_dirs)
        return con

    def migrate(self) -> list[migrations.Migration]:
        """Apply pending migrations (creating DIR and the catalog if needed)."""
        from attnbase.warehouse.runs.statfiles import ensure_schema_files

        self.path.mkdir(parents=True, exist_ok=True)
        ensure_schema_files(self.path)
        migrations.all_migrations()  # the providers' imports, before the catalog is held
        if not self.catalog_path.exists():
            made = self._create()
            if made is not None:
                self._migrated = True
                return made
        lock = _mode_lock(self.catalog_path)
        if not lock.acquire(_mode(False, None), self.lock_timeout):
            raise CatalogLockedError(f"catalog {self.catalog_path} is held by another thread of "
                                     "this process; wait for it to finish or use another --db")
        try:
            con = self._open(read_only=False)
            try:
                applied = migrations.migrate(con)
            finally:
                con.close()
        finally:
            lock.release()
        self._migrated = True
        return applied

    def _create(self) -> list[migrations.Migration] | None:
        """A new catalog: built and migrated under a private name in DIR, then published as
        ``DIR/catalog.duckdb`` by a hard link, which fails when another process published one
        first (then None: use that one). So nobody waits on the shared file while a catalog
        is being made, and nobody sees a half-made one. None too where DIR takes no hard
        links (then the caller migrates the shared file in place)."""
        from attnbase.warehouse.catalog.lease import pid_gone

        for stale in self.path.glob(f".{CATALOG_FILE}.*-*.new*"):  # a killed maker's leftovers
            if pid_gone(stale.name[len(CATALOG_FILE) + 2:].split("-", 1)[0]):
                stale.unlink(missing_ok=True)
        tmp = self.path / f".{CATALOG_FILE}.{os.getpid()}-{uuid.uuid4().hex[:8]}.new"
        try:
            try:
                con = duckdb.connect(str(tmp), config={"file_search_path": str(self.path.resolve())})
            except duckdb.Error as err:
                msg = str(err).strip().splitlines()[0]
                raise WarehouseError(f"cannot create catalog {self.catalog_path}: {msg}") from err
            try:
                applied = migrations.migrate(con)
                con.execute("CHECKPOINT")  # every change in the file itself, none in a WAL
            finally:
                con.close()
            try:
                os.link(tmp, self.catalog_path)
            except OSError:  # published by another process first (or no hard links here)
                return None
            return applied
        finally:
            for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
                leftover.unlink(missing_ok=True)

    def _ensure_migrated(self) -> None:
        if self._migrated:
            return
        if self.catalog_path.exists():
            migrations.all_migrations()  # the providers' imports, before the catalog is held
            lock = _mode_lock(self.catalog_path)
            if not lock.acquire(_mode(True, None), self.lock_timeout):
                raise CatalogLockedError(f"catalog {self.catalog_path} is held by another thread "
                                         "of this process; wait for it to finish or use another --db")
            try:
                con = self._open(read_only=True)
                try:
                    todo = migrations.pending(con)
                finally:
                    con.close()
            finally:
                lock.release()
            if not todo:
                self._migrated = True
                return
        self.migrate()

    @contextmanager
    def connect(self, read_only: bool = False, config: dict | None = None,
                stats: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived DuckDB connection; closed on exit. Lock errors -> CatalogLockedError.

        A read-only connection never creates anything: it raises :class:`WarehouseError` when
        DIR holds no catalog. ``config`` is DuckDB's connect-time configuration (the SQL face's
        sandbox): DuckDB shares one database instance between the connections of a process
        that open a file with the same configuration, so settings given here never leak into
        ordinary connections (a connection of another configuration waits, like a lock).
        ``stats=False`` skips the views of statistics files on object storage
        (:func:`attnbase.warehouse.runs.statfiles.attach_remote_views`): the write path's ledger transactions never read them.
        """
        if read_only and not self.catalog_path.exists():
            raise WarehouseError(
                f"no attnbase database at {self.path} (no {CATALOG_FILE}); "
                f"create one with `attnbase extract --db {self.path} ...`"
            )
        self._ensure_migrated()
        lock = _mode_lock(self.catalog_path)
        if not lock.acquire(_mode(read_only, config), self.lock_timeout):
            raise CatalogLockedError(
                f"catalog {self.catalog_path} is held by another thread of this process in "
                f"another mode for over {self.lock_timeout:.0f} s; wait for it to finish or use "
                "another --db")
        try:
            con = self._open(read_only=read_only, config=config, stats=stats)
            try:
                yield con
            finally:
                con.close()
        finally:
            lock.release()

    @contextmanager
    def transaction(self, stats: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """A writing connection inside one transaction: committed on success, else rolled back."""
        with self.connect(read_only=False, stats=stats) as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    @contextmanager
    def ledger(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A writing transaction that changes which statistics files readers see (the ledger,
        ``stat_files``): on commit the views read exactly the listed files
        (:func:`attnbase.warehouse.catalog.statledger.refresh_views`). One at a time per process (two
        would both replace the views: a write-write conflict); processes take turns by the
        catalog's file lock."""
        from attnbase.warehouse.catalog.statledger import refresh_views

        with _ledger_lock(self.catalog_path):
            with self.transaction(stats=False) as con:
                yield con
                refresh_views(con)

    # --- queries -------------------------------------------------------------------------
    def run_ids(self) -> list[str]:
        if not self.catalog_path.exists():
            return []
        with self.connect(read_only=True) as con:
            return [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]

    def find_run(self, run_id: str) -> dict | None:
        """The ``runs`` row of ``run_id`` as a dict, or None."""
        if not self.catalog_path.exists():
            return None
        with self.connect(read_only=True) as con:
            cur = con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d[0] for d in cur.description], row))

    def run_info(self, run_id: str) -> dict:
        """The ``runs`` row of ``run_id``; :class:`RunNotFoundError` (listing known runs) otherwise."""
        info = self.find_run(run_id)
        if info is None:
            known = self.run_ids()
            listing = ", ".join(known[:20]) if known else "none"
            raise RunNotFoundError(
                f"no run {run_id!r} in {self.path} (known runs: {listing}); "
                "see `attnbase runs --db DIR`"
            )
        return info

    def list_runs(self):
        """Every run with its ledger progress, as a polars DataFrame."""
        import polars as pl

        if not self.catalog_path.exists():
            return pl.DataFrame()
        with self.connect(read_only=True) as con:
            return con.sql(
                """
                SELECT r.run_id, r.model, r.family, r.status, r.n_seqs, r.seq_len, r.dtype,
                       coalesce(b.done, 0) AS batches_done, coalesce(b.total, 0) AS batches_total,
                       r.created_at, r.finished_at
                FROM runs r
                LEFT JOIN (SELECT run_id, count(*) FILTER (WHERE status = 'complete') AS done,
                                  count(*) AS total
                           FROM batches GROUP BY run_id) b USING (run_id)
                ORDER BY r.created_at, r.run_id
                """
            ).pl()

    def array_rows(self, run_id: str) -> list[dict]:
        with self.connect(read_only=True) as con:
            cur = con.execute("SELECT * FROM arrays WHERE run_id = ? ORDER BY name", [run_id])
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]

    # --- writes --------------------------------------------------------------------------
    def replace_rows(self, table: str, run_id: str, df: Any, where: str | None = None,
                     params: Sequence[Any] = ()) -> int:
        """Delete ``table``'s rows of ``run_id`` (and ``where``), insert ``df``; one transaction.

        ``df`` (polars/pandas DataFrame, pyarrow Table or mapping of arrays) is matched to the
        table's columns by name; a missing ``run_id`` column is filled in. Returns rows inserted.
        """
        if not _IDENT.match(table):
            raise WarehouseError(f"not a table name: {table!r}")
        tbl = to_arrow(df)
        with self.transaction() as con:
            insert_rows(con, table, run_id, tbl, where=where, params=params, delete=True)
        return tbl.num_rows

    def delete_run(self, run_id: str) -> None:
        """Remove a run's catalog rows (one transaction), then its bytes (and any local debris
        of a run of that name)."""
        run = self.run(run_id)
        if self.catalog_path.exists():
            with self.ledger() as con:
                for table in RUN_TABLES:
                    con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        delete_run_bytes(self.path, run)
        self.forget_location(run_id)

    # --- arrays --------------------------------------------------------------------------
    def read_layer(self, run_id: str, name: str, layer: int) -> np.ndarray:
        """One layer's block of array ``name`` (every seq), read with checksums verified."""
        self.run_info(run_id)
        return self.run(run_id).store().read_layer(name, layer)

    def read_layers(self, run_id: str, name: str, layers: Sequence[int] | None = None
                    ) -> Iterator[tuple[int, np.ndarray]]:
        """``(layer, block)`` of array ``name`` for each of ``layers`` (default: all), streamed:
        the next block is read in a background thread while the caller works on this one (the
        read releases the GIL in its copies and checksums), so at most two blocks are alive.
        The run is looked up and its store opened once."""
        from concurrent.futures import ThreadPoolExecutor

        self.run_info(run_id)
        store = self.run(run_id).store()
        todo = list(range(store.array(name).shape[0]) if layers is None else layers)
        if not todo:
            return
        with ThreadPoolExecutor(1, thread_name_prefix="attnbase-read") as pool:
            ahead = pool.submit(store.read_layer, name, todo[0])
            for i, layer in enumerate(todo):
                block = ahead.result()
                if i + 1 < len(todo):
                    ahead = pool.submit(store.read_layer, name, todo[i + 1])
                yield layer, block
                del block


def insert_table(con, table: str, tbl: pa.Table) -> None:
    """On an open connection/transaction: insert an Arrow table's rows into ``table`` by column
    name (no-op for an empty table)."""
    if tbl.num_rows == 0:
        return
    con.register("_attnbase_rows", tbl)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _attnbase_rows")
    finally:
        con.unregister("_attnbase_rows")


def insert_rows(con, table: str, run_id: str, tbl: pa.Table, *, where: str | None = None,
                params: Sequence[Any] = (), delete: bool = True) -> None:
    """On an open connection/transaction: optionally delete ``run_id``'s rows, then insert."""
    if delete:
        clause = f" AND ({where})" if where else ""
        con.execute(f"DELETE FROM {table} WHERE run_id = ?{clause}", [run_id, *params])
    if "run_id" in tbl.column_names:
        insert_table(con, table, tbl)
        return
    if tbl.num_rows == 0:
        return
    con.register("_attnbase_rows", tbl)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT ?::VARCHAR AS run_id, * "
                    "FROM _attnbase_rows", [run_id])
    finally:
        con.unregister("_attnbase_rows")


def delete_run_bytes(db_path: Path, run: RunHandle) -> None:
    """Every byte of ``run`` and the local debris of a run of that name under ``db_path`` (a
    stopped merge's staging directories included)."""
    from attnbase.warehouse.runs.statcompact import remove_staging

    local = run_handle(db_path, run.run_id, None)
    local.delete_all()
    remove_staging(local)
    if run.remote:
        run.delete_all()
