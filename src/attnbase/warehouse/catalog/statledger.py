"""The catalog's list of statistics files (``stat_files``), and the views that read exactly it.

Every ``row_stats`` / ``col_stats`` file a reader may see has one row::

    stat_files(run_id, table_name, batch, path, crc32c, size, written_at)

``path`` is relative to the run's statistics root (DIR for a local run, the run's own prefix on
object storage, :class:`~attnbase.warehouse.runs.handle.RunHandle`), ``batch`` the ledger batch the
file holds (NULL for a file of several: a merge's ``merged-<crc>.parquet``, a migration's
``unbatched.parquet``). A row is written in the same transaction that marks its batch complete
(:meth:`attnbase.warehouse.database.Database.ledger`), and removed in the one that sends the
batch back to pending. The checksum is CRC-32C of the file's bytes, as zarr's chunks carry.

The catalog's views ``row_stats`` / ``col_stats`` read the listed files of local runs, by
relative path, and nothing else (:func:`refresh_views`, in every such transaction); the TEMP
views of a connection add the listed files of runs on object storage. A file a writer wrote
before its ledger mark, a ``.partial`` file or a stray copy is therefore never read; the next
writer of the run removes them (:func:`remove_unlisted`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Sequence

TABLE = "stat_files"
DDL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    run_id VARCHAR NOT NULL,
    table_name VARCHAR NOT NULL,
    batch INTEGER,
    path VARCHAR NOT NULL,
    crc32c UBIGINT NOT NULL,
    size BIGINT NOT NULL,
    written_at TIMESTAMP
)
"""


@dataclass(frozen=True)
class FileRecord:
    """One statistics file as the catalog lists it (``path`` relative to the stats root)."""

    table: str
    path: str
    crc32c: int
    size: int
    batch: int | None


def record(con, run_id: str, records: Iterable[FileRecord], *,
           written_at: datetime | None = None) -> None:
    """On an open ledger transaction of the embedded catalog: list ``records`` (replacing rows
    of the same paths); ``written_at``: the rows' time (now)."""
    records = list(records)
    if not records:
        return
    now = written_at or datetime.now(timezone.utc).replace(tzinfo=None)
    con.execute(f"DELETE FROM {TABLE} WHERE run_id = ? AND list_contains(?, path)",
                [run_id, [r.path for r in records]])
    con.executemany(f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [[run_id, r.table, r.batch, r.path, int(r.crc32c), int(r.size), now]
                     for r in records])


def forget(con, run_id: str, *, batches: Sequence[int] | None = None,
           paths: Sequence[str] | None = None) -> None:
    """On an open ledger transaction: unlist the files of ``batches`` and/or ``paths``
    (neither: every file of the run)."""
    if batches is None and paths is None:
        con.execute(f"DELETE FROM {TABLE} WHERE run_id = ?", [run_id])
        return
    if batches:
        con.execute(f"DELETE FROM {TABLE} WHERE run_id = ? AND list_contains(?, batch)",
                    [run_id, [int(b) for b in batches]])
    if paths:
        con.execute(f"DELETE FROM {TABLE} WHERE run_id = ? AND list_contains(?, path)",
                    [run_id, list(paths)])


def listed(con, run_id: str, table: str | None = None) -> list[FileRecord]:
    """The files listed for ``run_id`` (and ``table``), by table and path."""
    rows = con.execute(
        f"SELECT table_name, path, crc32c, size, batch FROM {TABLE} WHERE run_id = ? "
        "AND (? IS NULL OR table_name = ?) ORDER BY table_name, path",
        [run_id, table, table]).fetchall()
    return [FileRecord(t, p, int(c), int(s), None if b is None else int(b))
            for t, p, c, s, b in rows]


def refresh_views(con) -> None:
    """On an open writing connection: make the catalog's views read the listed files of every
    local run (and the zero-row schema files, so that a list is never empty). A listed file
    that is gone stays out of the list (DuckDB would refuse the view, and with it every
    writer's transaction); the view then fails any question about its run with one line
    naming the file and the fix."""
    from attnbase.warehouse.runs.statschema import SCHEMA_FILE, SCHEMAS, catalog_dir, view_sql

    rows = con.execute(
        f"SELECT s.run_id, s.table_name, s.path FROM {TABLE} s JOIN runs r USING (run_id) "
        "WHERE r.store_url IS NULL ORDER BY s.run_id, s.path").fetchall()
    root = catalog_dir(con)
    present: dict[str, set[str]] = {}  # directory -> its file names, one listing each
    for _, _, p in rows:
        d = os.path.dirname(p)
        if d not in present:
            present[d] = set(os.listdir(root / d)) if (root / d).is_dir() else set()
    for table in SCHEMAS:
        sources, missing = [f"{table}/run_id=/{SCHEMA_FILE}"], {}
        for run_id, t, p in rows:
            if t != table:
                continue
            if os.path.basename(p) in present[os.path.dirname(p)]:
                sources.append(p)
            elif run_id not in missing:
                missing[run_id] = str(damaged_file_error(
                    FileNotFoundError("the file is missing"), p))
        con.execute(view_sql(table, sources, missing=missing))


def remote_sources(con) -> list[tuple[str, str, str, str]]:
    """``(run_id, store_url, table, path)`` of the listed files of runs on object storage."""
    return con.execute(
        f"SELECT s.run_id, r.store_url, s.table_name, s.path FROM {TABLE} s JOIN runs r "
        "USING (run_id) WHERE r.store_url IS NOT NULL ORDER BY s.run_id, s.path").fetchall()


def remove_unlisted(run, keep: Iterable[str]) -> list[str]:
    """Delete the files in ``run``'s statistics directories that the catalog does not list
    (``keep``: the listed relative paths): a pending batch's file, a ``.partial`` file, a
    stray copy. The zero-row schema files stay. Returns the relative paths removed."""
    from attnbase.warehouse.runs.statschema import SCHEMA_FILE, SCHEMAS

    keep = set(keep)
    gone = []
    for table in SCHEMAS:
        d = run.table_dir(table)
        for name in run.sizes(d):
            rel = run.relpath(d / name)
            if name == SCHEMA_FILE or rel in keep:
                continue
            run.delete(d / name)
            gone.append(rel)
    return gone


def backfill(con) -> None:
    """Migration 20: list the files of every complete batch (and every merged or unbatched
    file) that exist now, with their checksums; the views then read those. A pending batch's
    file stays unlisted (its resume rewrites it)."""
    from attnbase.warehouse.runs.handle import run_handle
    from attnbase.warehouse.runs.statschema import SCHEMA_FILE, SCHEMAS, catalog_dir

    con.execute(DDL)
    root = catalog_dir(con)
    cols = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'").fetchall()}
    url_col = "store_url" if "store_url" in cols else "NULL"
    runs = con.execute(f"SELECT run_id, {url_col} FROM runs ORDER BY run_id").fetchall()
    for run_id, url in runs:
        if con.execute(f"SELECT count(*) FROM {TABLE} WHERE run_id = ?", [run_id]).fetchone()[0]:
            continue
        run = run_handle(root, run_id, url)
        complete = {int(b) for (b,) in con.execute(
            "SELECT batch FROM batches WHERE run_id = ? AND status = 'complete'",
            [run_id]).fetchall()}
        records = []
        for table in SCHEMAS:
            d = run.table_dir(table)
            for name in sorted(run.sizes(d)):
                if not name.endswith(".parquet") or name == SCHEMA_FILE or "/" in name:
                    continue
                stem = name[:-len(".parquet")]
                batch = int(stem[1:]) if stem[:1] == "b" and stem[1:].isdigit() else None
                if batch is not None and batch not in complete:
                    continue  # a pending batch's file: never read, rewritten on resume
                crc, size = run.checksum(d / name)
                records.append(FileRecord(table, run.relpath(d / name), crc, size, batch))
        record(con, run_id, records)
    refresh_views(con)


_STAT_PATH = re.compile(r"((?:[^\s'\"]*/)?(row_stats|col_stats)/run_id=([^/'\"\s]+)/[^/'\"\s]+"
                        r"\.parquet)")


_DAMAGED = "; it is damaged: "


def damaged_file_error(err: BaseException, path=None):
    """A reader's failure on a statistics file (DuckDB's or pyarrow's) as one line naming the
    file, its run and the fix (:class:`~attnbase.errors.WarehouseError`); None when ``err``
    names no statistics file and ``path`` is not given."""
    from attnbase.errors import StatsFileCorruptError

    text = str(err).strip()
    if _DAMAGED in text:  # the message of a view's missing file (refresh_views), raised as is
        return StatsFileCorruptError(text[text.index("run '"):].splitlines()[0])
    m = _STAT_PATH.search(text if path is None else str(path))
    if m is None:
        return None
    where, table, run_id = m.groups()
    detail = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(err).__name__)
    detail = detail.replace(where, "").replace("''", "").strip(" :;")[:160]
    return StatsFileCorruptError(
        f"run {run_id!r}: {table} file {where} cannot be read ({detail}){_DAMAGED}"
        f"`attnbase verify --run {run_id}` names it, `attnbase extract ... --run {run_id} "
        "--repair` rewrites it")
