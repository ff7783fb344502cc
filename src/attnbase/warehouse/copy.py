"""``attnbase catalog copy``: move a directory database into a team database.

For each run of the source (oldest first): its bytes (the Zarr store and the statistics files
the source's catalog lists, at the same paths relative to the data location) are copied
first, each file written aside and renamed into place, a file already there with the same
size kept; then all of the run's catalog rows (``runs``, ``arrays``, ``batches``,
``stat_files``, its metrics and null tests, ...) are written in one transaction, under the
run's lease in the team database. A run therefore appears whole or not at all, and a copy
stopped anywhere and run again finishes the job: a run already in the target with the same
``created_at`` and status is skipped. Studies and their result tables follow, row by row,
leaving out rows the target already has. The source is only read. API tokens are not copied
(make the team's own with ``attnbase token create``), nor reports (made again by
``attnbase report``). A run on object storage keeps its ``store_url``: only its rows move.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from attnbase.errors import WarehouseError
from attnbase.warehouse.database import Database

#: tables copied run by run (every table with a run_id column but the embedded leases and the
#: ledger's, which go first through the target's ledger), the ``runs`` row last; and the study
#: tables, copied whole less the rows already there
SKIPPED = ("run_leases", "api_tokens", "schema_migrations", "batches", "stat_files")
STUDY_TABLES = ("studies", "study_results", "head_distances", "head_clusters", "entropy_change")


@dataclass
class CopyResult:
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    study_rows: int = 0


def _run_tables(con) -> list[str]:
    rows = con.execute(
        "SELECT DISTINCT c.table_name FROM duckdb_columns() c JOIN duckdb_tables() t ON "
        "t.database_name = c.database_name AND t.schema_name = c.schema_name AND "
        "t.table_name = c.table_name WHERE c.database_name = 'src' AND c.schema_name = 'main' "
        "AND c.column_name = 'run_id' ORDER BY c.table_name").fetchall()
    names = [t for (t,) in rows if t not in SKIPPED and t != "runs"]
    return names + ["runs"]


def _columns(con, db: str, table: str) -> list[str]:
    return [c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = ? AND schema_name = "
        "'main' AND table_name = ? ORDER BY column_index", [db, table]).fetchall()]


def _copy_file(src: Path, dst: Path) -> int:
    """``src`` to ``dst`` (written aside, renamed into place); 0 where ``dst`` has its size."""
    if dst.exists() and dst.stat().st_size == src.stat().st_size:
        return 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.copy")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return src.stat().st_size


def _copy_bytes(src: Database, dst: Database, run_id: str, stat_paths: list[str],
                result: CopyResult) -> None:
    store = src.run_dir(run_id)
    files = [p for p in store.rglob("*") if p.is_file()] if store.is_dir() else []
    files += [src.path / p for p in stat_paths]
    for f in files:
        n = _copy_file(f, dst.path / f.relative_to(src.path))
        result.files += 1
        result.bytes += n


def copy_database(source: Database, target: Database,
                  say: Callable[[str], None] = lambda s: None) -> CopyResult:
    """Copy every run and study of the directory database ``source`` into the team database
    ``target`` (see the module doc)."""
    src, dst = source.require(), target.require()
    if src.url is not None or dst.url is None:
        raise WarehouseError("attnbase catalog copy moves a directory database (--from DIR) "
                             "into a team database (--to postgresql://...)")
    if dst.catalog.default_store() is not None:
        raise WarehouseError(f"the team database {dst.name} keeps its data on object storage; "
                             "attnbase catalog copy moves runs into a team database whose data "
                             "is a directory (attnbase init --data DIR)")
    src.catalog.ensure_migrated()
    from attnbase.warehouse.runs.statschema import SCHEMA_FILE, SCHEMAS

    for table in SCHEMAS:  # the zero-row schema files every view lists
        _copy_file(src.path / table / "run_id=" / SCHEMA_FILE,
                   dst.path / table / "run_id=" / SCHEMA_FILE)
    result = CopyResult()
    with _source_attached(src, dst):
        _copy_all(src, dst, result, say)
    return result


@contextmanager
def _source_attached(src: Database, dst: Database) -> Iterator[None]:
    """The source's catalog file attached read-only, as ``src``, to the target's DuckDB
    instance (every cursor of the instance sees it) while the copy runs."""
    source_file = str(src.catalog_path.resolve()).replace("'", "''")
    with dst.connect(read_only=True, stats=False) as con:
        con.execute("DETACH DATABASE IF EXISTS src")
        con.execute(f"ATTACH '{source_file}' AS src (READ_ONLY)")
    try:
        yield
    finally:
        with dst.connect(read_only=True, stats=False) as con:
            con.execute("DETACH DATABASE IF EXISTS src")


def _copy_all(src: Database, dst: Database, result: CopyResult,
              say: Callable[[str], None]) -> None:
    with src.connect(read_only=True, stats=False) as scon:
        runs = scon.execute("SELECT run_id, created_at, status, store_url FROM runs "
                            "ORDER BY created_at, run_id").fetchall()
    have = {r: (c, s) for r, c, s in _target_runs(dst)}
    for run_id, created_at, status, store_url in runs:
        if have.get(run_id) == (created_at, status):
            result.skipped.append(run_id)
            continue
        if run_id in have and have[run_id][0] != created_at:
            raise WarehouseError(
                f"run {run_id!r} exists in {dst.name} already, made at another time "
                f"({have[run_id][0]} there, {created_at} here); delete one of them first")
        holder = src.catalog.lease_holder(run_id)
        if holder is not None:
            raise WarehouseError(f"run {run_id!r} is being written in {src.name}; copy once "
                                 "it has finished")
        with dst.catalog.acquire_lease(run_id, "copy"):
            with src.connect(read_only=True, stats=False) as scon:
                paths = [p for (p,) in scon.execute(
                    "SELECT path FROM stat_files WHERE run_id = ? ORDER BY path",
                    [run_id]).fetchall()]
            if store_url is None:
                _copy_bytes(src, dst, run_id, paths, result)
            _copy_rows(dst, run_id)
        dst.forget_location(run_id)
        result.copied.append(run_id)
        say(f"run {run_id}: copied ({status})")
    result.study_rows = _copy_studies(dst)


def _target_runs(dst: Database) -> list[tuple]:
    with dst.connect(read_only=True, stats=False) as con:
        return con.execute("SELECT run_id, created_at, status FROM runs").fetchall()


def _copy_rows(dst: Database, run_id: str) -> None:
    """The run's ledger rows (in the team database's own ledger transaction), then its other
    rows, ``runs`` last, in one catalog transaction."""
    from itertools import groupby

    from attnbase.warehouse.catalog.statledger import FileRecord

    with dst.connect(read_only=True, stats=False) as con:
        batches = con.execute("SELECT batch, first_seq, n_seqs, status, written_at FROM "
                              "src.main.batches WHERE run_id = ? ORDER BY batch",
                              [run_id]).fetchall()
        files = con.execute("SELECT written_at, table_name, path, crc32c, size, batch FROM "
                            "src.main.stat_files WHERE run_id = ? ORDER BY written_at, path",
                            [run_id]).fetchall()
    with dst.ledger() as led:
        led.forget(run_id)
        led.add_batches(run_id, batches)
        for at, group in groupby(files, key=lambda f: f[0]):
            led.record(run_id, [FileRecord(t, p, c, n, b) for _, t, p, c, n, b in group],
                       written_at=at)
    with dst.transaction(stats=False) as con:
        for table in _run_tables(con):
            cols = [c for c in _columns(con, "src", table)
                    if c in set(_columns(con, "lake", table))]
            listed = ", ".join(f'"{c}"' for c in cols)
            con.execute(f'DELETE FROM lake.main."{table}" WHERE run_id = ?', [run_id])
            con.execute(f'INSERT INTO lake.main."{table}" ({listed}) SELECT {listed} FROM '
                        f'src.main."{table}" WHERE run_id = ?', [run_id])


def _copy_studies(dst: Database) -> int:
    n = 0
    with dst.transaction(stats=False) as con:
        for table in STUDY_TABLES:
            cols = [c for c in _columns(con, "src", table) if c in set(_columns(con, "lake", table))]
            if not cols:
                continue
            listed = ", ".join(f'"{c}"' for c in cols)
            before = con.execute(f'SELECT count(*) FROM lake.main."{table}"').fetchone()[0]
            con.execute(f'INSERT INTO lake.main."{table}" ({listed}) SELECT {listed} FROM '
                        f'src.main."{table}" EXCEPT SELECT {listed} FROM lake.main."{table}"')
            n += con.execute(f'SELECT count(*) FROM lake.main."{table}"').fetchone()[0] - before
    return n
