"""A team database's ledger: ``batches`` and ``stat_files`` as plain PostgreSQL tables beside
the DuckLake catalog, in the schema :data:`SCHEMA` of the same database.

Every DuckLake commit takes a turn (DuckLake numbers its snapshots one after another, and our
write lock orders writers: benchmarks/RESULTS.md, "A team database"). A batch mark is
instead one short PostgreSQL transaction of row locks (:class:`PgLedger`), so writers
of different runs never wait for each other.

Readers see the two tables by their usual names: the lake holds the views ``batches`` and
``stat_files`` over them, which every DuckDB instance of the database reads through the
postgres extension, attached as :data:`LEDGER_DB` and confined to :data:`SCHEMA`
(:meth:`DuckLakeBackend._attach <attnbase.warehouse.catalog.ducklake.DuckLakeBackend._attach>`;
read-only where the lake is). Each ledger transaction, as its last statement, adds one to the
one-row counter ``version``: its row lock orders the commits' ends, so the number only grows in
commit order, and the service's state of the catalog includes it
(:mod:`attnbase.serve.lake_catalog`): a mark alone makes a new snapshot.

A team database made before the ledger moved (its lake holding the two tables) is moved in
once, by :func:`ensure` (from ``ensure_migrated``): the rows are copied into PostgreSQL in one
transaction, then the lake's tables are replaced by the views in one DuckLake transaction;
``attnbase_team`` then records ``ledger = postgres``. A move stopped anywhere is done again
from the start by the next process.
"""

from __future__ import annotations

from datetime import datetime, timezone

from contextlib import contextmanager

from attnbase.warehouse.catalog.ledger import TABLES, Ledger, full_rows
from attnbase.warehouse.catalog.statledger import FileRecord

#: the PostgreSQL schema of the ledger's tables
SCHEMA = "attnbase_ledger"
#: the name the postgres extension attaches it under in every DuckDB instance of the database
LEDGER_DB = "attnbase_ledger"
#: ``attnbase_team``'s key and value once the ledger lives here
SETTING = ("ledger", "postgres")

DDL = (
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.batches (
        run_id text NOT NULL,
        batch integer NOT NULL,
        first_seq integer NOT NULL,
        n_seqs integer NOT NULL,
        status text NOT NULL CHECK (status IN ('pending', 'complete')),
        written_at timestamp,
        PRIMARY KEY (run_id, batch))""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.stat_files (
        run_id text NOT NULL,
        table_name text NOT NULL,
        batch integer,
        path text NOT NULL,
        crc32c bigint NOT NULL,
        size bigint NOT NULL,
        written_at timestamp,
        PRIMARY KEY (run_id, path))""",
    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.version (one boolean PRIMARY KEY DEFAULT true "
    "CHECK (one), n bigint NOT NULL)",
    f"INSERT INTO {SCHEMA}.version VALUES (true, 0) ON CONFLICT DO NOTHING",
)
#: the lake's views of the ledger, in the columns and types of the embedded catalog's tables
VIEWS = (
    ("batches", f"CREATE VIEW batches AS SELECT run_id, batch, first_seq, n_seqs, status, "
                f"written_at FROM {LEDGER_DB}.{SCHEMA}.batches"),
    ("stat_files", f"CREATE VIEW stat_files AS SELECT run_id, table_name, batch, path, "
                   f"crc32c::UBIGINT AS crc32c, size, written_at FROM {LEDGER_DB}.{SCHEMA}.stat_files"),
)
#: the last statement of every ledger transaction: the row lock is held only until its commit
MARK_SQL = f"UPDATE {SCHEMA}.version SET n = n + 1"
#: the ledger's part of the service's state
STATE_SQL = f"SELECT n FROM {SCHEMA}.version"

_C = 'COLLATE "C"'  # the byte order DuckDB sorts in


class PgLedger(Ledger):
    """One ledger transaction on a psycopg cursor (the caller begins and commits it)."""

    def __init__(self, cur) -> None:
        self.cur = cur

    def listed(self, run_id, table=None):
        self.cur.execute(
            f"SELECT table_name, path, crc32c, size, batch FROM {SCHEMA}.stat_files "
            "WHERE run_id = %s AND (%s::text IS NULL OR table_name = %s) "
            f"ORDER BY table_name {_C}, path {_C}", [run_id, table, table])
        return [FileRecord(t, p, int(c), int(s), None if b is None else int(b))
                for t, p, c, s, b in self.cur.fetchall()]

    def record(self, run_id, records, *, written_at=None):
        records = list(records)
        if not records:
            return
        now = written_at or datetime.now(timezone.utc).replace(tzinfo=None)
        # the primary key replaces a listed path in the same statement
        self.cur.executemany(
            f"INSERT INTO {SCHEMA}.stat_files VALUES (%s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (run_id, path) DO UPDATE SET table_name = EXCLUDED.table_name, "
            "batch = EXCLUDED.batch, crc32c = EXCLUDED.crc32c, size = EXCLUDED.size, "
            "written_at = EXCLUDED.written_at",
            [(run_id, r.table, r.batch, r.path, int(r.crc32c), int(r.size), now)
             for r in records])

    def forget(self, run_id, *, batches=None, paths=None):
        if batches is None and paths is None:
            self.cur.execute(f"DELETE FROM {SCHEMA}.stat_files WHERE run_id = %s", [run_id])
            return
        if batches:
            self.cur.execute(f"DELETE FROM {SCHEMA}.stat_files WHERE run_id = %s "
                             "AND batch = ANY(%s)", [run_id, [int(b) for b in batches]])
        if paths:
            self.cur.execute(f"DELETE FROM {SCHEMA}.stat_files WHERE run_id = %s "
                             "AND path = ANY(%s)", [run_id, list(paths)])

    def add_batches(self, run_id, rows):
        self.cur.execute(f"DELETE FROM {SCHEMA}.batches WHERE run_id = %s", [run_id])
        self.cur.executemany(f"INSERT INTO {SCHEMA}.batches VALUES (%s, %s, %s, %s, %s, %s)",
                             [(run_id, *r) for r in full_rows(rows)])

    def set_status(self, run_id, batches, status, written_at=None):
        self.cur.execute(
            f"UPDATE {SCHEMA}.batches SET status = %s, written_at = %s "
            "WHERE run_id = %s AND batch = ANY(%s)",
            [status, written_at if status == "complete" else None, run_id,
             [int(b) for b in batches]])

    def complete(self, run_id):
        self.cur.execute(f"SELECT batch FROM {SCHEMA}.batches WHERE run_id = %s "
                         "AND status = 'complete'", [run_id])
        return {int(b) for (b,) in self.cur.fetchall()}

    def delete_run(self, run_id):
        for table in TABLES:
            self.cur.execute(f"DELETE FROM {SCHEMA}.{table} WHERE run_id = %s", [run_id])


def _lake_kinds(con, lake: str) -> dict[str, str]:
    """``{name: 'table' | 'view'}`` of the lake's relations named as the ledger's tables."""
    out = {}
    for kind, fn, col in (("table", "duckdb_tables()", "table_name"),
                          ("view", "duckdb_views()", "view_name")):
        for (name,) in con.execute(
                f"SELECT {col} FROM {fn} WHERE database_name = ? AND schema_name = 'main' "
                f"AND list_contains(?, {col})", [lake, list(TABLES)]).fetchall():
            out[name] = kind
    return out


@contextmanager
def _transaction(con):
    """One DuckDB transaction on the cursor ``con``: committed after the block, rolled back if
    it raises."""
    import duckdb

    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:  # a failed statement ended it already
            pass
        raise
    con.execute("COMMIT")


def ensure(backend) -> bool:
    """Move the ledger of the team database ``backend`` into PostgreSQL where it is still in
    the lake (see the module doc); whether anything was done. Makers and movers take turns on
    one advisory lock, and the move holds the write lock (older writers take it too)."""
    lake = backend.LAKE
    key, value = SETTING
    if backend.settings().get(key) == value:
        return False
    with backend.pg() as pg:
        pg.execute("SELECT pg_advisory_lock(hashtext('attnbase:init'))")
        try:
            if backend.settings(fresh=True).get(key) == value:
                return False
            for ddl in DDL:
                pg.execute(ddl)
            con = backend._cursor()
            try:
                con.execute("CALL pg_clear_cache()")  # the schema made after the attach
                with backend.write_lock():
                    kinds = _lake_kinds(con, lake)
                    if "table" in kinds.values():
                        with _transaction(con):  # the rows, into PostgreSQL
                            for name in TABLES:
                                con.execute(f"DELETE FROM {LEDGER_DB}.{SCHEMA}.{name}")
                                if kinds.get(name) == "table":
                                    con.execute(f"INSERT INTO {LEDGER_DB}.{SCHEMA}.{name} "
                                                f"SELECT * FROM {lake}.main.{name}")
                    with _transaction(con):  # the lake's tables replaced by the views
                        for name, sql in VIEWS:
                            if kinds.get(name) == "table":
                                con.execute(f"DROP TABLE {lake}.main.{name}")
                            if kinds.get(name) != "view":
                                con.execute(sql)
            finally:
                con.close()
            backend.put_setting(pg, key, value)
        finally:
            pg.execute("SELECT pg_advisory_unlock(hashtext('attnbase:init'))")
    backend.settings(fresh=True)
    return True
