"""A team database as the service reads it: a local DuckDB file per DuckLake snapshot.

Every commit to a team database's catalog is a DuckLake snapshot, numbered; a reader sees
committed snapshots only. The ledger (``batches``, ``stat_files``) is PostgreSQL's own tables
(:mod:`attnbase.warehouse.catalog.pg_ledger`), each of its transactions one more ``version``.
The service's state of the catalog (:meth:`LakeCatalog.state`, the ETag's part) is the newest
snapshot's number with the ledger's version, read from PostgreSQL at most once per
:data:`POLL_S` (one query). For each new state the next request copies the lake's
tables as of that snapshot (``AT (VERSION => n)``) and the ledger's as they are into a private
DuckDB file, with the catalog's views and the ``row_stats``/``col_stats`` views over the
statistics files it lists; from then on that file is read exactly as a directory database's snapshot
(:class:`~attnbase.serve.catalog.FileCatalog`), by the pages and by the query processes of
user SQL. A copy after the first starts from the previous snapshot's file and copies again
only the tables the snapshots in between changed (DuckLake's ``ducklake_snapshot_changes``),
any other change (a table made, altered or dropped) copies everything.

So user SQL never reaches the lake: the query processes open a local file with the sandbox's
configuration, and neither the PostgreSQL address, its password (libpq's, in the server's
environment) nor DuckLake's ``__ducklake_*`` metadata exist in their DuckDB. While the
catalog server is away, the last snapshot answers (and the first request waits for it).
"""

from __future__ import annotations

import re
import shutil
import threading
import time

from attnbase.errors import WarehouseError
from attnbase.serve.catalog import Catalog, _Snapshot
from attnbase.serve.settings import Settings

#: Seconds the newest snapshot number read from PostgreSQL stays the state requests see.
POLL_S = 0.2
#: Seconds before a failed read of the snapshot number is tried again.
RETRY_POLL_S = 1.0
#: Change kinds of DuckLake's ``changes_made`` that touch one table's rows (its id follows):
#: only those tables are copied again; any other kind copies every table.
ROW_CHANGES = frozenset({"inlined_insert", "inlined_delete", "inserted_into_table",
                         "deleted_from_table", "compacted_table", "flushed_inlined"})
_CHANGE = re.compile(r'(\w+):("(?:[^"]|"")*"(?:\."(?:[^"]|"")*")*|\d+)')


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lake_version(state: str) -> int:
    """The DuckLake snapshot of a state ``lake-N-V``."""
    return int(state.split("-")[1])


def _ledger_version(state: str) -> int:
    """The ledger's version of a state ``lake-N-V``."""
    return int(state.split("-")[2])


def changed_tables(changes: list[str], table_names: dict[int, str]) -> set[str] | None:
    """The tables whose rows the snapshots' ``changes_made`` texts touch, or None where one
    names any other change (then every table is copied)."""
    out: set[str] = set()
    for text in changes:
        for kind, value in _CHANGE.findall(text or ""):
            if kind not in ROW_CHANGES or not value.isdigit() or int(value) not in table_names:
                return None
            out.add(table_names[int(value)])
    return out


class LakeCatalog(Catalog):
    """The catalog of the team database ``settings.db`` (see the module doc)."""

    STALE_OK = (WarehouseError,)

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.lake = self.db.catalog
        self._builder = None  # a DuckDB instance with the lake attached READ_ONLY
        self._pg = None  # the connection the snapshot number is read on
        self._latest: str | None = None
        self._polled_at = float("-inf")
        self._poll_lock = threading.Lock()
        self._pg_lock = threading.Lock()

    # --- the state: the newest snapshot's number and the ledger's version -------------------
    def _pg_rows(self, sql: str, params: list | None = None) -> list[tuple]:
        """Rows of a query of DuckLake's metadata in PostgreSQL, on one kept connection (one
        line where the server is away)."""
        import psycopg

        with self._pg_lock:
            try:
                if self._pg is None:
                    self._pg = psycopg.connect(self.lake.url.conninfo(), autocommit=True,
                                               connect_timeout=5)
                return self._pg.execute(sql, params).fetchall()
            except psycopg.Error as err:
                if self._pg is not None:
                    self._pg.close()
                self._pg = None
                line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise WarehouseError(f"cannot read the snapshots of the team database "
                                     f"{self.lake.url}: {line}") from None

    def _read_latest(self) -> str:
        """``N-V``: the newest DuckLake snapshot ``N`` and the ledger's version ``V``
        (:data:`~attnbase.warehouse.catalog.pg_ledger.STATE_SQL`), in one query."""
        from attnbase.warehouse.catalog.pg_ledger import STATE_SQL

        n, v = self._pg_rows(f"SELECT (SELECT max(snapshot_id) FROM ducklake_snapshot), "
                             f"({STATE_SQL})")[0]
        return f"{int(n)}-{int(v)}"

    def state(self) -> str:
        if time.monotonic() - self._polled_at < POLL_S and self._latest is not None:
            return f"lake-{self._latest}"
        with self._poll_lock:
            if time.monotonic() - self._polled_at >= POLL_S or self._latest is None:
                try:
                    self._latest = self._read_latest()
                    self._polled_at = time.monotonic()
                except WarehouseError:
                    current = self._current
                    if current is None:
                        raise
                    # the catalog server away: the current snapshot answers meanwhile
                    self._polled_at = time.monotonic() - POLL_S + RETRY_POLL_S
                    return current.state
        return f"lake-{self._latest}"

    def known_state(self) -> str | None:
        if time.monotonic() - self._polled_at < POLL_S and self._latest is not None:
            return f"lake-{self._latest}"
        return None

    # --- snapshots ----------------------------------------------------------------------------
    def close(self) -> None:
        super().close()
        if self._builder is not None:
            self._builder.close()
            self._builder = None
        if self._pg is not None:
            self._pg.close()
            self._pg = None

    def _tables_at(self, n: int) -> dict[int, str]:
        """The lake's tables (schema ``main``) at snapshot ``n``: id -> name (from its
        metadata: DuckDB's ``duckdb_tables()`` over a lake costs a few hundred ms)."""
        return dict(self._pg_rows(
            "SELECT t.table_id, t.table_name FROM ducklake_table t JOIN ducklake_schema s "
            "USING (schema_id) WHERE s.schema_name = 'main' AND t.begin_snapshot <= %s "
            "AND (t.end_snapshot IS NULL OR t.end_snapshot > %s)", [n, n]))

    def _changes_since(self, old: int, new: int, tables: dict[int, str]) -> set[str] | None:
        """Tables whose rows snapshots ``old+1 .. new`` changed (None: copy every table)."""
        changes = [r[0] for r in self._pg_rows(
            "SELECT changes_made FROM ducklake_snapshot_changes WHERE snapshot_id > %s "
            "AND snapshot_id <= %s", [old, new])]
        return changed_tables(changes, tables)

    def _make_snapshot(self, state: str, wait_s: float) -> _Snapshot:
        import duckdb

        from attnbase.warehouse.catalog import statledger
        from attnbase.warehouse.catalog.ducklake import LAKE
        from attnbase.warehouse.catalog.ledger import TABLES as LEDGER_TABLES

        n = _lake_version(state)
        dst = self._snapshot_dir() / f"lake-{n}-{time.monotonic_ns()}.duckdb"
        tables = self._tables_at(n)
        base = self._current
        todo = None
        ledger_same = False  # the base's copy of the ledger is current
        if base is not None and base.hold():  # its file stays while it is copied
            try:
                ledger_same = _ledger_version(base.state) == _ledger_version(state)
                todo = self._changes_since(_lake_version(base.state), n, tables)
                if todo is not None:
                    shutil.copyfile(base.file, dst)
            finally:
                base.done()
        if self._builder is None:
            self._builder = self.lake.reader_instance()
        con = self._builder.cursor()
        attached = False
        try:
            con.execute(f"ATTACH '{str(dst).replace(chr(39), chr(39) * 2)}' AS snap")
            attached = True
            con.execute("USE snap")
            con.execute("BEGIN TRANSACTION")
            for t in sorted(tables.values() if todo is None else todo):
                con.execute(f"DROP TABLE IF EXISTS {_q(t)}")
                con.execute(f"CREATE TABLE {_q(t)} AS SELECT * FROM {LAKE}.main.{_q(t)} "
                            f"AT (VERSION => {n})")
            for t in LEDGER_TABLES if todo is None or not ledger_same else ():
                # the ledger as it is now, as tables
                con.execute(f"DROP TABLE IF EXISTS {_q(t)}")
                con.execute(f"CREATE TABLE {_q(t)} AS SELECT * FROM {LAKE}.main.{_q(t)}")
            if todo is None:
                self._copy_views(con)
            statledger.refresh_views(con)  # row_stats/col_stats: the files this one lists
            con.execute("COMMIT")
        except BaseException as err:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:  # nothing begun
                pass
            self._detach(con, attached)
            for f in (dst, dst.with_name(dst.name + ".wal")):
                f.unlink(missing_ok=True)
            if isinstance(err, duckdb.Error):
                raise WarehouseError(f"cannot copy snapshot {n} of the team database "
                                     f"{self.lake.url}: {str(err).strip().splitlines()[0]}"
                                     ) from None
            raise
        self._detach(con, attached)
        return _Snapshot(self.root, dst, state, self.config)

    @staticmethod
    def _detach(con, attached: bool) -> None:
        """The copy detached from the builder (written to its file) and the cursor closed."""
        try:
            if attached:
                con.execute("USE memory")
                con.execute("DETACH DATABASE IF EXISTS snap")
        finally:
            con.close()

    @staticmethod
    def _copy_views(con) -> None:
        """The lake's views, made in the copy (views over views: each once the ones it reads
        exist), but the ledger's, copied as tables."""
        from attnbase.warehouse.catalog.ducklake import LAKE, make_views
        from attnbase.warehouse.catalog.ledger import TABLES as LEDGER_TABLES

        make_views(con, [(name, sql) for name, sql in con.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE database_name = ? "
            "AND schema_name = 'main' AND NOT internal", [LAKE]).fetchall()
            if name not in LEDGER_TABLES])
