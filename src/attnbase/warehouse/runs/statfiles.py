"""``row_stats`` / ``col_stats`` as Parquet files, one per batch, read by DuckDB as views.

Layout (relative to the database directory ``DIR``; Hive-style so that a ``run_id = ?`` filter
prunes whole directories before any file is opened)::

    DIR/row_stats/run_id=<run_id>/b<batch:06d>.parquet
    DIR/col_stats/run_id=<run_id>/b<batch:06d>.parquet
    DIR/row_stats/run_id=/_schema.parquet     zero rows: the glob never matches nothing

Why files and not catalog tables: a batch's statistics are ~10^5 rows; inserting them costs a
catalog transaction per batch (and a checkpoint when the connection closes), and while it runs
readers such as ``attnbase sql`` must wait for the file lock. A file per batch is written beside
the catalog (temp file + fsync + rename, so a reader sees the whole file or none), the ledger
transaction that follows is a one-row update, and readers never wait for the writer.

The catalog keeps the names: ``row_stats`` and ``col_stats`` are views over
``read_parquet('row_stats/run_id=*/*.parquet', hive_partitioning = true)`` with *relative*
paths, so a database directory can be moved as a whole. DuckDB resolves relative paths against
``file_search_path`` (else the working directory); attnbase sets it to ``DIR`` on every connection
it opens, and any other DuckDB client does the same with ``SET file_search_path = 'DIR'`` (or is
started in ``DIR``).

A run on object storage (``runs.store_url``, :mod:`attnbase.warehouse.runs.location`) keeps its
files under its own prefix, ``s3://bucket/prefix/<run_id>/row_stats/run_id=<run_id>/`` (one
PUT each, and a zero-row ``_schema.parquet``); :func:`attach_remote_views` shadows the two
views on each connection by TEMP views that read those too, through a registered s3fs file
system with uncached listings.

A batch file is written before its ledger row is marked complete, so a crash between the two
leaves a file for a batch the ledger calls pending; the resume rewrites that same file (same
name, same deterministic content), so the views never hold duplicate rows.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from attnbase.errors import WarehouseError
from attnbase.warehouse.runs.decoded import Decoded, file_key
from attnbase.warehouse.runs.handle import RunHandle, crc32c, run_handle
from attnbase.warehouse.runs.statschema import (COMPRESSION, SCHEMA_FILE, SCHEMAS, catalog_dir, duck_type,
                                           sql_str, view_sql)


def read_batch_table(run: RunHandle, paths: Sequence[str], columns: Sequence[str],
                     where: dict[str, int], decoded: Decoded | None = None) -> pa.Table | None:
    """The rows whose columns equal ``where`` of the first of ``paths`` (relative to the run's
    statistics root: the files the catalog lists for a batch, then for the run's merged file)
    that is there: only the row groups whose min/max statistics admit ``where`` are read
    (pyarrow), then filtered. None where no such file is there or the run is on object storage
    (then ask the view). ``decoded``: the row groups read are kept there, decoded, by the
    file's identity (the service's). Faster than ``pq.read_table(filters=...)`` or the view
    (benchmarks/RESULTS.md: "row statistics of one sequence")."""
    if run.remote:
        return None
    for rel in paths:
        path = run.at(rel)
        key = file_key(path)
        if key is None:
            continue
        try:
            return _read_rows(path, key, columns, where, decoded)
        except (OSError, pa.ArrowException) as err:  # a damaged file: one line naming it
            from attnbase.warehouse.catalog.statledger import damaged_file_error

            raise damaged_file_error(err, rel) from None
    return None


def _read_rows(path, key, columns, where, decoded) -> pa.Table:
    """The rows of one local statistics file whose columns equal ``where`` (see
    :func:`read_batch_table`)."""
    import pyarrow.compute as pc

    md = _footer(path, key)
    index = {md.schema.column(i).name: i for i in range(md.num_columns)}
    groups = [g for g in range(md.num_row_groups)
              if all(_admits(md.row_group(g).column(index[k]).statistics, v)
                     for k, v in where.items())]
    names = list(dict.fromkeys([*columns, *where]))
    held = (key, tuple(groups), tuple(names))
    tbl = decoded.get(held) if decoded is not None else None
    if tbl is None:
        tbl = pq.ParquetFile(path, metadata=md).read_row_groups(groups, columns=names)
        if decoded is not None:
            decoded.put(held, tbl, tbl.nbytes)
    mask = None
    for k, v in where.items():
        m = pc.equal(tbl[k], v)
        mask = m if mask is None else pc.and_(mask, m)
    if mask is not None:
        tbl = tbl.filter(mask)
    return tbl.select(list(columns))


#: Parsed footers of the files :func:`read_batch_table` read, by :func:`file_key`: a file is
#: only ever replaced whole (rename), so a changed file has another key
_FOOTERS: dict[tuple, Any] = {}
_FOOTERS_LOCK = threading.Lock()
FOOTERS_KEPT = 64


def _footer(path: Path, key: tuple):
    """The parsed footer of ``path``, whose :func:`file_key` is ``key``."""
    md = _FOOTERS.get(key)
    if md is None:
        md = pq.read_metadata(path)
        with _FOOTERS_LOCK:
            while len(_FOOTERS) >= FOOTERS_KEPT:
                _FOOTERS.pop(next(iter(_FOOTERS)))
            _FOOTERS[key] = md
    return md


def _admits(stats, value) -> bool:
    """Whether a column chunk's statistics allow ``value`` (no statistics: it may)."""
    if stats is None or not stats.has_min_max:
        return True
    return stats.min <= value <= stats.max


def ensure_schema_files(root: Path) -> None:
    """The zero-row files that keep each view's glob non-empty (a fresh database has no runs)."""
    shared = run_handle(root, "", None)  # run_id "": the directories ``run_id=``
    for table, schema in SCHEMAS.items():
        path = shared.table_dir(table) / SCHEMA_FILE
        if not path.exists():
            _write_atomic(shared, schema.empty_table(), path, fsync=False)


def as_table(table: str, columns: Any) -> pa.Table:
    """A mapping of 1-D arrays (a CapturedBatch's ``row_stats``/``col_stats``) as the stored table.

    Columns are cast to the stored types (exactly: integers fit, float64 stays float64) and any
    missing or unexpected column is an error naming it.
    """
    schema = SCHEMAS[table]
    have = set(columns)
    missing = [n for n in schema.names if n not in have]
    extra = sorted(have - set(schema.names) - {"run_id"})
    if missing or extra:
        raise WarehouseError(f"{table} of a captured batch: missing columns {missing}, "
                             f"unexpected {extra}; expected {list(schema.names)}")
    arrays = []
    for f in schema:
        v = np.asarray(columns[f.name])
        arrays.append(pa.array(v.astype(f.type.to_pandas_dtype(), copy=False)))
    return pa.Table.from_arrays(arrays, schema=schema)


def write_batch_stats(run: RunHandle, batch: int, row_stats: Any, col_stats: Any,
                      *, fsync: bool = True, rows_per_group: int | None = None) -> list:
    """Write the two Parquet files of one batch, each whole (not yet listed: the ledger mark
    lists them, :mod:`attnbase.warehouse.catalog.statledger`); returns their
    :class:`~attnbase.warehouse.catalog.statledger.FileRecord` (path, crc32c, size).

    ``rows_per_group`` (e.g. the rows of one layer) makes row groups that a ``layer = ?``
    filter can skip by their min/max statistics.
    """
    from attnbase.warehouse.catalog.statledger import FileRecord

    out = []
    for table, cols in (("row_stats", row_stats), ("col_stats", col_stats)):
        path = run.batch_file(table, batch)
        data = parquet_bytes(as_table(table, cols), rows_per_group)
        run.put(path, data, fsync=fsync)
        out.append(FileRecord(table, run.relpath(path), crc32c(data), data.size, int(batch)))
    return out


def ensure_run_schema_files(run: RunHandle) -> None:
    """A run on object storage: one zero-row file per table, so that the run's glob in the
    views always matches."""
    for table, schema in SCHEMAS.items():
        _write_atomic(run, schema.empty_table(), run.table_dir(table) / SCHEMA_FILE, fsync=False)


def parquet_bytes(tbl: pa.Table, rows_per_group: int | None = None):
    """``tbl`` as the bytes of a statistics file (a pyarrow Buffer)."""
    sink = pa.BufferOutputStream()
    # no dictionary pages: float columns of unique values gain nothing from them, and the
    # files are written faster and smaller without (benchmarks/RESULTS.md: "statistics files
    # without dictionary pages")
    pq.write_table(tbl, sink, compression=COMPRESSION, use_dictionary=False,
                   row_group_size=rows_per_group or max(tbl.num_rows, 1))
    return sink.getvalue()


def _write_atomic(run: RunHandle, tbl: pa.Table, path: Path, *, fsync: bool,
                  rows_per_group: int | None = None) -> None:
    run.put(path, parquet_bytes(tbl, rows_per_group), fsync=fsync)


def fsync_file(path: Path) -> None:
    """Flush one written file to disk (before the rename that publishes it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def migrate_tables_to_files(con) -> None:
    """Catalog migration: move ``row_stats``/``col_stats`` table rows into per-run Parquet files
    and replace the tables by views of the same names and columns."""
    root = catalog_dir(con)
    ensure_schema_files(root)
    con.execute(f"SET file_search_path = '{sql_str(str(root))}'")
    for table, schema in SCHEMAS.items():
        kind = con.execute("SELECT table_type FROM information_schema.tables WHERE table_name = ? "
                           "AND table_schema = 'main'", [table]).fetchone()
        if kind is not None and kind[0] == "BASE TABLE":
            cols = ", ".join(f"CAST({f.name} AS {duck_type(f.type)}) AS {f.name}" for f in schema)
            # one file per ledger batch, named as the writer names them, so that a resumed run
            # rewrites (never duplicates) the rows of a batch
            ledger = con.execute(
                f"SELECT DISTINCT t.run_id, b.batch, b.first_seq, b.n_seqs FROM {table} t "
                "JOIN batches b ON b.run_id = t.run_id AND t.seq >= b.first_seq "
                "AND t.seq < b.first_seq + b.n_seqs").fetchall()
            for run_id, batch, lo, n in ledger:
                dest = run_handle(root, run_id, None).batch_file(table, int(batch))
                dest.parent.mkdir(parents=True, exist_ok=True)
                con.execute(f"COPY (SELECT {cols} FROM {table} WHERE run_id = '{sql_str(run_id)}' "
                            f"AND seq >= {int(lo)} AND seq < {int(lo) + int(n)} "
                            f"ORDER BY layer, head, seq) TO '{sql_str(str(dest))}' "
                            f"(FORMAT parquet, COMPRESSION {COMPRESSION})")
            # rows no ledger batch covers (catalogs built by hand): kept, in one file per run
            loose = (f"FROM {table} t WHERE NOT EXISTS (SELECT 1 FROM batches b WHERE "
                     "b.run_id = t.run_id AND t.seq >= b.first_seq AND t.seq < b.first_seq + b.n_seqs)")
            for (run_id,) in con.execute(f"SELECT DISTINCT run_id {loose}").fetchall():
                dest = run_handle(root, run_id, None).table_dir(table) / "unbatched.parquet"
                dest.parent.mkdir(parents=True, exist_ok=True)
                con.execute(f"COPY (SELECT {cols} {loose} AND t.run_id = '{sql_str(run_id)}' "
                            f"ORDER BY layer, head, seq) TO '{sql_str(str(dest))}' "
                            f"(FORMAT parquet, COMPRESSION {COMPRESSION})")
            con.execute(f"DROP TABLE {table}")
        con.execute(view_sql(table))


class RemoteViews:
    """The TEMP views :func:`attach_remote_views` made on a connection, to make again on each
    cursor of it (DuckDB's TEMP objects belong to one connection; a cursor is another):
    ``dirs`` are the remote directories they read (for a sandbox's allow-list)."""

    def __init__(self, statements: Sequence[str] = (), dirs: Sequence[str] = (),
                 rows=()) -> None:
        self.statements, self.dirs, self._rows = list(statements), list(dirs), list(rows)

    def __bool__(self) -> bool:
        return bool(self.statements)

    def apply(self, con) -> None:
        """Create the views on ``con`` (binding lists the remote files); the object store
        failing is one line (:class:`WarehouseError`), the connection closed."""
        import duckdb

        try:
            for sql in self.statements:
                con.execute(sql)
        except duckdb.Error as err:
            con.close()
            raise _remote_stats_error(err, self._rows) from None


def attach_remote_views(con, always: bool = False) -> RemoteViews:
    """:func:`stat_views` of an open catalog connection, made on it (see there)."""
    views = stat_views(con, always=always)
    if views._rows:  # runs on object storage
        con.execute("SET autoinstall_known_extensions = false")  # never fetch httpfs
        # the instance may be shared with connections opened under another AWS_* environment:
        # register this one's file system (the endpoint the environment names now)
        run_handle("", *views._rows[0]).register_filesystem(con)
    if views:
        views.apply(con)
    return views


class StatListing:
    """The statistics files an open catalog connection lists (:func:`list_stat_files`): the
    catalog's part of :func:`stat_views`, which a caller whose catalog cannot change (a
    snapshot of it) keeps and hands back on every later call."""

    def __init__(self, rows=(), remote=(), local=(), base: Path | None = None) -> None:
        self.rows, self.remote, self.local = list(rows), list(remote), list(local)
        self.base = base
        #: the directories of the listed local files, relative to ``base``
        self.dirs = sorted({os.path.dirname(p) for _, _, p in self.local})

    def signature(self, now: float | None = None):
        """The modification times of the listed local files' directories (a file deleted
        from one changes its time), or None where one changed within :data:`RACY_S` of now
        (a time the file system may give a later change too: list it afresh)."""
        if self.base is None:
            return ()
        now = time.time() if now is None else now
        out = []
        for d in self.dirs:
            try:
                st = os.stat(self.base / d)
            except OSError:
                out.append((d, None))
                continue
            if now - st.st_mtime < RACY_S:
                return None
            out.append((d, st.st_mtime_ns))
        return tuple(out)


#: seconds within which a directory's modification time is too recent to prove it unchanged
#: (file times come from the kernel's coarse clock: two changes a few ms apart share one)
RACY_S = 2.0


def list_stat_files(con) -> StatListing | None:
    """The catalog's list of statistics files on ``con`` (two or three catalog queries), or
    None for a catalog some migration has not reached (opened read-only)."""
    import duckdb

    from attnbase.warehouse.catalog import statledger

    try:
        rows = con.execute("SELECT run_id, store_url FROM runs WHERE store_url IS NOT NULL "
                           "ORDER BY run_id").fetchall()
        remote = statledger.remote_sources(con) if rows else []
        local = con.execute(
            f"SELECT s.run_id, s.table_name, s.path FROM {statledger.TABLE} s JOIN runs r "
            "USING (run_id) WHERE r.store_url IS NULL ORDER BY s.run_id, s.path").fetchall()
        # (fetchall: a result left unfinished blocks the connection's next statement)
        base = Path(con.execute("SELECT current_setting('file_search_path')").fetchall()[0][0]
                    or catalog_dir(con))
    except duckdb.Error:
        return None
    return StatListing(rows, remote, local, base)


def stat_views(con, always: bool = False, damaged: dict[str, str] | None = None,
               listing: StatListing | None = None) -> RemoteViews:
    """The TEMP views ``row_stats``/``col_stats`` an open catalog connection needs in place of
    the catalog's own (which list the files of local runs as they were at the last ledger
    transaction), or none (false) where those are right:

    - runs whose statistics files live on object storage (``runs.store_url``): the views read
      their listed files too (the object store's file system is registered on ``con``);
    - a listed file of a local run that is gone now (deleted since the catalog's views were
      made): the views leave it out and fail, in one line naming the file and the fix, any
      question that does not rule its run out by ``run_id`` (DuckDB refuses a whole file list
      with one file missing, so without this a question about another run failed naming it).

    ``damaged``: relative path -> one-line message, for listed files of local runs a caller
    found damaged (the service's checksum check, :mod:`attnbase.serve.filecheck`): left out
    and failing their run's questions as a missing file does.

    ``always``: the views even where the catalog's own would do (a team database's catalog
    keeps none that list files: :mod:`attnbase.warehouse.catalog.ducklake`).

    ``listing``: the catalog's list (:func:`list_stat_files`) where the caller keeps it;
    else it is read from ``con``. Makes nothing on ``con`` (:func:`attach_remote_views`
    does). Costs a directory listing per listed run and table, and the listing's queries."""
    from attnbase.warehouse.catalog import statledger

    listing = listing if listing is not None else list_stat_files(con)
    if listing is None:
        return RemoteViews()
    rows, remote, local, base = listing.rows, listing.remote, listing.local, listing.base
    present: dict[str, set[str]] = {}  # directory -> its file names, one listing each
    missing: dict[str, dict[str, str]] = {t: {} for t in SCHEMAS}  # table -> run -> message
    for run_id, table, p in local:
        d = os.path.dirname(p)
        if d not in present:
            present[d] = set(os.listdir(base / d)) if (base / d).is_dir() else set()
        if damaged and p in damaged and run_id not in missing[table]:
            missing[table][run_id] = damaged[p]
        elif os.path.basename(p) not in present[d] and run_id not in missing[table]:
            missing[table][run_id] = str(statledger.damaged_file_error(
                FileNotFoundError("the file is missing"), p))
    if not rows and not any(missing.values()) and not always:
        return RemoteViews()
    runs = {run_id: run_handle(base, run_id, url) for run_id, url in rows}
    dirs, statements = [], []
    for table in SCHEMAS:
        sources = [f"{table}/run_id=/{SCHEMA_FILE}"] + [
            p for r, t, p in local if t == table and r not in missing[table]]
        sources += [str(runs[r].at(p)) for r, _, t, p in remote if t == table]
        dirs += [f"{run.table_dir(table)}/" for run in runs.values()]
        statements.append(view_sql(table, sources, temp=True, missing=missing[table]))
    return RemoteViews(statements, dirs, rows)


def run_files_connection(run: RunHandle, files: Sequence[tuple[str, str]],
                         layer: int | None = None):
    """An in-memory DuckDB connection whose views ``row_stats`` / ``col_stats`` read only
    ``files`` (``(table, path relative to the run's statistics root)``: the files the catalog
    lists for the run, :mod:`attnbase.warehouse.catalog.statledger`), ``layer``'s rows only if given.

    No catalog is opened: a Dask worker on any machine that reaches the store can aggregate a
    layer of a run (the analysis fan-out, :mod:`attnbase.stats.layer_parts`). One thread: a
    float sum then adds its rows in file order, so an aggregate is the same bits on every
    call (DuckDB's parallel sums are not: their order of partial sums varies). Close it."""
    import duckdb

    run_id = run.run_id
    con = duckdb.connect(":memory:", config={"threads": 1, "autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    run.register_filesystem(con)
    where = "" if layer is None else f" WHERE layer = {int(layer)}"
    try:
        for table, schema in SCHEMAS.items():
            cols = ", ".join(schema.names)
            paths = sorted(str(run.at(p)) for t, p in files if t == table)
            if paths:
                listing = "[" + ", ".join(f"'{sql_str(p)}'" for p in paths) + "]"
                source = f"read_parquet({listing}, union_by_name = false)"
            else:  # no file listed (yet): no rows
                con.register(f"_empty_{table}", schema.empty_table())
                source = f"_empty_{table}"
            con.execute(f"CREATE VIEW {table} AS SELECT '{sql_str(run_id)}' AS run_id, {cols} "
                        f"FROM {source}{where}")
    except duckdb.Error as err:
        con.close()
        if run.remote:
            raise _remote_stats_error(err, [(run_id, run.url)]) from None
        from attnbase.warehouse.catalog.statledger import damaged_file_error

        damaged = damaged_file_error(err)
        if damaged is not None:
            raise damaged from None
        raise WarehouseError(f"run {run_id!r}: its statistics files under {run.stats_root} cannot be "
                             f"read ({str(err).strip().splitlines()[0]}); run `attnbase verify "
                             f"--run {run_id}`") from None
    return con


def _remote_stats_error(err: Exception, rows) -> WarehouseError:
    """The object store of a run's statistics files failing as one line (never a traceback)."""
    from attnbase.errors import StorageUnavailableError
    from attnbase.warehouse.runs.location import RETRIES

    text = str(err)
    first = next((ln.strip() for ln in text.splitlines() if "Error" in ln and ln.strip()),
                 text.strip().splitlines()[0] if text.strip() else type(err).__name__)[:200]
    where = ", ".join(sorted({u.rsplit("/", 1)[0] for _, u in rows}))
    if any(k in text for k in ("EndpointConnectionError", "Could not connect", "ConnectTimeout",
                               "Connection refused", "ReadTimeout")):
        return StorageUnavailableError(
            f"the statistics files on {where} cannot be read: the object store did not answer "
            f"after {RETRIES} retries ({first}); check AWS_ENDPOINT_URL and the network, then "
            "run the same command again")
    return WarehouseError(f"the statistics files on {where} cannot be read ({first}); check "
                          "the store and the AWS_* credentials")
