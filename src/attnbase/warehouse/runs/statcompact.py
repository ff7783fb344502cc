"""A finished run's statistics files merged into one per table, sorted for head questions.

The writer leaves one Parquet file per batch (:mod:`attnbase.warehouse.runs.statfiles`), each with a
row group per layer. A question about one head (``WHERE run_id = ? AND layer = ? AND head = ?``,
the service's run-scoped SQL, a head page) then opens every batch file and scans a layer's row
group in each. :func:`compact_stats`
rewrites the listed files of a complete run as one file per table::

    DIR/row_stats/run_id=<run_id>/merged-<crc32c>.parquet   rows ordered by (layer, head, seq,
    DIR/col_stats/run_id=<run_id>/merged-<crc32c>.parquet   query|key), a row group per head

and the same question prunes all row groups but one by their min/max statistics
(benchmarks/RESULTS.md: "one head's question after `attnbase compact`"). Values, types and the rows' set are unchanged; the views, their
columns and every query stay the same (only an unordered query's row order may differ).

The swap is one catalog transaction: the merged file is written whole beside the batch files
(unlisted, so no reader sees it), then one ledger transaction unlists the files it replaces
and lists it (:mod:`attnbase.warehouse.catalog.statledger`): a reader sees the batch files or the merged
file, never both and never neither. The replaced files are deleted after the commit (a query
that bound the views before it and opens one of them after fails once with a missing file;
rerun it). A crash leaves an unlisted file, removed by the next writer of the run. The name
carries the file's checksum, so a merge never overwrites a file a reader may be reading.

Only the listed files of complete batches are merged. A run being written (status
``running``) is refused. ``verify --repair`` of a merged run rewrites the merged file without
the batches it sends back (:func:`drop_seqs`), so every row stays in exactly one listed file.
A run on object storage keeps a file per batch.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from attnbase import faults
from attnbase.errors import WarehouseError
from attnbase.warehouse.catalog import statledger
from attnbase.warehouse.runs.handle import RunHandle
from attnbase.warehouse.runs.statfiles import fsync_file
from attnbase.warehouse.runs.statschema import COMPRESSION, SCHEMAS, sql_str
from attnbase.warehouse.catalog.statledger import FileRecord

MERGED_PREFIX = "merged-"
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
    note: str = ""  # why nothing was merged
    group_rows: int = 0  # rows per row group of the merged files
    head_groups: bool = False  # whether a row group holds exactly one head
    #: ``.partial`` files a stopped write left, removed (relative paths)
    partials_removed: tuple[str, ...] = ()


#: DuckDB's Parquet writer fills row groups in vectors of 2,048 rows: no smaller groups
MIN_GROUP_ROWS = 2048


def is_merged(path: str) -> bool:
    return Path(path).name.startswith(MERGED_PREFIX)


def remove_staging(run: RunHandle) -> None:
    """What a stopped merge of a local run may have left beside its files (an unlisted merged
    file goes with the next writer's :func:`~attnbase.warehouse.catalog.statledger.remove_unlisted`):
    the sort's spill directory, and the ``.merging`` staging directories of earlier versions."""
    for table in SCHEMAS:
        d = Path(run.table_dir(table))
        shutil.rmtree(d / ".spill", ignore_errors=True)
        for left in (d.parent / ".merging" / d.name, d.parent / ".merging" / (d.name + ".old")):
            shutil.rmtree(left, ignore_errors=True)
        for parent in (d.parent / ".merging",):
            try:
                parent.rmdir()  # only when empty
            except OSError:
                pass


def _merge_into(run: RunHandle, table: str, sources: list[str], group_rows: int, where: str = ""
                ) -> tuple[FileRecord, int] | None:
    """Write the rows of ``sources`` (listed relative paths; ``where`` keeps a subset) sorted for
    head questions into a new, unlisted ``merged-<crc32c>.parquet``; (its record, rows). None
    when no row is left."""
    import duckdb

    d = Path(run.table_dir(table))
    tmp = d / f"{MERGED_PREFIX}{os.getpid()}.parquet.partial"
    spill = d / ".spill"
    cols = ", ".join(SCHEMAS[table].names)
    listing = "[" + ", ".join(f"'{sql_str(str(run.at(p)))}'" for p in sources) + "]"
    con = duckdb.connect(":memory:", config={"memory_limit": SORT_MEMORY,
                                             "temp_directory": str(spill)})
    try:
        want = con.execute(f"SELECT count(*) FROM read_parquet({listing}) {where}").fetchone()[0]
        if want == 0:
            return None
        try:
            with faults.disk_full("merge_write"):
                con.execute(f"COPY (SELECT {cols} FROM read_parquet({listing}, union_by_name = "
                            f"false) {where} ORDER BY {_ORDER[table]}) TO '{sql_str(str(tmp))}' "
                            f"(FORMAT parquet, COMPRESSION {COMPRESSION}, "
                            f"ROW_GROUP_SIZE {group_rows})")
        except duckdb.Error as err:
            tmp.unlink(missing_ok=True)
            raise _no_space(err, run, table, sources) or err
        faults.point("merge_written")
        n = con.execute(f"SELECT count(*) FROM read_parquet('{sql_str(str(tmp))}')").fetchone()[0]
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    if n != want:  # never expected: the COPY is the files' rows
        tmp.unlink(missing_ok=True)
        raise WarehouseError(f"run {run.run_id!r}: merging {table} wrote {n} rows of {want}; the "
                             "batch files stay")
    try:
        fsync_file(tmp)
        crc, size = run.checksum(tmp)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _no_space(err, run, table, sources) or err
    final = d / f"{MERGED_PREFIX}{crc:08x}.parquet"
    os.replace(tmp, final)
    return FileRecord(table, run.relpath(final), crc, size, None), n


def _no_space(err: BaseException, run: RunHandle, table: str, sources: list[str]):
    """A write that failed for want of space (ENOSPC, or EFBIG past a file size limit) as one
    line saying so and that nothing was lost; None for any other failure."""
    import errno

    text = str(err)
    code = getattr(err, "errno", None)
    if code == errno.ENOSPC or "No space left on device" in text:
        why = "the disk is full (ENOSPC)"
    elif code == errno.EFBIG or "File too large" in text:
        why = "a file size limit was reached (EFBIG)"
    elif code == errno.EDQUOT or "quota exceeded" in text.lower():
        why = "the disk quota is full (EDQUOT)"
    else:
        return None
    d = Path(run.table_dir(table))
    need = sum(os.path.getsize(run.at(p)) for p in sources if os.path.exists(run.at(p)))
    return WarehouseError(
        f"run {run.run_id!r}: cannot write the merged {table} file in {d}: {why}; nothing was "
        f"lost: the run's {len(sources)} {table} files stay listed and readable and the partial "
        f"file was removed; free about {_size(need)} there (the merge writes its file "
        f"before it deletes the old ones) and run `attnbase compact --run {run.run_id}` again")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{max(1, round(n / 1024))} KiB"


def remove_partials(run: RunHandle) -> list[str]:
    """Delete the ``.partial`` files in the run's statistics directories: a merge or a batch
    write stopped before its rename (a kill) leaves one; the caller holds the run's lease, so
    no writer is making one now. Returns the relative paths removed."""
    gone = []
    for table in SCHEMAS:
        d = Path(run.table_dir(table))
        for name in sorted(run.sizes(d)):
            if name.endswith(".partial"):
                run.delete(d / name)
                gone.append(run.relpath(d / name))
    return gone


def compact_stats(db, run_id: str, *, wait: bool = False) -> StatsCompactResult:
    """Merge ``run_id``'s listed ``row_stats``/``col_stats`` files (see module doc) while
    holding the run's lease (``wait``: for another writer of the run, else refuse)."""
    with db.catalog.acquire_lease(run_id, "compact", wait=wait):
        return _compact_stats(db, run_id)


def _compact_stats(db, run_id: str) -> StatsCompactResult:
    """Merge ``run_id``'s listed ``row_stats``/``col_stats`` files (see module doc). A no-op,
    with its reason in ``note``, for a run on object storage; raises for a run that is being
    written."""
    t0 = time.perf_counter()
    info = db.run_info(run_id)
    # a head's rows (a query or key row per token): a row group each, at least DuckDB's 2,048
    head_rows = int(info["n_seqs"]) * int(info["seq_len"])
    group_rows = max(head_rows, MIN_GROUP_ROWS)
    run = db.run(run_id)
    if run.remote:
        return StatsCompactResult(run_id, 0, 0, 0, 0.0, "its statistics are on object storage "
                                  "and stay one object per batch")
    if info["status"] == "running":
        raise WarehouseError(f"run {run_id!r} is being written (status running); merge its "
                             "statistics files once it is complete or interrupted (a writer "
                             "killed without a trace leaves 'running': resume it with "
                             f"`attnbase extract --resume --run {run_id}` first)")
    remove_staging(run)
    partials = remove_partials(run)
    with db.connect(read_only=True, stats=False) as con:
        files = statledger.listed(con, run_id)
    before = after = rows = 0
    for table in SCHEMAS:
        mine = [f.path for f in files if f.table == table]
        before += len(mine)
        if not mine or (len(mine) == 1 and is_merged(mine[0])):
            after += len(mine)
            continue
        made = _merge_into(run, table, mine, group_rows)
        with db.ledger() as led:
            led.forget(run_id, paths=mine)
            if made is not None:
                led.record(run_id, [made[0]])
        for p in mine:
            if made is None or p != made[0].path:
                run.delete(run.at(p))
        after += 1 if made is not None else 0
        rows += made[1] if made is not None and table == "row_stats" else 0
    note = "swapped in one catalog transaction" if after < before else ""
    return StatsCompactResult(run_id, before, after, rows, time.perf_counter() - t0, note,
                              group_rows, head_rows % MIN_GROUP_ROWS == 0, tuple(partials))


def drop_seqs(db, run: RunHandle, ranges: list[tuple[int, int]], led) -> list[str]:
    """On the open ledger transaction ``led`` of ``verify --repair``: replace the run's merged
    files by ones without the seqs of ``ranges`` (``(first, n)`` each: the batches sent back to
    pending), written first, unlisted. Returns the relative paths now unlisted, to delete after
    the commit. A run without merged files: nothing."""
    if run.remote or not ranges:
        return []
    keep = " AND ".join(f"NOT (seq >= {int(a)} AND seq < {int(a) + int(n)})" for a, n in ranges)
    gone = []
    for f in led.listed(run.run_id):
        if f.batch is not None:
            continue
        rg = _group_rows(run.at(f.path))
        made = _merge_into(run, f.table, [f.path], rg, f"WHERE {keep}")
        led.forget(run.run_id, paths=[f.path])
        if made is not None:
            led.record(run.run_id, [made[0]])
        if made is None or made[0].path != f.path:
            gone.append(f.path)
    return gone


def _group_rows(path) -> int:
    import pyarrow.parquet as pq

    md = pq.read_metadata(path)
    return max((md.row_group(i).num_rows for i in range(md.num_row_groups)),
               default=MIN_GROUP_ROWS) or MIN_GROUP_ROWS
