"""The service's reads of the catalog: consistent snapshots beside the writers.

:class:`Catalog` is the one interface the routes read through; the app
(:func:`attnbase.serve.app.open_catalog`) picks its implementation: :class:`FileCatalog`
for a database directory (below) and :class:`~attnbase.serve.lake_catalog.LakeCatalog` for
a team database (DuckLake on PostgreSQL). Both read local DuckDB files, one per catalog
state, in the same way; they differ in how a state is told (:meth:`Catalog.state`) and how
its file is made (:meth:`Catalog._make_snapshot`).

DuckDB lets one process hold the catalog file for writing, and a writer (an extraction, an
analysis, a flow) holds it per transaction; a reader that holds it (even read-only) makes the
writer wait. The service therefore reads a snapshot: a copy of the catalog file taken while a
read-only connection holds it (no transaction in flight), refreshed when the file changes
(:class:`Catalog`). The first open at start-up waits for a writer with the warehouse's one
retry policy (:meth:`attnbase.warehouse.catalog.duckdb_file.DuckDBFileBackend.open`, up to
``open_wait_s``); later refreshes wait at most :attr:`Catalog.REFRESH_WAIT_S` and otherwise
answer from the previous snapshot. Every connection has :meth:`Settings.duckdb_config` (the SQL
sandbox and its resource limits) and every query runs under the watchdog
(:func:`attnbase.warehouse.sandbox.sql.query_arrow`).

:meth:`Catalog.state` is the catalog's state as the file system shows it (size and mtime of the
catalog file and its WAL); the ETag of every GET response is the state of the snapshot read.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from attnbase.serve.filecheck import FileCheck, damaged_in
from attnbase.serve.settings import Settings
from attnbase.warehouse.catalog.duckdb_file import DuckDBFileBackend
from attnbase.warehouse.database import Database
from attnbase.warehouse.runs.decoded import Decoded


def clean(value: Any) -> Any:
    """A value as JSON can hold it: NaN/inf -> None, dates -> ISO text, numpy -> Python."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (np.floating,)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.ndarray):
        return [clean(v) for v in value.tolist()]
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


#: Values one snapshot keeps (:meth:`Catalog.memo`): a run's heads' bundle is ~1-7 MB of rows
#: at GPT-2 size (144 heads x 10 dissimilarity/convention pairs x 5 nearest), so a handful of
#: runs' pages are kept warm, not every run a long-lived snapshot was asked about.
MEMO_ENTRIES = 32


def snapshot_root() -> Path:
    """The one private directory (0700, this user's) of every server's snapshot copies:
    ``<temp>/attnbase-serve-<uid>``. Refused when another user owns it or others may read it."""
    import os
    import stat

    from attnbase.errors import AttnbaseError

    root = Path(tempfile.gettempdir()) / f"attnbase-serve-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise AttnbaseError(f"{root} is not a private directory of this user (mode "
                            f"{stat.S_IMODE(st.st_mode):o}); remove it and start again")
    return root


def snapshot_dir() -> Path:
    """This process's directory under :func:`snapshot_root` (``pid-<pid>-<random>``), after
    removing those of processes that are gone (a server killed before it could clean up)."""
    import os

    from attnbase.warehouse.catalog.lease import pid_gone

    root = snapshot_root()
    for old in root.glob("pid-*"):
        if pid_gone(old.name.split("-")[1]):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"pid-{os.getpid()}-", dir=root))


class _Snapshot(Database):
    """A copy of the catalog file read in place of the catalog: the database directory (and so
    the statistics files and stores) stays ``path``; only the DuckDB file differs.

    The copy is private, so one connection to it stays open while it is current (opening a
    DuckDB instance costs, a cursor of an open one does not; benchmarks/RESULTS.md: "catalog
    snapshot kept open"); sessions are its cursors.
    Once superseded it is closed and deleted when its last session ends.
    """

    def __init__(self, path, file: Path, state: str, config: dict) -> None:
        # the copy of a migrated catalog; never written
        super().__init__(path, catalog=DuckDBFileBackend(path, file=file, migrated=True))
        self.file, self.state, self.config = file, state, config
        self._lock = threading.Lock()
        self._root = None
        self._users = 0
        self._retired = False
        self.memo: dict = {}  # Catalog.memo: values computed from this snapshot, kept with it
        self._memo_locks: dict = {}

    def memoized(self, key, compute):
        """``compute()`` once per ``key`` for this snapshot; concurrent callers of the same key
        wait for the first one (16 clients opening one run's heads compute its bundle once).
        At most :data:`MEMO_ENTRIES` values are kept, the least recently computed dropped."""
        try:
            return self.memo[key]
        except KeyError:
            pass
        with self._lock:
            lock = self._memo_locks.setdefault(key, threading.Lock())
        with lock:
            if key in self.memo:
                return self.memo[key]
            value = compute()
            with self._lock:
                self.memo[key] = value
                while len(self.memo) > MEMO_ENTRIES:
                    old = next(iter(self.memo))
                    del self.memo[old]
                    self._memo_locks.pop(old, None)
            return value

    def cursor(self):
        """A new connection to the open copy (the caller closes it and calls :meth:`done`), or
        None when the copy was superseded and deleted meanwhile (take the current one)."""
        with self._lock:
            if self._retired and self._root is None:
                return None
            if self._root is None:
                self._root = self.catalog.open(read_only=True, config=self.config)
            cur = self._root.cursor()
            views = self.catalog.remote_views
            if views:  # runs on object storage: the root's TEMP views, made on this cursor too
                views.apply(cur)  # (a failing object store: one line; nothing held)
            self._users += 1
            return cur

    def hold(self) -> bool:
        """Keep the copy on disk until :meth:`done` (a query process reads it); False when it
        is gone already (take the current one)."""
        with self._lock:
            if self._retired and self._users == 0:
                return False
            self._users += 1
            return True

    def done(self) -> None:
        with self._lock:
            self._users -= 1
            self._close_if_unused()

    def retire(self) -> None:
        with self._lock:
            self._retired = True
            self._close_if_unused()

    def _close_if_unused(self) -> None:
        if self._retired and self._users == 0:
            if self._root is not None:
                self._root.close()
                self._root = None
            self.file.unlink(missing_ok=True)
            self.file.with_name(self.file.name + ".wal").unlink(missing_ok=True)


class Catalog:
    """Read-only access of one server process to a catalog, through snapshots: local DuckDB
    files of one catalog state each, read while that state is the newest (see the module doc).

    A subclass says what the state is (:meth:`state`, cheap: every request asks) and makes
    the file of one (:meth:`_make_snapshot`); everything else is shared. When the state
    changes, the next request makes the next snapshot while the others read the current one.
    """

    #: Seconds a request waits for a held catalog before answering from the previous snapshot.
    REFRESH_WAIT_S = 0.05

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(settings.db, lock_timeout=settings.open_wait_s)
        self.root = self.db.path  # the directory of runs, statistics files and reports
        self.config = settings.duckdb_config()
        self.cancel = threading.Event()  # set at shutdown: every running query stops
        self._local = threading.local()
        self._current: _Snapshot | None = None
        self._refresh_lock = threading.Lock()
        self._dir: Path | None = None
        self.worst_refresh_wait_s = 0.0  # measured: the longest a refresh waited for the file
        self._carried: dict = {}  # memo key -> (fingerprint, value): see memo(version=...)
        self._carry_lock = threading.Lock()
        # decoded zarr chunks and statistics row groups, shared by every snapshot: each is keyed
        # by its file's identity, so no commit or snapshot makes it stale
        self.decoded = Decoded(settings.decoded_cache_mb << 20)
        # statistics files' checksums, once a version (None: not checked)
        self.filecheck = FileCheck(self.root) if settings.stat_checksums else None
        from attnbase.warehouse.sandbox.sqlproc import QueryPool

        # filled by the server's start; processes run in DIR (see QueryProcess)
        self.query_pool = QueryPool(settings.sql_concurrency, self.root)

    # --- snapshots -------------------------------------------------------------------------
    def _snapshot_dir(self) -> Path:
        if self._dir is None:
            self._dir = snapshot_dir()
        return self._dir

    def close(self) -> None:
        """Stop the query processes, delete the snapshots (server shutdown)."""
        self.query_pool.close()
        with self._refresh_lock:
            if self._current is not None:
                self._current.retire()
            self._current = None
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _make_snapshot(self, state: str, wait_s: float) -> _Snapshot:
        """The snapshot of catalog state ``state`` (a new local file), waiting at most
        ``wait_s`` for the catalog; :attr:`STALE_OK` errors let the current one answer."""
        raise NotImplementedError

    #: errors of :meth:`_make_snapshot` after which the current snapshot answers on
    STALE_OK: tuple = ()

    def reader(self) -> _Snapshot:
        """The snapshot to read now, refreshed when the catalog changed (see the class)."""
        from attnbase.errors import CatalogLockedError

        state = self.state()
        current = self._current
        if current is not None and current.state == state:
            return current
        # while one request makes the next snapshot, the others read the current one
        if not self._refresh_lock.acquire(blocking=current is None,
                                          timeout=-1 if current is not None
                                          else self.settings.open_wait_s):
            if current is not None:
                return current
            raise CatalogLockedError("the catalog snapshot is still being made; retry")
        try:
            current = self._current
            if current is not None and current.state == state:
                return current
            try:
                snap = self._make_snapshot(state, self.REFRESH_WAIT_S if current is not None
                                           else self.settings.open_wait_s)
            except (CatalogLockedError, *self.STALE_OK):
                if current is None:
                    raise
                return current  # the catalog is held (or away): one state old, not a wait
            self._current = snap
            if current is not None:
                current.retire()
            return snap
        finally:
            self._refresh_lock.release()

    def fresh_state(self) -> str | None:
        """The catalog's state when the current snapshot already holds it (nothing to open or
        copy: :meth:`known_state`), else None. Never blocks: the event loop may call it."""
        state = self.known_state()
        if state is None:
            return None
        current = self._current
        return state if current is not None and current.state == state else None

    def etag_state(self) -> str:
        """The state of the snapshot requests read now (the ETag's part)."""
        return self.reader().state

    @contextmanager
    def session(self):
        """One connection for every query of this thread inside the block (a cursor of the
        current snapshot); nested blocks reuse it."""
        if getattr(self._local, "con", None) is not None:
            yield self
            return
        for _ in range(100):  # bounded: a snapshot superseded between reader() and cursor()
            snap = self.reader()
            con = snap.cursor()
            if con is not None:
                break
        else:
            raise RuntimeError("no catalog snapshot stayed current long enough to be opened")
        self._local.con, self._local.snap = con, snap
        try:
            yield self
        finally:
            self._local.con = self._local.snap = None
            con.close()
            snap.done()

    def memo(self, key, compute, version=None):
        """A value computed from the catalog (``compute()``, which may query) once per snapshot
        and key: what a page needs of a whole run (its rows, its heads' bundle, its store) is
        read once while the catalog stays as it is, then shared by every request. Inside
        :meth:`session` (the session's snapshot); a new snapshot starts empty.

        ``version()``, a cheap query, fingerprints the value's inputs: where the newest value of
        ``key`` (of an earlier snapshot) was computed at the same fingerprint it is kept, so a
        writer's commits to one run do not make the pages of every other run recompute."""
        if getattr(self._local, "snap", None) is None:
            with self.session():
                return self.memo(key, compute, version)
        if version is None:
            return self._local.snap.memoized(key, compute)

        def carried():
            v = version()
            with self._carry_lock:
                held = self._carried.pop(key, None)
            value = held[1] if held is not None and held[0] == v else compute()
            with self._carry_lock:
                self._carried[key] = (v, value)
                while len(self._carried) > MEMO_ENTRIES:
                    del self._carried[next(iter(self._carried))]
            return value

        return self._local.snap.memoized(key, carried)

    def state(self) -> str:
        """A short text that changes with every commit of the catalog (the ETag's part)."""
        raise NotImplementedError

    def known_state(self) -> str | None:
        """:meth:`state` where telling it never blocks, else None (ask :meth:`state` on a
        worker thread)."""
        return self.state()

    def query(self, sql: str, params: Sequence[Any] | None = None, *, timeout_s: float | None = None,
              max_rows: int | None = None, max_bytes: int | None = None):
        """A :class:`~attnbase.warehouse.sandbox.sql.QueryResult` under the server's limits."""
        from attnbase.warehouse.sandbox.sql import query_arrow

        limit = self.settings.sql_time_limit_ms / 1000
        if getattr(self._local, "con", None) is None:
            with self.session():
                return self.query(sql, params, timeout_s=timeout_s, max_rows=max_rows,
                                  max_bytes=max_bytes)
        return query_arrow(None, sql, params, config=self.config,
                           timeout_s=limit if timeout_s is None else min(timeout_s, limit),
                           max_rows=max_rows, max_bytes=max_bytes, cancel=self.cancel,
                           con=self._local.con)

    def user_query(self, sql: str, *, timeout_s: float | None = None,
                   max_rows: int | None = None, max_bytes: int):
        """A query a user sent, on the current snapshot, in one of the server's query
        processes (:func:`attnbase.warehouse.sandbox.sql.user_query`) within the settings' limits."""
        from attnbase.warehouse.sandbox.sql import user_query
        from attnbase.warehouse.sandbox.sqlproc import Limits

        s = self.settings
        limit = s.sql_time_limit_ms / 1000
        limits = Limits(time_s=limit if timeout_s is None else min(timeout_s, limit),
                        memory_mb=s.sql_memory_mb, max_bytes=max_bytes, max_rows=max_rows,
                        threads=s.sql_query_threads, nice=s.sql_nice,
                        nice_after_s=s.sql_nice_after_ms / 1000)
        for _ in range(100):  # bounded: a snapshot superseded between reader() and hold()
            snap = self.reader()
            if snap.hold():
                break
        else:
            raise RuntimeError("no catalog snapshot stayed current long enough to be read")
        try:
            damaged = None if self.filecheck is None else damaged_in(snap, self.filecheck)
            return user_query(self.db, sql, limits, file=snap.file, config=self.config,
                              cancel=self.cancel, pool=self.query_pool, damaged=damaged)
        finally:
            snap.done()

    def check_stat_files(self, paths: Sequence[str]) -> None:
        """:class:`StatsFileCorruptError` naming the first of the statistics files ``paths``
        (relative to DIR) whose bytes differ from the catalog's record (:mod:`.filecheck`)."""
        from attnbase.errors import StatsFileCorruptError

        if self.filecheck is None:
            return
        snap = getattr(self._local, "snap", None) or self.reader()
        bad = damaged_in(snap, self.filecheck, paths)
        if bad:
            raise StatsFileCorruptError(next(iter(bad.values())))

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict]:
        """The rows of one of the service's own queries as JSON-ready dicts."""
        return [clean(r) for r in self.query(sql, params).table.to_pylist()]

    def tables(self) -> frozenset[str]:
        """Names of the catalog's tables and views (once per snapshot)."""
        return self.memo(("tables",), lambda: frozenset(r["name"] for r in self.rows(
            "SELECT table_name AS name FROM duckdb_tables() UNION ALL "
            "SELECT view_name FROM duckdb_views() WHERE NOT internal")))

    def run(self, run_id: str):
        """Where ``run_id``'s bytes live (:meth:`Database.run`), told from this snapshot's
        ``runs`` row: never by a query of the catalog file itself, which a writer may hold
        (that open waited for the writer, and a first pattern beside one answered 503)."""
        import json

        facts = self.memo(("run_facts", run_id), lambda: self.rows(
            "SELECT (SELECT json_group_object(name, derivation) FROM arrays "
            "        WHERE run_id = $1 AND derived) AS recipes, "
            "       (SELECT list([batch, first_seq, n_seqs] ORDER BY batch) FROM batches "
            "        WHERE run_id = $1 AND status = 'complete') AS written", [run_id])[0])
        recipes = json.loads(facts["recipes"]) if isinstance(facts["recipes"], str) else (
            facts["recipes"] or {})
        return self.db.run(
            run_id, self.run_row(run_id).get("store_url"),
            recipes=json.dumps({k: v for k, v in recipes.items() if v is not None},
                               sort_keys=True),
            written=tuple(tuple(int(x) for x in w) for w in facts["written"] or ()))

    def run_row(self, run_id: str) -> dict:
        """The ``runs`` row of ``run_id`` (a copy); :class:`NotFoundError` naming the known runs."""
        from attnbase.errors import NotFoundError

        by_id = self.memo(("runs",), lambda: {r["run_id"]: r for r in self.rows(
            "SELECT * FROM runs ORDER BY run_id")})
        if run_id not in by_id:
            known = sorted(by_id)
            shown = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "") or "none"
            raise NotFoundError(f"no run {run_id!r} in this database (known runs: {shown})")
        return dict(by_id[run_id])


class FileCatalog(Catalog):
    """A database directory's ``DIR/catalog.duckdb``, read through copies of it.

    The service never reads the catalog file itself, except to copy it: when the file's
    :meth:`state` changes, the next request opens it read-only (which waits while a writer
    holds it), copies it (and its WAL, if any) into a private directory and closes it, a few
    milliseconds per MB. Every query then reads that consistent copy, so (a) a writer never
    waits behind a page or a long query of the service, only behind a copy, and (b) a request
    never waits behind a writer for longer than :data:`REFRESH_WAIT_S` once a first snapshot
    exists: while the catalog is held, the previous snapshot (one commit old) answers.
    """

    def _make_snapshot(self, state: str, wait_s: float) -> _Snapshot:
        src = self.db.catalog_path
        dst = self._snapshot_dir() / f"catalog-{state}-{time.monotonic_ns()}.duckdb"
        primary = self.db
        primary.lock_timeout = wait_s  # only this method opens the primary (under a lock)
        t0 = time.monotonic()
        with primary.connect(read_only=True):  # no writer is inside a transaction meanwhile
            self.worst_refresh_wait_s = max(self.worst_refresh_wait_s, time.monotonic() - t0)
            shutil.copyfile(src, dst)
            wal = src.with_name(src.name + ".wal")
            if wal.exists():
                shutil.copyfile(wal, dst.with_name(dst.name + ".wal"))
        return _Snapshot(self.root, dst, state, self.config)

    def state(self) -> str:
        """A short digest of the catalog's on-disk state (changes with every commit)."""
        parts = []
        for p in (self.db.catalog_path, self.db.catalog_path.with_name(
                self.db.catalog_path.name + ".wal")):
            try:
                st = p.stat()
                parts.append(f"{st.st_size}:{st.st_mtime_ns}")
            except FileNotFoundError:
                parts.append("-")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]
