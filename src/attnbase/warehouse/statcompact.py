"""A finished run's statistics files merged into one per table, sorted for head questions.

The writer leaves one Parquet file per batch (:mod:`attnbase.warehouse.statfiles`), each with a
row group per layer. A question about one head (``WHERE run_id = ? AND layer = ? AND head = ?``,
the service's run-scoped SQL, a head page) then opens every batch file and scans a layer's row
group in each: 34 files of a 10^7-row run cost ~25 ms of DuckDB CPU. :func:`compact_stats`
rewrites a complete run's files as::

    DIR/row_stats/run_id=<run_id>/merged.parquet    rows ordered by (layer, head, seq, query),
    DIR/col_stats/run_id=<run_id>/merged.parquet    one row group per head (n_seqs x seq_len rows)

and the same question prunes all row groups but one by their min/max statistics (~5 ms,
``benchmarks/serve.py``). Values, types and the rows' set are unchanged; the views, their
columns and every query stay the same (only an unordered query's row order may differ).

The swap is atomic per table: the merged file is written (and fsynced) in a staging directory
outside the views' glob, ``DIR/<table>/.merging/run_id=<run_id>/``, whose place is exchanged
with the run's directory in one ``renameat2(RENAME_EXCHANGE)``; a reader sees the batch files or
the merged file, never both and never neither. (Where the file system lacks the exchange, two
renames leave the run without statistics for the microseconds between them; said in a line.)
A query that listed the old files before the swap and opens one after it fails once with a
missing file; rerun it. A crash leaves the staging directory, removed by the next call.

Only the files of complete batches are merged: a pending batch's file (a write stopped before
its ledger mark) stays as it is, since its resume rewrites that same file. A run being written
(status ``running``) is refused. ``verify --repair`` of a merged run rewrites the merged file
without the batches it sends back (:func:`drop_seqs`), so every row stays in exactly one file.
A run on object storage keeps a file per batch: there is no atomic swap of many objects.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from attnbase.errors import WarehouseError
from attnbase.warehouse.handle import RunHandle
from attnbase.warehouse.statfiles import COMPRESSION, SCHEMAS, _sql_str, fsync_file

MERGED_FILE = "merged.parquet"
STAGING = ".merging"
#: DuckDB's memory for the sort (it spills to a temp directory beyond it)
SORT_MEMORY = "512MB"
_ORDER = {"row_stats": "layer, head, seq, query", "col_stats": "layer, head, seq, key"}


@dataclass(frozen=True)
class StatsCompactResult:
    run_id: str
    files_before: int  # both tables
    files_after: int
    rows: int  # row_stats rows
    seconds: float
    note: str = ""  # why nothing was merged, or how the swap was made
    group_rows: int = 0  # rows per row group of the merged files
    head_groups: bool = False  # whether a row group holds exactly one head


def merged_file(run: RunHandle, table: str) -> Path:
    return run.table_dir(table) / MERGED_FILE


def staging_dir(run: RunHandle, table: str) -> Path:
    """Where a merge of ``run``'s ``table`` is staged, outside the views' glob."""
    return Path(run.stats_root) / table / STAGING / f"run_id={run.run_id}"


def remove_staging(run: RunHandle) -> None:
    """A stopped merge's staging directories of a local run."""
    for table in SCHEMAS:
        staged = staging_dir(run, table)
        for left in (staged, staged.with_name(staged.name + ".old")):
            shutil.rmtree(left, ignore_errors=True)


def _data_files(d: Path) -> list[Path]:
    return sorted(p for p in d.glob("*.parquet")) if d.is_dir() else []


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux ``renameat2``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _swap_in(staged: Path, live: Path, known: set[str]) -> str:
    """Put ``staged`` at ``live``; the old ``live`` ends at ``staged`` and is removed, but for
    any file in it that is not in ``known`` (one that appeared meanwhile: moved across)."""
    if _exchange(staged, live):
        old, how = staged, "atomic exchange"
    else:
        old, how = staged.with_name(staged.name + ".old"), ("two renames (no renameat2 "
                                                             "exchange on this file system)")
        os.replace(live, old)
        os.replace(staged, live)
    for p in old.glob("*.parquet"):
        if p.name not in known:
            os.replace(p, live / p.name)
    shutil.rmtree(old)
    return how


#: DuckDB's Parquet writer fills row groups in vectors of 2,048 rows: no smaller groups
MIN_GROUP_ROWS = 2048


def _merge_set(files: list[Path], complete: set[int]) -> tuple[list[Path], list[Path]]:
    """(files to merge, files to keep as they are): a pending batch's file stays (its resume
    rewrites that same file), every other file is merged (complete batches, an earlier merge,
    a migration's ``unbatched.parquet``)."""
    merge, keep = [], []
    for p in files:
        stem = p.stem
        batch = int(stem[1:]) if stem[:1] == "b" and stem[1:].isdigit() else None
        pending = batch is not None and batch not in complete
        (keep if pending or p.name.startswith("_") else merge).append(p)
    return merge, keep


def compact_stats(db, run_id: str) -> StatsCompactResult:
    """Merge ``run_id``'s ``row_stats``/``col_stats`` files of complete batches (see module
    doc). A no-op, with its reason in ``note``, for a run on object storage; raises for a run
    that is being written."""
    import duckdb

    t0 = time.perf_counter()
    info = db.run_info(run_id)
    # a head's rows (a query or key row per token): a row group each, at least DuckDB's 2,048
    head_rows = int(info["n_seqs"]) * int(info["seq_len"])
    group_rows = max(head_rows, MIN_GROUP_ROWS)
    run = db.run(run_id)
    if run.remote:
        return StatsCompactResult(run_id, 0, 0, 0, 0.0, "its statistics are on object storage "
                                  "and stay one object per batch (no atomic swap of many objects)")
    if info["status"] == "running":
        raise WarehouseError(f"run {run_id!r} is being written (status running); merge its "
                             "statistics files once it is complete or interrupted (a writer "
                             "killed without a trace leaves 'running': resume it with "
                             f"`attnbase extract --resume --run {run_id}` first)")
    with db.connect(read_only=True) as con:
        complete = {int(b) for (b,) in con.execute(
            "SELECT batch FROM batches WHERE run_id = ? AND status = 'complete'",
            [run_id]).fetchall()}
    before = after = rows = 0
    notes = set()
    for table in SCHEMAS:
        live = run.table_dir(table)
        staged = staging_dir(run, table)
        for leftover in (staged, staged.with_name(staged.name + ".old")):
            shutil.rmtree(leftover, ignore_errors=True)  # a stopped call's
        files = _data_files(live)
        merge, keep = _merge_set(files, complete)
        before += len(files)
        if not merge or [p.name for p in merge] == [MERGED_FILE]:
            after += len(files)
            continue
        staged.mkdir(parents=True)
        tmp = staged / (MERGED_FILE + ".partial")
        cols = ", ".join(SCHEMAS[table].names)
        listing = "[" + ", ".join(f"'{_sql_str(str(p))}'" for p in merge) + "]"
        con = duckdb.connect(":memory:", config={"memory_limit": SORT_MEMORY,
                                                 "temp_directory": str(staged / "spill")})
        try:
            con.execute(f"COPY (SELECT {cols} FROM read_parquet({listing}, union_by_name = false) "
                        f"ORDER BY {_ORDER[table]}) TO '{_sql_str(str(tmp))}' (FORMAT parquet, "
                        f"COMPRESSION {COMPRESSION}, ROW_GROUP_SIZE {group_rows})")
            n = con.execute(f"SELECT count(*) FROM read_parquet('{_sql_str(str(tmp))}')"
                            ).fetchone()[0]
            want = con.execute(f"SELECT count(*) FROM read_parquet({listing})").fetchone()[0]
        finally:
            con.close()
        if n != want:  # never expected: the COPY is the files' rows
            shutil.rmtree(staged, ignore_errors=True)
            raise WarehouseError(f"run {run_id!r}: merging {table} wrote {n} rows of {want}; the "
                                 "batch files stay")
        shutil.rmtree(staged / "spill", ignore_errors=True)
        fsync_file(tmp)
        os.replace(tmp, staged / MERGED_FILE)
        for p in keep:  # same file system: a second name, no copy
            os.link(p, staged / p.name)
        notes.add(_swap_in(staged, live, {p.name for p in files}))
        after += 1 + len(keep)
        rows += n if table == "row_stats" else 0
    return StatsCompactResult(run_id, before, after, rows, time.perf_counter() - t0,
                              ", ".join(sorted(notes)), group_rows,
                              head_rows % MIN_GROUP_ROWS == 0)


def drop_seqs(run: RunHandle, ranges: list[tuple[int, int]]) -> None:
    """Rewrite a merged run's files without the seqs of ``ranges`` (``(first, n)`` each: the
    batches ``verify --repair`` sends back to pending); a run without merged files: nothing."""
    import duckdb

    if run.remote or not ranges:
        return
    keep = " AND ".join(f"NOT (seq >= {int(a)} AND seq < {int(a) + int(n)})" for a, n in ranges)
    for table in SCHEMAS:
        path = merged_file(run, table)
        if not path.exists():
            continue
        tmp = path.with_name(path.name + ".partial")
        con = duckdb.connect(":memory:", config={"memory_limit": SORT_MEMORY})
        try:
            rg = con.execute("SELECT max(row_group_num_rows) FROM parquet_metadata(?)",
                             [str(path)]).fetchone()[0] or MIN_GROUP_ROWS
            con.execute(f"COPY (SELECT * FROM read_parquet('{_sql_str(str(path))}') WHERE {keep} "
                        f"ORDER BY {_ORDER[table]}) TO '{_sql_str(str(tmp))}' (FORMAT parquet, "
                        f"COMPRESSION {COMPRESSION}, ROW_GROUP_SIZE {int(rg)})")
        finally:
            con.close()
        os.replace(tmp, path)  # one file replaced whole: readers see the old or the new
