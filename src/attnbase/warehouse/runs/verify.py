"""``attnbase verify``: check a database's stores against its catalog, and mark broken batches for repair.

What is checked, per run (:func:`verify_run`):

* **arrays**: every ``arrays`` row has a Zarr array in the run's store with the catalog's shape,
  chunk shape and dtype, and its chunk count (the product of ``ceil(shape / chunks)``) matches;
* **chunks**: every chunk file (or object, for a run on ``s3://``) present decodes, which checks
  its crc32c and its zstd frame (a truncated or byte-flipped chunk fails here); an uncompressed
  chunk also has exactly the size the catalog's chunk shape and dtype give (+ 4 checksum bytes);
  and every chunk of a batch that the ledger counts complete exists (a missing file would
  otherwise read silently as the fill value);
* **ledger**: the ``batches`` rows tile ``0..n_seqs-1`` in ``ceil(n_seqs / batch)`` batches
  aligned with the chunks along ``seq``; a run marked complete has no pending batch;
* **row_stats / col_stats**: a complete batch has exactly ``n_layers * n_heads * n * seq_len``
  rows in each (one per attention row, resp. per received key), a pending batch has none.

Every problem names its run, array, chunk coordinates, file and batch where it has them.
:func:`broken_batches` turns the problems into the batch numbers a rewrite repairs, and
:func:`mark_for_repair` sends them back to ``pending`` in the ledger (deleting their statistics
and broken chunk files in the same step), so that the ordinary resume of ``attnbase extract``
rewrites exactly those batches, whatever write path does the writing.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

from attnbase.contract import storage_dtype
from attnbase.errors import RunNotFoundError, WarehouseError
from attnbase.warehouse.runs.statcompact import drop_seqs
from attnbase.warehouse.database import Database
from attnbase.warehouse.runs.handle import RunHandle

#: Problem kinds; ``chunk``, ``missing_chunk`` and ``stats`` are repairable batch by batch,
#: the others need ``--overwrite`` (the run's layout itself is wrong).
BATCH_KINDS = ("chunk", "missing_chunk", "stats", "stats_file")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run; ``str()`` is one line naming run, array, chunk, file, batch."""

    run_id: str
    kind: str  # chunk | missing_chunk | array | ledger | stats | stats_file | store | catalog
    message: str
    array: str | None = None
    chunk: tuple[int, ...] | None = None
    file: str | None = None
    batch: int | None = None
    table: str | None = None  #: row_stats | col_stats (a statistics file's)
    #: the batches a rewrite of this problem needs when not just ``batch`` (a merged file's)
    covers: tuple[int, ...] = ()

    def __str__(self) -> str:
        if self.kind == "catalog":
            return self.message
        where = [f"run {self.run_id!r}"]
        if self.table is not None:
            where.append(f"table {self.table!r}")
        if self.array is not None:
            where.append(f"array {self.array!r}")
        if self.chunk is not None:
            where.append(f"chunk {self.chunk}")
        if self.batch is not None:
            where.append(f"batch {self.batch}")
        loc = f" ({self.file})" if self.file else ""
        return f"{', '.join(where)}{loc}: {self.message}"


@dataclass
class VerifyResult:
    """Problems found and how much was looked at."""

    runs: list[str] = field(default_factory=list)
    chunks_checked: int = 0
    #: rows whose statistics were recomputed from the logits (:data:`ROW_SAMPLE` per run)
    rows_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: what was seen and is no problem (a stopped write's unlisted ``.partial`` file), one line each
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _ledger(db: Database, run_id: str) -> list[tuple[int, int, int, str]]:
    with db.connect(read_only=True) as con:
        return [tuple(r) for r in con.execute(
            "SELECT batch, first_seq, n_seqs, status FROM batches WHERE run_id = ? ORDER BY batch",
            [run_id]).fetchall()]


def _stat_counts(db: Database, run_id: str, table: str,
                 ledger: list[tuple[int, int, int, str]]) -> dict[int, int]:
    """Rows of ``table`` per batch of the ledger (by seq range)."""
    with db.connect(read_only=True) as con:
        rows = con.execute(f"SELECT seq, count(*) FROM {table} WHERE run_id = ? GROUP BY seq",
                           [run_id]).fetchall()
    by_seq = {int(s): int(n) for s, n in rows}
    out = {}
    for b, first, n, _ in ledger:
        out[b] = sum(by_seq.pop(s, 0) for s in range(first, first + n))
    out[-1] = sum(by_seq.values())  # rows outside every batch
    return out


def _raw_chunk_size(arr) -> int | None:
    """Bytes of one chunk of an array stored without compression (``bytes`` + ``crc32c``)."""
    from zarr.codecs import BytesCodec, Crc32cCodec

    codecs = tuple(arr.metadata.codecs)
    if len(codecs) == 2 and isinstance(codecs[0], BytesCodec) and isinstance(codecs[1], Crc32cCodec):
        return math.prod(arr.chunks) * arr.dtype.itemsize + 4
    return None


def _check_chunks(run: RunHandle, name: str, arr, seq_axis: int,
                  counted: set[int], result: VerifyResult) -> None:
    run_id = run.run_id
    grid = [range(math.ceil(n / c)) for n, c in zip(arr.shape, arr.chunks)]
    base = run.store_path / name / "c"
    size_of = run.sizer(base)  # coords -> bytes (None: absent)
    want_size = _raw_chunk_size(arr)
    for coords in itertools.product(*grid):
        path = base.joinpath(*map(str, coords))
        batch = coords[seq_axis] if seq_axis >= 0 else None
        rel = str(path)
        size = size_of(coords)
        if size is None:
            if batch in counted:
                result.problems.append(Problem(
                    run_id, "missing_chunk", "chunk file is missing although the ledger counts "
                    "its batch complete (it would read as the fill value)",
                    array=name, chunk=coords, file=rel, batch=batch))
            continue
        result.chunks_checked += 1
        if want_size is not None and size != want_size:
            result.problems.append(Problem(
                run_id, "chunk", f"chunk has {size} bytes, expected {want_size} (catalog chunk "
                f"shape {tuple(arr.chunks)} x {arr.dtype} + 4 checksum bytes)",
                array=name, chunk=coords, file=rel, batch=batch))
            continue
        sel = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(coords, arr.chunks, arr.shape))
        try:
            arr[sel]
        except Exception as err:  # zarr/numcodecs raise several types for a bad chunk
            from attnbase.warehouse.runs.location import storage_error

            unreachable = storage_error(err, f"reading {rel}")
            if unreachable is not err:  # the object store failed: no verdict on the chunk
                raise unreachable from err
            detail = str(err).splitlines()[0] if str(err) else type(err).__name__
            result.problems.append(Problem(
                run_id, "chunk", f"chunk fails its checksum or decoding ({detail})",
                array=name, chunk=coords, file=rel, batch=batch))


def _check_stat_files(db: Database, run: RunHandle, counted: set[int],
                      result: VerifyResult) -> bool:
    """Every statistics file the catalog lists for ``run`` is there with its recorded size and
    crc32c, and every complete batch has its files (its own, or a merged one); False when a
    problem was found."""
    from attnbase.warehouse.catalog import statledger

    run_id = run.run_id
    with db.connect(read_only=True, stats=False) as con:
        files = statledger.listed(con, run_id)
    fix = f"`attnbase extract --db {db.path} --run {run_id} --repair` (with the run's settings)"
    found = []
    for table in ("row_stats", "col_stats"):
        d = run.table_dir(table)
        for name in sorted(run.sizes(d)):
            if name.endswith(".partial"):
                result.notes.append(
                    f"run {run_id!r}: {run.relpath(d / name)} is a file a stopped write left; "
                    "not listed, so never read; the run's next compact or extract removes it")
        mine = [f for f in files if f.table == table]
        own = {f.batch for f in mine if f.batch is not None}
        covered = sorted(counted - own)  # held by the run's merged (or unbatched) files
        for f in mine:
            path = run.at(f.path)
            try:
                crc, size = run.checksum(path)
            except FileNotFoundError:
                crc = size = None
            what = (f"holds batch {f.batch}" if f.batch is not None
                    else f"holds batches {_ranges(covered)}")
            redo = (f"re-extracts batch {f.batch}" if f.batch is not None
                    else f"re-extracts batches {_ranges(covered)}")
            if size is None:
                msg = "is missing"
            elif size != f.size:
                msg = f"has {size} bytes, the catalog recorded {f.size} (truncated or replaced)"
            elif crc != f.crc32c:
                msg = f"fails its checksum (crc32c {crc:08x}, the catalog recorded {f.crc32c:08x})"
            else:
                continue
            found.append(Problem(
                run_id, "stats_file", f"statistics file {msg}; it {what}: {fix} {redo}",
                file=str(path), batch=f.batch, table=table,
                covers=() if f.batch is not None else tuple(covered)))
        if covered and not any(f.batch is None for f in mine):
            for b in covered:
                found.append(Problem(
                    run_id, "stats_file", f"no {table} file is listed for this complete batch; "
                    f"{fix} re-extracts it", batch=b, table=table))
    result.problems.extend(found)
    return not found


def _ranges(batches: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    out, i = [], 0
    while i < len(batches):
        j = i
        while j + 1 < len(batches) and batches[j + 1] == batches[j] + 1:
            j += 1
        out.append(str(batches[i]) if i == j else f"{batches[i]}-{batches[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def verify_run(db: Database, run_id: str, result: VerifyResult | None = None,
               progress: Callable[[str], None] | None = None) -> VerifyResult:
    """Check one run (see the module docstring); problems are appended to ``result``."""
    result = result if result is not None else VerifyResult()
    info = db.run_info(run_id)
    result.runs.append(run_id)
    problems = result.problems
    ledger = _ledger(db, run_id)
    n_seqs, seq_len = int(info["n_seqs"]), int(info["seq_len"])
    L, H = int(info["n_layers"]), int(info["n_heads"])

    # --- the ledger tiles the run's seqs ----------------------------------------------------
    expect_first = 0
    for b, first, n, status in ledger:
        if first != expect_first or n <= 0:
            problems.append(Problem(run_id, "ledger", f"ledger row covers seqs {first}..{first + n - 1}, "
                                    f"expected to start at {expect_first}", batch=b))
        expect_first = first + n
    if expect_first != n_seqs:
        problems.append(Problem(run_id, "ledger", f"the ledger's {len(ledger)} batches cover "
                                f"{expect_first} seqs, the run has {n_seqs}"))
    pending = [b for b, _, _, s in ledger if s != "complete"]
    if info["status"] == "complete" and pending:
        problems.append(Problem(run_id, "ledger", f"run is marked complete but batches {pending} "
                                "are pending"))
    counted = {b for b, _, _, s in ledger if s == "complete"}
    batch_rows = {b: n for b, _, n, _ in ledger}

    # --- arrays against the catalog, chunks against their checksums --------------------------
    run = db.run(run_id)
    store_dir = run.store_path
    rows = db.array_rows(run_id)
    if not (store_dir / "zarr.json").exists():
        if rows:
            problems.append(Problem(run_id, "store", "the run has no array store", file=str(store_dir)))
        rows = []
    group = run.store().group() if rows else None
    for row in rows:
        name = row["name"]
        if progress:
            progress(f"{run_id}/{name}")
        if row.get("derived"):
            _check_derived(run_id, row, group, {r["name"] for r in rows}, problems)
            continue
        try:
            arr = group[name]
        except KeyError:
            problems.append(Problem(run_id, "array", "the catalog lists this array but the store "
                                    "has none", array=name, file=str(store_dir / name)))
            continue
        shape, chunks = tuple(row["shape"]), tuple(row["chunks"])
        n_chunks = math.prod(math.ceil(s / c) for s, c in zip(shape, chunks))
        stored_chunks = math.prod(math.ceil(s / c) for s, c in zip(arr.shape, arr.chunks))
        if (tuple(arr.shape) != shape or tuple(arr.chunks) != chunks
                or str(arr.dtype) != storage_dtype(row["dtype"])):
            problems.append(Problem(
                run_id, "array", f"store has shape {tuple(arr.shape)}, chunks {tuple(arr.chunks)}, "
                f"dtype {arr.dtype} ({stored_chunks} chunks); the catalog says {shape}, {chunks}, "
                f"{row['dtype']} ({n_chunks} chunks)", array=name, file=str(store_dir / name)))
            continue
        dims = tuple(row["dims"])
        seq_axis = dims.index("seq") if "seq" in dims else -1
        if seq_axis >= 0 and math.ceil(shape[seq_axis] / chunks[seq_axis]) != len(ledger):
            problems.append(Problem(
                run_id, "array", f"{math.ceil(shape[seq_axis] / chunks[seq_axis])} chunks along seq "
                f"but {len(ledger)} batches in the ledger", array=name))
            continue
        _check_chunks(run, name, arr, seq_axis, counted, result)

    # --- statistics files against their checksums ----------------------------------------------
    if not _check_stat_files(db, run, counted, result):
        return result  # the checks below would read the damaged files

    # --- a seeded sample of rows' statistics recomputed from the logits -------------------------
    if counted and any(r["name"] == "attn_logits" for r in rows) and not any(
            p.run_id == run_id and p.kind in ("array", "store", "chunk", "missing_chunk")
            for p in problems):
        _check_row_sample(db, run_id, ledger, counted, result)

    # --- statistics against the ledger ------------------------------------------------------
    for table in ("row_stats", "col_stats"):
        counts = _stat_counts(db, run_id, table, ledger)
        for b, got in counts.items():
            if b == -1:
                if got:
                    problems.append(Problem(run_id, "ledger", f"{table} has {got} rows of seqs "
                                            "outside every batch of the ledger"))
                continue
            if b not in counted:
                # a pending batch may hold the statistics file of a write that stopped before
                # its ledger mark (statfiles: the resume rewrites that same file): not a problem
                continue
            want = L * H * batch_rows[b] * seq_len
            if got != want:
                state = "complete" if b in counted else "pending"
                problems.append(Problem(run_id, "stats", f"{table} has {got} rows for this "
                                        f"{state} batch, expected {want}", batch=b))
    return result


#: Rows of ``row_stats`` per run whose statistics verify recomputes from the (stored or
#: derived) logits, drawn with :data:`ROW_SAMPLE_SEED`; and the tolerance of the comparison
#: (statistics are float64 from float32 logits; the capture's kernel and this check differ only
#: in summation order).
ROW_SAMPLE = 64
ROW_SAMPLE_SEED = 0
ROW_SAMPLE_RTOL = 1e-6


def _check_derived(run_id: str, row: dict, group, names: set[str], problems: list) -> None:
    """A derived array: the store lists the catalog's recipe, and its inputs are arrays of the
    run (their chunks are checked as stored arrays)."""
    from attnbase.contract import LogitsRecipe
    from attnbase.warehouse.runs.derived import read_derived_attrs

    name = row["name"]
    try:
        want = LogitsRecipe.from_json(row["derivation"])
        have = read_derived_attrs(dict(group.attrs)).get(name)
    except (WarehouseError, KeyError, TypeError, ValueError) as err:
        problems.append(Problem(run_id, "array", f"derivation cannot be read ({err})", array=name))
        return
    if have != want:
        problems.append(Problem(run_id, "array", "the store's recipe for this derived array "
                                f"({have}) is not the catalog's ({want})", array=name))
    missing = [n for n in want.inputs if n not in names]
    if missing:
        problems.append(Problem(run_id, "array", f"derived from {', '.join(want.inputs)}, but "
                                f"the run has no {', '.join(missing)}", array=name))


def _row_stats_of(z) -> dict:
    """``n_keys, sink_mass, max_prob, entropy`` of one logits row (float64, masked = -inf)."""
    import numpy as np

    z = np.asarray(z, dtype=np.float64)
    live = np.isfinite(z)
    e = np.where(live, np.exp(z - z[live].max()), 0.0)
    p = e / e.sum()
    nz = p > 0
    return {"n_keys": int(live.sum()), "sink_mass": float(p[0]), "max_prob": float(p.max()),
            "entropy": float(-(p[nz] * np.log(p[nz])).sum())}


def _check_row_sample(db: Database, run_id: str, ledger, counted: set[int],
                      result: VerifyResult) -> None:
    """Recompute :data:`ROW_SAMPLE` seeded rows' statistics from ``attn_logits`` (stored or
    formed from queries and keys) and compare them with ``row_stats``: a derived run whose
    inputs or recipe drifted from what the capture saw fails here."""
    import numpy as np

    seqs = [s for b, first, n, _ in ledger if b in counted for s in range(first, first + n)]
    with db.connect(read_only=True) as con:
        rows = con.execute(
            "SELECT layer, head, seq, query, n_keys, sink_mass, max_prob, argmax, entropy "
            "FROM (SELECT * FROM row_stats WHERE run_id = ? AND list_contains(?, seq) "
            "ORDER BY layer, head, seq, query) "
            f"USING SAMPLE reservoir({ROW_SAMPLE} ROWS) REPEATABLE ({ROW_SAMPLE_SEED})",
            [run_id, seqs]).fetchall()
    store = db.run(run_id).store()
    # logits stored rounded (--store-dtype float16 / bfloat16) differ from the float32 ones the
    # statistics came from by their rounding: the tolerance follows that dtype's epsilon
    held = {r["name"]: r for r in db.array_rows(run_id)}["attn_logits"]
    eps = 0.0 if held["derived"] or held["dtype"] == "float32" else {
        "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}.get(held["dtype"], 2.0 ** -7)
    rtol = max(ROW_SAMPLE_RTOL, 64 * eps)
    for layer, head, seq, query, n_keys, sink, mx, argmax, ent in rows:
        try:
            z = store.read("attn_logits", (int(layer), int(head), int(seq), int(query)))
        except WarehouseError as err:  # a corrupt input chunk: named by the chunk checks
            result.problems.append(Problem(run_id, "chunk", str(err), array="attn_logits"))
            return
        got = _row_stats_of(z)
        want = {"n_keys": n_keys, "sink_mass": sink, "max_prob": mx, "entropy": ent}
        bad = [k for k, v in want.items()
               if not np.isclose(got[k], v, rtol=rtol, atol=max(1e-9, rtol), equal_nan=True)]
        live = z[np.isfinite(z)]
        if not (0 <= int(argmax) < len(z)) or not live.size or (
                z[int(argmax)] != live.max() if not eps else z[int(argmax)] < live.max() - rtol * abs(live.max()) - rtol):
            bad.append("argmax")  # the stored argmax must be a most-attended key
            got["argmax"] = int(np.argmax(np.where(np.isfinite(z), z, -np.inf)))
            want["argmax"] = argmax
        if bad:
            batch = next(b for b, first, n, _ in ledger if first <= seq < first + n)
            result.problems.append(Problem(
                run_id, "stats", f"row (layer {layer}, head {head}, seq {seq}, query {query}): "
                f"{', '.join(bad)} in row_stats ({', '.join(f'{k}={want[k]!r}' for k in bad)}) "
                f"differ from the logits' ({', '.join(f'{k}={got[k]!r}' for k in bad if k in got)})",
                array="attn_logits", batch=batch))
        result.rows_checked += 1


def verify(db: Database, run_id: str | None = None,
           progress: Callable[[str], None] | None = None) -> VerifyResult:
    """Check ``run_id`` (or every run) of ``db``; never writes."""
    db.require()
    result = VerifyResult()
    _check_catalog(db, result)
    if result.problems:
        return result  # the runs' checks read the catalog
    for rid in ([run_id] if run_id is not None else db.run_ids()):
        verify_run(db, rid, result, progress=progress)
    return result


def _check_catalog(db: Database, result: VerifyResult) -> None:
    """The catalog's own tables against their checksums (each read whole): a damaged one is a
    ``catalog`` problem naming the file and the table."""
    for table, message in db.catalog.damaged_tables():
        result.problems.append(Problem("", "catalog", message, table=table))


def broken_batches(problems: Iterable[Problem], run_id: str) -> list[int]:
    """The batches of ``run_id`` whose rewrite repairs ``problems`` (sorted, unique).

    Raises :class:`WarehouseError` when a problem of the run is not repairable batch by batch.
    """
    mine = [p for p in problems if p.run_id == run_id]
    layout = [p for p in mine if p.kind not in BATCH_KINDS]
    if layout:
        raise WarehouseError(f"{layout[0]}; rewriting batches cannot repair this, re-extract the "
                             f"run with `attnbase extract ... --run {run_id} --overwrite`")
    return sorted({p.batch for p in mine if p.batch is not None}
                  | {b for p in mine for b in p.covers})


def mark_for_repair(db: Database, run_id: str, batches: Iterable[int]) -> list[int]:
    """Send ``batches`` of ``run_id`` back to ``pending`` so the next resume rewrites them.

    A complete run is set back to ``running``, then one ledger transaction marks them pending;
    afterwards their ``row_stats``/``col_stats`` files and broken chunk files are deleted, so
    until the rewrite their seqs read as not written (the fill value) rather than failing.
    Returns the batches marked.
    """
    batches = sorted(set(int(b) for b in batches))
    if not batches:
        return []
    ledger = {b: (first, n) for b, first, n, _ in _ledger(db, run_id)}
    unknown = [b for b in batches if b not in ledger]
    if unknown:
        raise WarehouseError(f"run {run_id!r} has no batches {unknown} (it has 0..{len(ledger) - 1})")
    run = db.run(run_id)
    # the run is marked unfinished first: stopped before the ledger commits, it is a running
    # run whose batches are all complete, which the next writer finishes
    with db.transaction(stats=False) as con:
        con.execute("UPDATE runs SET status = 'running', finished_at = NULL "
                    "WHERE run_id = ? AND status = 'complete'", [run_id])
    with db.ledger() as led:
        complete = led.complete(run_id)
        led.set_status(run_id, batches, "pending")
        # the batches' row/col statistics files: unlisted here, deleted after the commit
        listed = led.listed(run_id)
        gone = [f.path for f in listed if f.batch in batches]
        led.forget(run_id, batches=batches)
        # a merged run (``attnbase compact``) holds them in one file per table: rewritten
        # without them, or unlisted whole when every batch it holds goes back (a damaged
        # merged file is never read)
        ranges = []
        for f in listed:
            if f.batch is not None:
                continue
            held = complete - {g.batch for g in listed if g.table == f.table and g.batch is not None}
            if held <= set(batches):
                led.forget(run_id, paths=[f.path])
                gone.append(f.path)
            else:
                ranges = [ledger[b] for b in batches]
        if ranges:
            gone += drop_seqs(db, run, ranges, led)
    for p in gone:
        run.delete(run.at(p))
    _delete_batch_chunks(db, run_id, batches)
    return batches


def _delete_batch_chunks(db: Database, run_id: str, batches: list[int]) -> None:
    run = db.run(run_id)
    for row in db.array_rows(run_id):
        dims, shape, chunks = tuple(row["dims"]), tuple(row["shape"]), tuple(row["chunks"])
        if "seq" not in dims:
            continue
        ax = dims.index("seq")
        grid = [range(math.ceil(s / c)) for s, c in zip(shape, chunks)]
        for b in batches:
            grid[ax] = range(b, b + 1)
            for coords in itertools.product(*grid):
                run.delete(run.store_path.joinpath(row["name"], "c", *map(str, coords)))


def prepare_repair(db: Database, run_id: str) -> tuple[VerifyResult, list[int]]:
    """Verify ``run_id`` and mark its broken batches pending; returns (result, batches marked).

    Raises :class:`RunNotFoundError` for an unknown run (``--repair`` mends an existing run) and
    :class:`WarehouseError` when a problem needs ``--overwrite`` instead.
    """
    if db.find_run(run_id) is None:
        raise RunNotFoundError(f"--repair mends an existing run, and {db.path} has no run "
                               f"{run_id!r}; drop --repair to extract it")
    with db.catalog.acquire_lease(run_id, "repair"):  # nobody writes the run while it is marked
        result = verify(db, run_id)
        return result, mark_for_repair(db, run_id, broken_batches(result.problems, run_id))
