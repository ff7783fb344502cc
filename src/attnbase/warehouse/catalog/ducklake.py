"""A team database's catalog: DuckLake on PostgreSQL (:class:`DuckLakeBackend`).

``attnbase init --db postgresql://USER@HOST:PORT/DBNAME --data DIR`` makes one. The catalog's
tables (docs/architecture.md) live in a DuckLake whose metadata is that PostgreSQL database;
small writes stay inlined in PostgreSQL, larger ones become Parquet files under
``DATA/lake/``. Run stores and statistics files live under the data location ``DATA`` (a
directory every machine of the team mounts at the same path, or ``s3://BUCKET/PREFIX``: runs
then live under ``DATA/runs/<run_id>/`` as ``extract --store`` puts them, and DuckLake reaches
its Parquet files through httpfs with a TEMPORARY secret made from the standard AWS
environment of each process), which the catalog records
(``attnbase_team``, a PostgreSQL table beside DuckLake's own), so every other command names
the database by its address alone.

Every process keeps one DuckDB instance with the lake attached (loading the two extensions
and attaching costs ~0.4 s) and hands out one cursor per operation; a DuckLake transaction
commits as one PostgreSQL transaction. Writing connections take turns on one PostgreSQL
advisory lock (:meth:`DuckLakeBackend.write_lock`: DuckLake's conflicts are per table). The
ledger (``batches``, ``stat_files``) is not DuckLake's: plain PostgreSQL tables that a batch
mark writes without the lock (:meth:`DuckLakeBackend.ledger`, :mod:`.pg_ledger`), read through
the lake's views of them. The SQL sandbox gets an instance of its own, attached read-only.
Readers see committed batches only: the views ``row_stats`` / ``col_stats`` of every
connection are made at connect time from the files the catalog lists
(:func:`attnbase.warehouse.runs.statfiles.stat_views`), never from files on disk.
Run leases are PostgreSQL rows judged by the server's clock (:mod:`.pg_lease`).

DuckLake has no PRIMARY KEY, UNIQUE or CHECK constraint: the schema is the embedded
catalog's (the same migrations, run on an in-memory database) without them; one writer per
run (the lease) keeps a run's rows unique.

Transient faults of the server (a restart, a dropped connection) are retried for
:data:`RETRY_S` seconds, then fail in one line; the password is libpq's business and appears
in no message.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from attnbase.errors import WarehouseError
from attnbase.warehouse.catalog import migrations
from attnbase.warehouse.catalog.backend import LOCK_TIMEOUT_S, CatalogBackend
from attnbase.warehouse.catalog.retry import retry_transient
from attnbase.warehouse.catalog.team_url import TeamURL

#: PostgreSQL table of the team database's own settings (where its data lives)
SETTINGS_TABLE = "attnbase_team"
LAKE = "lake"
#: rows a DuckLake insert keeps inline in PostgreSQL instead of writing a Parquet file
INLINE_ROWS = 1000
#: seconds a transient server fault (refused or dropped connection) is retried for
RETRY_S = 30.0


@contextmanager
def _no_lock() -> Iterator[None]:
    yield


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


#: what a server that is restarting, or a connection it dropped, says (a wrong password, user
#: or database name is no transient fault: it fails at once)
_TRANSIENT = ("connection refused", "server closed the connection", "terminating connection",
              "the database system is", "no connection to the server", "ssl syscall",
              "broken pipe", "connection reset", "could not receive data",
              "could not send data", "timeout expired", "connection timed out")


def _transient(err: BaseException) -> bool:
    text = str(err).lower()
    return any(s in text for s in _TRANSIENT)


def make_views(con, views) -> None:
    """Run the ``(name, CREATE VIEW sql)`` pairs ``views`` on ``con``, views over views each
    once the ones it reads exist; one that can never be made raises, naming what it lacks."""
    import duckdb

    todo = list(views)
    while todo:
        failed = []
        for name, sql in todo:
            try:
                con.execute(sql)
            except duckdb.CatalogException:
                failed.append((name, sql))
        if len(failed) == len(todo):
            con.execute(failed[0][1])  # raises, naming what is missing
        todo = failed


def _root_of(data: str, make: bool = False) -> Path:
    """The local directory relative statistics paths resolve against, with the zero-row schema
    files the views start from: the data location itself, or, where that is on object
    storage, a cache directory of this machine named after it (made on first use; a local
    data directory is made only by ``make``: by ``init``)."""
    from attnbase.warehouse.runs.location import is_url
    from attnbase.warehouse.runs.statfiles import ensure_schema_files

    if is_url(data):
        import hashlib

        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        root = base / "attnbase" / "team" / hashlib.sha256(data.encode()).hexdigest()[:16]
        make = True
    else:
        root = Path(data)
    if make:
        root.mkdir(parents=True, exist_ok=True)
        ensure_schema_files(root)
    return root


class DuckLakeBackend(CatalogBackend):
    """The catalog of the team database at ``url`` (see the module doc)."""

    file = None  # no catalog file: the service's snapshots are the embedded backend's
    LAKE = LAKE  # the name the lake is attached under

    _instances: dict = {}
    _sandboxes: dict = {}  # (address, configuration) -> (pid, instance): see _sandbox_cursor
    _migrated_here: set = set()  # (pid, address) of catalogs this process found migrated
    _guard = threading.Lock()

    def __init__(self, url: "TeamURL | str", *, lock_timeout: float = LOCK_TIMEOUT_S) -> None:
        self.url = TeamURL.parse(url) if isinstance(url, str) else url
        self.lock_timeout = lock_timeout
        self._migrated = False
        self._settings: dict | None = None
        self.remote_views = None

    def __repr__(self) -> str:
        return f"DuckLakeBackend({str(self.url)!r})"

    # --- PostgreSQL ------------------------------------------------------------------------
    def _pg_connect(self):
        """A new psycopg connection (autocommit) to the catalog's server; refused or dropped
        connections are retried for :data:`RETRY_S` seconds, then one line."""
        try:
            import psycopg
        except ModuleNotFoundError:
            from attnbase.errors import MissingExtraError

            raise MissingExtraError("a team database needs psycopg; install it with: "
                                    "pip install 'attnbase[team]'") from None
        try:
            return retry_transient(
                lambda: psycopg.connect(self.url.conninfo(), autocommit=True, connect_timeout=5),
                transient=lambda e: isinstance(e, psycopg.OperationalError) and _transient(e),
                within_s=RETRY_S, first_s=0.1, cap_s=2.0)
        except psycopg.OperationalError as err:
            raise WarehouseError(
                f"cannot reach the team database {self.url}: {_first_line(err)}; check "
                "the server, the address, and PGPASSWORD or ~/.pgpass") from None

    @contextmanager
    def pg(self) -> Iterator[Any]:
        """A psycopg connection of its own (autocommit), closed on exit (:meth:`_pg_connect`)."""
        con = self._pg_connect()
        try:
            yield con
        finally:
            con.close()

    def settings(self, fresh: bool = False) -> dict:
        """``attnbase_team`` as a dict (empty where no team database was made here)."""
        if self._settings is None or fresh:
            with self.pg() as pg:
                exists = pg.execute("SELECT to_regclass(%s) IS NOT NULL",
                                    [f"public.{SETTINGS_TABLE}"]).fetchone()[0]
                rows = pg.execute(f"SELECT key, value FROM {SETTINGS_TABLE}").fetchall() \
                    if exists else []
            self._settings = dict(rows)
        return self._settings

    @staticmethod
    def put_setting(pg, key: str, value: str) -> None:
        """Set ``attnbase_team``'s ``key`` on the psycopg connection ``pg``."""
        pg.execute(f"INSERT INTO {SETTINGS_TABLE} VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
                   "SET value = EXCLUDED.value", [key, value])

    def exists(self) -> bool:
        return bool(self.settings())

    def data(self) -> str:
        """The data location: where run stores and statistics files live."""
        s = self.settings()
        if not s:
            raise self.missing()
        return s["data"]

    def missing(self) -> WarehouseError:
        return WarehouseError(
            f"no attnbase database at {self.url}; create one with `attnbase init --db {self.url} "
            "--data DIR`")

    # --- DuckDB ----------------------------------------------------------------------------
    def on_s3(self, data: str | None = None) -> bool:
        """Whether the data location (``data``, else the recorded one) is on object storage."""
        from attnbase.warehouse.runs.location import is_url

        return is_url(data if data is not None else self.data())

    def default_store(self) -> str | None:
        """Where new runs go: ``DATA/runs`` when the data location is on object storage (None:
        under the local data directory)."""
        return f"{self.data().rstrip('/')}/runs" if self.on_s3() else None

    def lake_dirs(self) -> list[str]:
        """The lake's own data directory where it is on object storage (a sandbox reads it)."""
        return [f"{self.data().rstrip('/')}/lake/"] if self.on_s3() else []

    def _attach(self, con, read_only: bool, data: str | None = None) -> None:
        from attnbase.warehouse.catalog.lake_extensions import extension_files

        s3 = self.on_s3(data)
        for f in extension_files(s3=s3):
            con.execute(f"LOAD '{f}'")
        if s3:
            from attnbase.warehouse.runs.location import duckdb_s3_secret

            duckdb_s3_secret(con)
        opts = [f"DATA_INLINING_ROW_LIMIT {INLINE_ROWS}"]
        if data is not None:
            opts.append(f"DATA_PATH '{data.rstrip('/')}/lake/'")
        if read_only:
            opts.append("READ_ONLY")
        from attnbase.warehouse.catalog.pg_ledger import LEDGER_DB, SCHEMA

        conninfo = self.url.conninfo().replace("'", "''")
        ro = ", READ_ONLY" if read_only else ""
        try:
            retry_transient(
                lambda: con.execute(f"ATTACH 'ducklake:postgres:{conninfo}' AS {LAKE} "
                                    f"({', '.join(opts)})"),
                transient=_transient, within_s=RETRY_S, first_s=0.5, cap_s=0.5)
            # the ledger's tables (pg_ledger), read by the lake's views of them
            con.execute(f"ATTACH '{conninfo}' AS {LEDGER_DB} (TYPE postgres, "
                        f"SCHEMA '{SCHEMA}'{ro})")
        except Exception as err:  # noqa: BLE001  duckdb's IOException and kin
            raise WarehouseError(f"cannot attach the team database {self.url}: "
                                 f"{_first_line(err)}") from None
        con.execute(f"USE {LAKE}")

    def _new_instance(self, read_only: bool, config: dict | None = None):
        import duckdb

        conf = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                "file_search_path": str(self.local_root()), **(config or {})}
        con = duckdb.connect(":memory:", config=conf)
        try:
            self._attach(con, read_only)
        except BaseException:
            con.close()
            raise
        return con

    def reader_instance(self, config: dict | None = None):
        """A DuckDB instance of its own with the lake attached READ_ONLY (the caller closes
        it): what the service copies snapshots out of (``AT (VERSION => n)``) and what
        ``attnbase.attach_lake`` hands a notebook."""
        return self._new_instance(read_only=True, config=config)

    def _instance(self):
        """This process's DuckDB instance with the lake attached (made on first use, made
        again after a fork)."""
        key = str(self.url)
        with self._guard:
            held = self._instances.get(key)
            if held is not None and held[0] == os.getpid():
                return held[1]
            con = self._new_instance(read_only=False)
            self._instances[key] = (os.getpid(), con)
            return con

    def _cursor(self):
        """A cursor of this process's instance, in the lake. (The postgres extension makes its
        server connections again after a restart: the instance outlives one.)"""
        con = self._instance().cursor()
        try:  # the lake's newest snapshot is read here: a server restarting is waited for
            retry_transient(lambda: con.execute(f"USE {LAKE}"), transient=_transient,
                            within_s=RETRY_S, first_s=0.1, cap_s=2.0)
        except Exception as err:  # noqa: BLE001  duckdb's IOException and kin
            con.close()
            if _transient(err):
                raise WarehouseError(f"cannot reach the team database {self.url}: "
                                     f"{_first_line(err)}") from None
            raise
        return con

    def local_root(self) -> Path:
        """The directory relative statistics paths resolve against (:func:`_root_of`)."""
        return _root_of(self.data())

    def open(self, read_only: bool, config: dict | None = None, stats: bool = True) -> Any:
        if config:  # the SQL sandbox: an instance of its own, read-only
            return self._sandbox_cursor(config, stats)
        con = self._cursor()
        if stats:
            from attnbase.warehouse.runs.statfiles import attach_remote_views

            self.remote_views = attach_remote_views(con, always=True)
        return con

    def _sandbox_cursor(self, config: dict, stats: bool):
        """A cursor of this process's sandboxed instance of ``config`` (the lake attached
        READ_ONLY, the configuration locked), made once per configuration: loading the two
        extensions and attaching cost a second or two, which every query of a report or a
        ``read_sql`` loop paid. The cursor gets ``row_stats``/``col_stats`` views of the files
        the catalog lists now. Runs on object storage (their file system registered per
        connection) get an instance of their own each time, as before."""
        import json

        from attnbase.warehouse.catalog.duckdb_file import _LATE_SETTINGS, _apply_late_settings
        from attnbase.warehouse.runs.statfiles import (RemoteViews, attach_remote_views,
                                                       stat_views)

        conf = dict(config)
        late = {k: conf.pop(k) for k in _LATE_SETTINGS if k in conf}
        views = RemoteViews()
        if stats:
            plain = self._cursor()
            try:
                views = stat_views(plain, always=True)
            finally:
                plain.close()
        if views._rows:  # runs on object storage
            con = self._new_instance(read_only=True, config=conf)
            self.remote_views = attach_remote_views(con, always=True)
            if late:
                _apply_late_settings(con, str(self.local_root()), late,
                                     [*self.remote_views.dirs, *self.lake_dirs()])
            return con
        key = (str(self.url), json.dumps([conf, late], sort_keys=True, default=str))
        with self._guard:
            held = self._sandboxes.get(key)
            if held is None or held[0] != os.getpid():
                root = self._new_instance(read_only=True, config=conf)
                if late:
                    _apply_late_settings(root, str(self.local_root()), late, self.lake_dirs())
                self._sandboxes[key] = held = (os.getpid(), root)
        con = held[1].cursor()
        con.execute(f"USE {LAKE}")
        if views:
            views.apply(con)
        self.remote_views = views
        return con

    @contextmanager
    def connect(self, read_only: bool = False, config: dict | None = None,
                stats: bool = True) -> Iterator[Any]:
        """A short-lived cursor; a writing one holds the catalog's write lock while it is open
        (:meth:`write_lock`). A writing cursor is made before the lock is taken (its ``USE``
        reads the lake's newest snapshot, writing nothing), its views of statistics files
        after: the writers' turns are no longer than their transactions."""
        if not self.exists():
            raise self.missing()
        self.ensure_migrated()
        if read_only or config:
            with (self.write_lock() if not read_only else _no_lock()):
                con = self.open(read_only=read_only, config=config, stats=stats)
                try:
                    yield con
                finally:
                    con.close()
            return
        con = self._cursor()
        try:
            with self.write_lock():
                if stats:
                    from attnbase.warehouse.runs.statfiles import attach_remote_views

                    self.remote_views = attach_remote_views(con, always=True)
                yield con
        finally:
            con.close()

    @property
    def sessions(self):
        """The PostgreSQL sessions this process keeps for this database
        (:class:`~.pg_sessions.KeptSessions`)."""
        from attnbase.warehouse.catalog.pg_sessions import KeptSessions

        return KeptSessions(str(self.url), self._pg_connect)

    def write_lock(self):
        """The catalog's writers take turns, as on the embedded catalog's file lock: a
        PostgreSQL advisory lock on a session this process keeps, waited for up to
        ``lock_timeout`` seconds, then :class:`CatalogLockedError`. DuckLake detects conflicts
        by table, not by row: a transaction that deletes or updates rows conflicts with any
        other that writes the same table at the same time, so concurrent writers of different
        runs would fail each other's commits; and concurrent commits that do not conflict
        still race for DuckLake's next snapshot, the losers retrying after 100 ms and more
        (benchmarks/history/2026-12-05-team-ledger-in-ducklake.md, the floor rows)."""
        return self.sessions.write_lock(self.lock_timeout, self._locked_message)

    def _locked_message(self) -> str:
        return (f"the team database {self.url} is being written by another process for over "
                f"{self.lock_timeout:.0f} s; wait for it to finish")

    @contextmanager
    def ledger(self) -> Iterator[Any]:
        """A ledger transaction in PostgreSQL (:class:`~.pg_ledger.PgLedger`), on a session
        this process keeps: no write lock, no DuckLake commit. Every connection makes its
        statistics views from the list at connect time, so nothing is refreshed here. A kept
        session the server dropped is replaced before the transaction begins; one lost inside
        it fails in one line (nothing of it is committed)."""
        from attnbase.warehouse.catalog.pg_ledger import MARK_SQL, PgLedger

        if not self.exists():
            raise self.missing()
        self.ensure_migrated()

        def went_away(reason: str) -> WarehouseError:
            return WarehouseError(f"the team database {self.url} went away during a ledger "
                                  f"transaction ({reason}); nothing of it was committed: run "
                                  "the command again, it resumes")

        with self.sessions.transaction(went_away) as cur:
            yield PgLedger(cur)
            cur.execute(MARK_SQL)

    # --- schema ----------------------------------------------------------------------------
    def create(self, data: str) -> list:
        """Make the team database: the lake (data under ``data``/lake/), its tables at the
        current schema, and ``attnbase_team``. Idempotent; two makers take turns."""
        from attnbase._version import __version__

        data = str(data).rstrip("/")
        with self.pg() as pg:
            pg.execute("SELECT pg_advisory_lock(hashtext('attnbase:init'))")
            try:
                have = self.settings(fresh=True)
                if have:
                    if have.get("data") != data:
                        raise WarehouseError(
                            f"the team database {self.url} exists with its data at "
                            f"{have.get('data')}, not {data}; drop --data, or give that one")
                    return []
                root = str(_root_of(data, make=True))
                import duckdb

                con = duckdb.connect(":memory:", config={
                    "autoinstall_known_extensions": False, "autoload_known_extensions": False,
                    "file_search_path": root})
                try:
                    self._attach(con, read_only=False, data=data)
                    applied = self._make_tables(con, root)
                finally:
                    con.close()
                pg.execute(f"CREATE TABLE IF NOT EXISTS {SETTINGS_TABLE} (key text PRIMARY KEY, "
                           "value text NOT NULL)")
                from attnbase.warehouse.catalog import pg_lease

                pg.execute(pg_lease.DDL)
                with pg.transaction():
                    for k, v in (("data", data), ("attnbase_version", __version__)):
                        self.put_setting(pg, k, v)
            finally:
                pg.execute("SELECT pg_advisory_unlock(hashtext('attnbase:init'))")
        self._settings = None
        from attnbase.warehouse.catalog import pg_ledger

        pg_ledger.ensure(self)
        self._migrated = True
        return applied

    def _make_tables(self, con, root: str) -> list:
        """The embedded catalog's tables and views, made in the lake in one transaction (none
        made where the lake holds them already: a maker stopped after this step)."""
        import duckdb

        have = {r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [LAKE]).fetchall()}
        if "schema_migrations" in have:
            return []
        seed = duckdb.connect(":memory:", config={"file_search_path": root})
        try:
            applied = migrations.migrate(seed)
            tables = [r[0] for r in seed.execute(
                "SELECT table_name FROM duckdb_tables() WHERE NOT internal AND schema_name = 'main' "
                "ORDER BY table_name").fetchall()]
            views = seed.execute(
                "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND "
                "schema_name = 'main' ORDER BY view_name").fetchall()
            con.execute("BEGIN TRANSACTION")
            for t in tables:
                cols = seed.execute(
                    "SELECT column_name, data_type, is_nullable, column_default FROM "
                    "duckdb_columns() WHERE table_name = ? AND schema_name = 'main' "
                    "ORDER BY column_index", [t]).fetchall()
                parts = [f'"{c}" {ty}' + ("" if nullable else " NOT NULL")
                         + (f" DEFAULT {d}" if d not in (None, "NULL") else "")
                         for c, ty, nullable, d in cols]
                con.execute(f'CREATE TABLE "{t}" ({", ".join(parts)})')
                rows = seed.execute(f'SELECT * FROM "{t}"').to_arrow_table()
                if rows.num_rows:
                    con.register("_seed_rows", rows)
                    con.execute(f'INSERT INTO "{t}" SELECT * FROM _seed_rows')
                    con.unregister("_seed_rows")
            make_views(con, views)
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except Exception:  # noqa: BLE001  nothing begun
                pass
            raise
        finally:
            seed.close()
        return applied

    def migrate(self) -> list:
        if not self.exists():
            raise self.missing()
        migrations.all_migrations()
        con = self._cursor()
        try:
            applied = migrations.migrate(con)
        finally:
            con.close()
        self._migrated = True
        return applied

    def ensure_migrated(self) -> None:
        """Migrate unless this process found the catalog migrated already (checked once per
        process and address: each ``Database(address)`` of a ``read_sql`` loop paid it)."""
        if self._migrated or (os.getpid(), str(self.url)) in self._migrated_here:
            return
        from attnbase.warehouse.catalog import pg_ledger

        pg_ledger.ensure(self)
        migrations.all_migrations()
        con = self._cursor()
        try:
            todo = migrations.pending(con)
        finally:
            con.close()
        if todo:
            self.migrate()
        self._migrated = True
        self._migrated_here.add((os.getpid(), str(self.url)))

    # --- leases ----------------------------------------------------------------------------
    def acquire_lease(self, run_id: str, purpose: str, *, wait: bool = False,
                      config_hash: str | None = None, timeout: float | None = None):
        from attnbase.warehouse.catalog import pg_lease

        return pg_lease.acquire(self, run_id, purpose, wait=wait, config_hash=config_hash,
                                timeout=timeout)

    def lease_holder(self, run_id: str) -> dict | None:
        from attnbase.warehouse.catalog import pg_lease

        return pg_lease.holder(self, run_id)
