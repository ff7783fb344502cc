"""The embedded catalog: one DuckDB file, ``DIR/catalog.duckdb`` (:class:`DuckDBFileBackend`).

Connections are short-lived (one per operation) so that ``attnbase sql`` can read between the
writes of a running extraction: DuckDB lets one process hold a file for writing at a time.

The write path retries in one place, :meth:`DuckDBFileBackend.open`, through the one retry
policy (:mod:`~attnbase.warehouse.catalog.retry`): a catalog held by another process is a
transient fault, waited for with exponential backoff up to ``lock_timeout`` seconds, then
:class:`CatalogLockedError`. Nothing above retries catalog access
again, and no other error is retried anywhere (a run-config conflict fails at once). Within one
process DuckDB refuses a read-only and a read-write connection to the same file at the same
time; threads of a process therefore take turns by mode (:class:`_ModeLock`: any number of
connections of one mode, the other mode waits), so that conflict never reaches DuckDB. A new
catalog is built and migrated aside and published whole (:meth:`DuckDBFileBackend._create`):
making one holds no lock.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import duckdb

if TYPE_CHECKING:
    from attnbase.warehouse.catalog.ledger import DuckLedger

from attnbase.errors import CatalogLockedError, WarehouseError
from attnbase.warehouse.catalog import migrations
from attnbase.warehouse.catalog.backend import LOCK_TIMEOUT_S, CatalogBackend
from attnbase.warehouse.catalog.retry import retry_transient

CATALOG_FILE = "catalog.duckdb"

#: Longest pause between two read-only open attempts: a writer releases the file only between
#: its transactions, gaps a reader backing off for long mostly misses; a failed open is cheap,
#: so readers poll often (benchmarks/RESULTS.md: "catalog read retry").
READ_RETRY_MAX_S = 0.01

_LOCK_PID = re.compile(r"Conflicting lock is held in (.+?) \(PID (\d+)\)")


def _is_lock(err: BaseException) -> bool:
    """A lock held by another process (released when that process's connection closes)."""
    return isinstance(err, duckdb.Error) and "could not set lock" in str(err).lower()


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



class DuckDBFileBackend(CatalogBackend):
    """The catalog of the database directory ``root``: the DuckDB file ``root/catalog.duckdb``
    (or ``file``: a snapshot of it that the service or a query process reads; ``migrated``: a
    copy of a migrated catalog, never written)."""

    def __init__(self, root: str | Path, *, lock_timeout: float = LOCK_TIMEOUT_S,
                 file: Path | None = None, migrated: bool = False) -> None:
        self.root = Path(root)
        self.file = self.root / CATALOG_FILE if file is None else Path(file)
        self.lock_timeout = lock_timeout
        self._migrated = migrated
        self.remote_views = None  # the last open's TEMP views of runs on object storage

    def __repr__(self) -> str:
        return f"DuckDBFileBackend({str(self.file)!r})"

    def exists(self) -> bool:
        return self.file.exists()

    def missing(self) -> WarehouseError:
        return WarehouseError(
            f"no attnbase database at {self.root} (no {CATALOG_FILE}); create one with "
            f"`attnbase extract --db {self.root} ...` or `attnbase init --db {self.root}`")

    def open(self, read_only: bool, config: dict | None = None,
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
        root = str(self.root.resolve())
        conf = dict(config or {})
        late = {k: conf.pop(k) for k in _LATE_SETTINGS if k in conf}
        conf["file_search_path"] = root
        cap_s = READ_RETRY_MAX_S if read_only else 0.25
        try:
            con = retry_transient(
                lambda: duckdb.connect(str(self.file), read_only=read_only, config=conf),
                transient=_is_lock, within_s=self.lock_timeout, first_s=min(0.02, cap_s),
                cap_s=cap_s)
        except duckdb.Error as err:
            if _is_lock(err):
                raise CatalogLockedError(_lock_message(self.file, err)) from None
            damaged = corrupt_catalog_error(err, self.file)
            if damaged is not None:
                raise damaged from None
            msg = str(err).strip().splitlines()[0]
            raise WarehouseError(f"cannot open catalog {self.file}: {msg}") from err
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

        self.root.mkdir(parents=True, exist_ok=True)
        ensure_schema_files(self.root)
        migrations.all_migrations()  # the providers' imports, before the catalog is held
        if not self.file.exists():
            made = self._create()
            if made is not None:
                self._migrated = True
                return made
        lock = _mode_lock(self.file)
        if not lock.acquire(_mode(False, None), self.lock_timeout):
            raise CatalogLockedError(f"catalog {self.file} is held by another thread of "
                                     "this process; wait for it to finish or use another --db")
        try:
            con = self.open(read_only=False)
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

        for stale in self.root.glob(f".{CATALOG_FILE}.*-*.new*"):  # a killed maker's leftovers
            if pid_gone(stale.name[len(CATALOG_FILE) + 2:].split("-", 1)[0]):
                stale.unlink(missing_ok=True)
        tmp = self.root / f".{CATALOG_FILE}.{os.getpid()}-{uuid.uuid4().hex[:8]}.new"
        try:
            try:
                con = duckdb.connect(str(tmp), config={"file_search_path": str(self.root.resolve())})
            except duckdb.Error as err:
                msg = str(err).strip().splitlines()[0]
                raise WarehouseError(f"cannot create catalog {self.file}: {msg}") from err
            try:
                applied = migrations.migrate(con)
                con.execute("CHECKPOINT")  # every change in the file itself, none in a WAL
            finally:
                con.close()
            try:
                os.link(tmp, self.file)
            except OSError:  # published by another process first (or no hard links here)
                return None
            return applied
        finally:
            for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
                leftover.unlink(missing_ok=True)

    def ensure_migrated(self) -> None:
        if self._migrated:
            return
        if self.file.exists():
            migrations.all_migrations()  # the providers' imports, before the catalog is held
            lock = _mode_lock(self.file)
            if not lock.acquire(_mode(True, None), self.lock_timeout):
                raise CatalogLockedError(f"catalog {self.file} is held by another thread "
                                         "of this process; wait for it to finish or use another --db")
            try:
                con = self.open(read_only=True)
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
        (:func:`attnbase.warehouse.runs.statfiles.attach_remote_views`): the write path's ledger
        transactions never read them.
        """
        if read_only and not self.file.exists():
            raise self.missing()
        self.ensure_migrated()
        lock = _mode_lock(self.file)
        if not lock.acquire(_mode(read_only, config), self.lock_timeout):
            raise CatalogLockedError(
                f"catalog {self.file} is held by another thread of this process in "
                f"another mode for over {self.lock_timeout:.0f} s; wait for it to finish or use "
                "another --db")
        try:
            con = self.open(read_only=read_only, config=config, stats=stats)
            try:
                yield con
            except duckdb.Error as err:  # a damaged block met by any query on the connection
                damaged = corrupt_catalog_error(err, self.file)
                if damaged is None:
                    raise
                raise damaged from None
            finally:
                con.close()
        finally:
            lock.release()

    def damaged_tables(self) -> list[tuple[str, str]]:
        """Every table of the file read whole, so that DuckDB checks each of its blocks'
        checksums (a damaged block fails only the questions that read it until then)."""
        out = []
        with self.connect(read_only=True, stats=False) as con:
            tables = con.execute(
                "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = "
                "current_database() AND NOT temporary ORDER BY 1, 2").fetchall()
            for schema, table in tables:
                try:
                    reader = con.sql(f'SELECT * FROM "{schema}"."{table}"').to_arrow_reader(
                        1 << 16)
                    try:
                        for _ in reader:
                            pass
                    finally:
                        reader.close()  # an unfinished reader holds the database (DuckDB 1.5)
                except duckdb.Error as err:
                    if corrupt_catalog_error(err, self.file) is None:
                        raise
                    out.append((table, f"catalog {self.file}: table {table!r} has a block that "
                                "fails DuckDB's checksum; restore the file from a copy (DuckDB "
                                "cannot repair a block)"))
        return out

    @contextmanager
    def ledger(self) -> Iterator[DuckLedger]:
        """A writing transaction that changes which batches are complete and which statistics
        files readers see (:class:`~attnbase.warehouse.catalog.ledger.DuckLedger` on the
        catalog's connection): on commit the views read exactly the listed files
        (:func:`attnbase.warehouse.catalog.statledger.refresh_views`). One at a time per process
        (two would both replace the views: a write-write conflict); processes take turns by the
        catalog's file lock."""
        from attnbase.warehouse.catalog.ledger import DuckLedger
        from attnbase.warehouse.catalog.statledger import refresh_views

        with _ledger_lock(self.file):
            with self.transaction(stats=False) as con:
                yield DuckLedger(con)
                refresh_views(con)


def corrupt_catalog_error(err: BaseException, file: Path):
    """DuckDB's failure on a catalog block whose checksum does not match as one line naming
    the catalog file and the fix (:class:`~attnbase.errors.CatalogCorruptError`); None for any
    other error."""
    from attnbase.errors import CatalogCorruptError

    text = str(err).strip()
    if "Corrupt database file" not in text:
        return None
    detail = next((ln.strip() for ln in text.splitlines() if "checksum" in ln), text.splitlines()[0])
    return CatalogCorruptError(
        f"catalog {file} is damaged: a block fails its checksum ({detail[:160]}); DuckDB cannot "
        f"repair it: restore {file.name} from a copy of the file (the runs' stores and "
        f"statistics files are separate); `attnbase verify --db {file.parent}` reads every "
        "table of the catalog")
