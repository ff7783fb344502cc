"""What runs inside a query process (``python -m attnbase.warehouse.sandbox.querychild``, or
forked from the zygote, :mod:`.zygote`): requests read from its request pipe, each query run
on the process's DuckDB and its result written back as frames (:mod:`.frames`), cut at the
request's row and byte caps. Its caller, which enforces the time and memory limits, is
:mod:`.sqlproc`.

The process says ``R`` once it has imported what it needs; per request it answers ``S`` once
connected, ``B`` frames, then ``D`` or ``E``. It serves requests one after the other and keeps
its last connection (one snapshot file) open for the next.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pyarrow as pa

from attnbase.errors import AttnbaseError, QueryLimitError
from attnbase.warehouse.sandbox.frames import HEAD, frame, read_exact
from attnbase.warehouse.sandbox.sqlerrors import MEMORY_HINT, sql_error

#: Rows per record batch the process sends.
BATCH_ROWS = 2048


def main() -> None:
    """The query process: requests from stdin, frames to stdout (nothing else writes there)."""
    from attnbase.warehouse.sandbox.zygote import server_pidfd, watch_parent

    watch_parent(*server_pidfd())  # never outlive the command or server that started it
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # a stray print cannot corrupt the frames
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to act on
    serve(sys.stdin.buffer, out)


def serve(inp, out) -> None:
    """Requests from ``inp``, frames to ``out`` (see the module docstring), until ``inp``
    ends."""
    import duckdb  # noqa: F401  imported before the ready frame: a query's time is its own

    import attnbase.warehouse.catalog.duckdb_file  # noqa: F401
    import attnbase.warehouse.database  # noqa: F401

    out.write(frame(b"R", b""))
    held: dict = {}
    while True:
        head = read_exact(inp, HEAD.size)
        if head is None:
            return
        _, n = HEAD.unpack(head)
        body = read_exact(inp, n)
        if body is None:
            return
        req = json.loads(body)
        try:
            _serve_one(req, held, out)
        except BrokenPipeError:
            return
        except AttnbaseError as err:
            out.write(frame(b"E", json.dumps({"kind": type(err).__name__,
                                              "message": str(err)}).encode()))
        except Exception as err:  # noqa: BLE001  the caller reports it, one line
            out.write(frame(b"E", json.dumps({"kind": "WarehouseError", "message":
                                              f"SQL error: {type(err).__name__}: {err}"}).encode()))


def _connection(req: dict, held: dict):
    """The connection of the request's database (``file``: a snapshot of its catalog), kept
    open while the next request names the same one."""
    from attnbase.warehouse.catalog.duckdb_file import DuckDBFileBackend
    from attnbase.warehouse.database import Database

    key = json.dumps([req["db"], req.get("file"), req["config"]], sort_keys=True)
    if held.get("key") == key:
        _refresh_stat_views(held, req.get("damaged"))
        return held["con"]
    if held.get("con") is not None:
        held.pop("con").close()
        held.pop("key", None)
    if req.get("file"):  # a snapshot of a migrated catalog; never written
        backend = DuckDBFileBackend(req["db"], file=Path(req["file"]), migrated=True)
    else:
        db = Database(req["db"]).require()
        db.catalog.ensure_migrated()
        backend = db.catalog
    con = backend.open(read_only=True, config=req["config"])
    views = backend.remote_views
    held.update(key=key, con=con, views=views.statements if views else [],
                fixed=bool(req.get("file")), listing=None, signature=None)
    if req.get("damaged"):
        _refresh_stat_views(held, req["damaged"])
    return con


def _refresh_stat_views(held: dict, damaged: dict | None = None) -> None:
    """A kept connection's statistics views made again where the files on disk changed since
    (a listed file deleted, or one in ``damaged``: the views leave it out, and fail only the
    questions about its run; :func:`attnbase.warehouse.runs.statfiles.stat_views`). On a
    snapshot of the catalog (``fixed``: its list of files cannot change) the list is read once
    and the views are made again only when a listed directory's time or ``damaged`` moved."""
    from attnbase.warehouse.runs.statfiles import list_stat_files, stat_views

    con, fixed = held["con"], held.get("fixed")
    listing = held.get("listing") if fixed else None
    if listing is None:
        listing = list_stat_files(con)
        if fixed:
            held["listing"] = listing
    signature = None
    if fixed and listing is not None:
        dirs = listing.signature()
        signature = None if dirs is None else (dirs, sorted((damaged or {}).items()))
        if signature is not None and signature == held.get("signature"):
            return
    views = stat_views(con, damaged=damaged, listing=listing)
    held["signature"] = signature
    if views.statements == held.get("views"):
        return
    if views:
        views.apply(con)
    else:  # the catalog's own views are right again
        for table in ("row_stats", "col_stats"):
            con.execute(f"DROP VIEW IF EXISTS temp.main.{table}")
    held["views"] = views.statements


def _serve_one(req: dict, held: dict, out) -> None:
    import duckdb

    con = _connection(req, held)
    out.write(frame(b"S", b""))  # connected: the query's time starts now
    max_rows, max_bytes = req.get("max_rows"), req["max_bytes"]
    rows = nbytes = 0
    cut = None
    try:
        rel = con.sql(req["sql"], params=req.get("params") or None)
        if rel is None:
            out.write(frame(b"D", json.dumps({"cut_by": None}).encode()))
            return
        reader = rel.to_arrow_reader(BATCH_ROWS)
        for batch in reader:
            if max_rows is not None and rows + batch.num_rows > max_rows:
                batch, cut = batch.slice(0, max_rows - rows), "rows"
            keep = batch.num_rows
            if keep and nbytes + batch.nbytes > max_bytes:  # the rows that fit, about
                keep = int(keep * max(0, max_bytes - nbytes) / batch.nbytes)
                while keep and nbytes + batch.slice(0, keep).nbytes > max_bytes:
                    keep = keep * 9 // 10
                cut = "bytes"
            if keep < batch.num_rows:
                batch = batch.slice(0, keep)
            if batch.num_rows or rows == 0:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as w:
                    w.write_batch(batch)
                out.write(frame(b"B", sink.getvalue().to_pybytes()))
            rows += batch.num_rows
            nbytes += batch.nbytes
            if cut:
                break
        reader.close()  # an unfinished reader holds the database instance (DuckDB 1.5)
        if rows == 0 and cut is None:  # no rows: the schema alone
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, reader.schema):
                pass
            out.write(frame(b"B", sink.getvalue().to_pybytes()))
    except duckdb.OutOfMemoryException:  # its text advises a PRAGMA the sandbox refuses
        raise QueryLimitError(
            f"query stopped at its memory limit of {req.get('memory_mb')} MB (DuckDB's share of "
            f"it, {req['config'].get('memory_limit')}, is full and it does not spill to disk); "
            f"{MEMORY_HINT}") from None
    except duckdb.Error as err:
        raise sql_error(err) from None
    out.write(frame(b"D", json.dumps({"cut_by": cut}).encode()))


if __name__ == "__main__":
    main()
