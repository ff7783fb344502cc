"""User queries in a child process: limits that hold whatever the query does.

DuckDB checks interrupts between vectors, not inside one: ``select range(30000000)`` builds one
30-million-element list (~10 s, ~1.8 GB) and an interrupt sent at 1 s takes effect only when it
is done. A query a user sends (``attnbase sql``, ``POST /api/sql``, the ``/sql`` console)
therefore runs in a query process (``python -m attnbase.warehouse.sandbox.sqlproc``), which the caller
stops with SIGKILL at the query's time limit, at its memory limit (the process's resident set,
read from ``/proc`` every :data:`POLL_S`) or on Ctrl-C/shutdown; the process's DuckDB has
``memory_limit`` (3/4 of the memory limit), ``threads`` and no spilling, so that its own
operators fail cleanly first. The result comes back as Arrow record batches, each counted
against the row and byte caps as it arrives: the rest is cut (``truncated``).

Protocol (pipes): the process says ``R`` (ready) once it has imported what it needs; the caller
writes one request frame (JSON); the process answers ``S`` once connected (the query's time
limit counts from there), frames ``B`` (one record batch as an Arrow IPC stream), then ``D``
(done: ``{"cut_by": ...}``) or ``E`` (an error: its class name and one-line message). A frame is its kind (1 byte), its
length (8 bytes, big-endian) and its payload. A process serves requests one after the other
and keeps its last connection (one snapshot file) open for the next.
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from attnbase import errors, interrupt
from attnbase.errors import (AttnbaseError, QueryLimitError, ReadOnlyViolationError,
                             WarehouseError)
from attnbase.warehouse.sandbox.watchdog import stop_error

#: Seconds between two checks of the deadline, the memory and the cancel event.
POLL_S = 0.02
#: Rows per record batch the process sends.
BATCH_ROWS = 2048
_HEAD = struct.Struct(">cQ")
#: Seconds a new query process may take to import what it needs.
START_S = 30.0
#: Seconds a stopped query's answer waits for its process to exit (its memory returned).
STOP_WAIT_S = 0.5
#: Seconds a query process may take to open the catalog (or a snapshot of it) before the
#: query's own time starts.
OPEN_S = 10.0


@dataclass(frozen=True)
class Limits:
    """The limits of one user query. ``memory_mb``: the query process's resident set (its
    DuckDB's ``memory_limit`` is 3/4 of it); ``max_bytes``: Arrow bytes of the result kept,
    the rest cut; ``max_rows``: rows kept (None: all); ``threads``: DuckDB threads;
    ``nice``: the scheduling niceness a query gets once it has run ``nice_after_s`` (a long
    query yields the CPU to pages; the pool restores its process's priority afterwards)."""

    time_s: float
    memory_mb: int
    max_bytes: int
    max_rows: int | None = None
    threads: int = 1
    nice: int = 10
    nice_after_s: float = 1.0


@dataclass(frozen=True)
class UserResult:
    """A user query's result: ``table`` (at most the caps), ``truncated`` (the query had more;
    ``cut_by`` says which cap: ``rows`` or ``bytes``), ``elapsed_ms``."""

    table: pa.Table
    truncated: bool
    elapsed_ms: float
    cut_by: str | None = None


# --- frames --------------------------------------------------------------------------------
def _frame(kind: bytes, payload: bytes) -> bytes:
    return _HEAD.pack(kind, len(payload)) + payload


def _read_exact(stream, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def sql_error(err) -> WarehouseError:
    """A DuckDB error as attnbase's: its first paragraph on one line; a permission error (a
    file outside the sandbox) as :class:`ReadOnlyViolationError`; a statistics file that
    cannot be read as :class:`~attnbase.errors.StatsFileCorruptError` naming it."""
    import duckdb

    # DuckDB's message and its hints ("Candidate bindings: ...", "Did you mean ...?") form the
    # first paragraph; the query echo with its caret ("LINE 1: ...") follows a blank line
    text = str(err).strip()
    line = "; ".join(ln.strip() for ln in text.split("\n\n")[0].splitlines() if ln.strip()) \
        if text else type(err).__name__
    from attnbase.warehouse.catalog.statledger import damaged_file_error

    damaged = damaged_file_error(err)
    if damaged is not None:  # a statistics file that cannot be read: name it and the fix
        return damaged
    if isinstance(err, duckdb.PermissionException):
        return ReadOnlyViolationError(
            f"attnbase sql reads only the catalog: {line} (file readers, glob, ATTACH and "
            "extension loads are disabled; query the catalog tables)")
    return WarehouseError(f"SQL error: {line}")


# --- the query process ---------------------------------------------------------------------
def _process_main() -> None:
    """The query process: requests from stdin, frames to stdout (nothing else writes there)."""
    from attnbase.warehouse.sandbox.zygote import server_pidfd, watch_parent

    watch_parent(*server_pidfd())  # never outlive the command or server that started it
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # a stray print cannot corrupt the frames
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to act on
    _serve(sys.stdin.buffer, out)


def _serve(inp, out) -> None:
    """Requests from ``inp``, frames to ``out`` (see the module docstring), until ``inp``
    ends."""
    import duckdb  # noqa: F401  imported before the ready frame: a query's time is its own

    import attnbase.warehouse.catalog.duckdb_file  # noqa: F401
    import attnbase.warehouse.database  # noqa: F401

    out.write(_frame(b"R", b""))
    held: dict = {}
    while True:
        head = _read_exact(inp, _HEAD.size)
        if head is None:
            return
        _, n = _HEAD.unpack(head)
        body = _read_exact(inp, n)
        if body is None:
            return
        req = json.loads(body)
        try:
            _serve_one(req, held, out)
        except BrokenPipeError:
            return
        except AttnbaseError as err:
            out.write(_frame(b"E", json.dumps({"kind": type(err).__name__,
                                               "message": str(err)}).encode()))
        except Exception as err:  # noqa: BLE001  the caller reports it, one line
            out.write(_frame(b"E", json.dumps({"kind": "WarehouseError", "message":
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

    con = held["con"]
    listing = held.get("listing") if held.get("fixed") else None
    if listing is None:
        listing = list_stat_files(con)
        if held.get("fixed"):
            held["listing"] = listing
    signature = None
    if held.get("fixed") and listing is not None:
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


#: What to do about a query stopped at its memory limit: the settings that raise it.
MEMORY_HINT = ("narrow it (WHERE run_id = ..., fewer columns, LIMIT) or raise the limit "
               "(attnbase sql --memory-mb N; attnbase serve --setting sql_memory_mb=N)")


def _serve_one(req: dict, held: dict, out) -> None:
    import duckdb

    con = _connection(req, held)
    out.write(_frame(b"S", b""))  # connected: the query's time starts now
    max_rows, max_bytes = req.get("max_rows"), req["max_bytes"]
    rows = nbytes = 0
    cut = None
    try:
        rel = con.sql(req["sql"], params=req.get("params") or None)
        if rel is None:
            out.write(_frame(b"D", json.dumps({"cut_by": None}).encode()))
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
                out.write(_frame(b"B", sink.getvalue().to_pybytes()))
            rows += batch.num_rows
            nbytes += batch.nbytes
            if cut:
                break
        reader.close()  # an unfinished reader holds the database instance (DuckDB 1.5)
        if rows == 0 and cut is None:  # no rows: the schema alone
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, reader.schema):
                pass
            out.write(_frame(b"B", sink.getvalue().to_pybytes()))
    except duckdb.OutOfMemoryException:  # its text advises a PRAGMA the sandbox refuses
        raise QueryLimitError(
            f"query stopped at its memory limit of {req.get('memory_mb')} MB (DuckDB's share of "
            f"it, {req['config'].get('memory_limit')}, is full and it does not spill to disk); "
            f"{MEMORY_HINT}") from None
    except duckdb.Error as err:
        raise sql_error(err) from None
    out.write(_frame(b"D", json.dumps({"cut_by": cut}).encode()))


# --- the caller's side ---------------------------------------------------------------------
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def _rss_mb(statm_fd: int | None) -> float:
    """The resident set of the process whose ``/proc/PID/statm`` is open as ``statm_fd``
    (read again from its start: no open per poll); 0 when unknown."""
    if statm_fd is None:
        return 0.0
    try:
        return int(os.pread(statm_fd, 128, 0).split()[1]) * _PAGE_MB
    except (OSError, ValueError, IndexError):
        return 0.0


class QueryProcess:
    """One query process (see the module docstring); :meth:`run` one query on it. A process
    stopped at a limit is dead (:attr:`alive` False): take another. ``zygote``: a
    :class:`~attnbase.warehouse.sandbox.zygote.Zygote` to fork it from (else a new interpreter)."""

    def __init__(self, cwd: str | Path, zygote=None) -> None:
        # cwd: the database directory. The sandbox allows the statistics directories both as
        # absolute paths under DIR and as relative ones (DuckDB checks a view's relative glob
        # before it resolves it against file_search_path); a relative path must name DIR's.
        if zygote is not None:  # forked, its imports done (attnbase.warehouse.sandbox.zygote)
            self.proc = zygote.fork(cwd)
        else:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "attnbase.warehouse.sandbox.sqlproc"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=str(cwd),
                process_group=0)  # a terminal's Ctrl-C reaches the caller, not the query
        self.niced = False
        self.ready = False
        self._killed = False
        self._lock, self._reap_lock = threading.Lock(), threading.Lock()
        try:
            self._statm: int | None = os.open(f"/proc/{self.proc.pid}/statm", os.O_RDONLY)
        except OSError:  # gone already, or no /proc: the memory limit is DuckDB's own
            self._statm = None

    def wait_ready(self, timeout_s: float = START_S) -> None:
        """Wait for the process's ready frame (its imports done)."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        head = b""
        while len(head) < _HEAD.size:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            chunk = os.read(fd, _HEAD.size - len(head)) if ready else b""
            if not chunk:
                self.kill()
                raise WarehouseError("the query process did not start; retry the query")
            head += chunk
        self.ready = True

    @property
    def alive(self) -> bool:
        return not self._killed and self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, wait_s: float = 5.0) -> None:
        """SIGKILL the process and close its pipes; wait up to ``wait_s`` for it to exit, then
        leave the rest of the wait to a daemon thread."""
        with self._lock:
            first, self._killed = not self._killed, True
            if first:
                if self.proc.poll() is None:
                    self.proc.kill()
                if self._statm is not None:
                    os.close(self._statm)
                    self._statm = None
                for f in (self.proc.stdin, self.proc.stdout):
                    try:
                        f.close()
                    except OSError:
                        pass
        if not self._reap(wait_s) and first:
            threading.Thread(target=self._reap, args=(5.0,), name="attnbase-query-reap",
                             daemon=True).start()

    def _reap(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for the killed process to exit (one waiter at a time: a
        pidfd is closed once); whether it has."""
        if not self._reap_lock.acquire(timeout=wait_s):
            return False
        try:
            self.proc.wait(wait_s)
            return True
        except subprocess.TimeoutExpired:
            return False
        finally:
            self._reap_lock.release()

    def unnice(self) -> bool:
        """Give a process niced by a long query the caller's priority back; False where that
        is not allowed (lowering a niceness needs the privilege)."""
        if self.niced:
            try:
                os.setpriority(os.PRIO_PROCESS, self.pid, os.getpriority(os.PRIO_PROCESS, 0))
            except OSError:
                return False
            self.niced = False
        return True

    def stop(self) -> None:
        """Stop a running query: its process gets the caller's priority back where allowed
        (a process niced by a long query took 0.04-1.1 s to act on SIGKILL under load; else
        it dies at its own pace), is killed, and is waited for at most :data:`STOP_WAIT_S`
        (then a daemon thread waits)."""
        self.unnice()
        self.kill(STOP_WAIT_S)

    def run(self, sql: str, *, db: str, file: str | None, config: dict, limits: Limits,
            params=None, cancel: threading.Event | None = None,
            damaged: dict | None = None) -> UserResult:
        """The query's result within ``limits``; :class:`QueryLimitError` naming the limit
        that stopped it (the process is then killed), :class:`QueryInterrupted` on Ctrl-C.
        ``damaged``: statistics files (relative path -> message) the views leave out."""
        t0 = time.monotonic()
        if not self.ready:
            try:
                self.wait_ready()
            except KeyboardInterrupt:  # Ctrl-C while the process starts
                self.kill()
                raise stop_error("interrupt", (time.monotonic() - t0) * 1000,
                                 limits.time_s) from None
            t0 = time.monotonic()
        conf = {**config, "memory_limit": f"{max(16, limits.memory_mb * 3 // 4)}MB",
                "threads": limits.threads, "max_temp_directory_size": "0B"}
        req = json.dumps({"db": db, "file": file, "sql": sql, "params": params,
                          "config": conf, "max_rows": limits.max_rows,
                          "memory_mb": limits.memory_mb,
                          "max_bytes": limits.max_bytes, "damaged": damaged or None}).encode()
        try:
            self.proc.stdin.write(_frame(b"Q", req))
            self.proc.stdin.flush()
        except OSError:
            self.kill()
            raise WarehouseError("the query process ended; retry the query") from None
        deadline = t0 + limits.time_s + OPEN_S  # until the process says it has connected
        started = [None]
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        batches: list = []
        reason = None
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], POLL_S)
                if ready:
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        self.kill()
                        raise WarehouseError("the query process ended unexpectedly (out of "
                                             "memory?); narrow the query")
                    buf += chunk
                    done = self._frames(buf, batches, started)
                    if started[0] is not None and deadline > started[0] + limits.time_s:
                        t0, deadline = started[0], started[0] + limits.time_s
                    if done is not None:
                        return self._result(done, batches, t0)
                now = time.monotonic()
                if limits.nice and not self.niced and now - t0 >= limits.nice_after_s:
                    try:
                        os.setpriority(os.PRIO_PROCESS, self.pid, limits.nice)
                    except OSError:
                        pass
                    self.niced = True  # the pool restores its priority before reusing it
                if interrupt.requested():  # a Ctrl-C DuckDB swallowed before this loop
                    reason = "interrupt"
                elif cancel is not None and cancel.is_set():
                    reason = "cancelled"
                elif now >= deadline:
                    reason = "time"
                elif _rss_mb(self._statm) > limits.memory_mb:
                    reason = "memory"
                if reason:
                    break
        except KeyboardInterrupt:
            reason = "interrupt"
        self.stop()
        ms = (time.monotonic() - t0) * 1000
        if reason == "memory":
            raise QueryLimitError(
                f"query stopped at its memory limit of {limits.memory_mb} MB (ran {ms:.0f} ms); "
                f"{MEMORY_HINT}")
        raise stop_error(reason, ms, limits.time_s)

    @staticmethod
    def _frames(buf: bytearray, batches: list, started: list):
        """Consume the whole frames of ``buf``: batches appended; ``S`` (connected) noted in
        ``started[0]``; the ``D`` frame's dict returned; an ``E`` frame raised as its error
        class."""
        while len(buf) >= _HEAD.size:
            kind, n = _HEAD.unpack_from(buf)
            if len(buf) < _HEAD.size + n:
                return None
            payload = bytes(buf[_HEAD.size:_HEAD.size + n])
            del buf[:_HEAD.size + n]
            if kind == b"S":
                started[0] = time.monotonic()
            elif kind == b"B":
                batches.append(pa.ipc.open_stream(payload).read_all())
            elif kind == b"D":
                return json.loads(payload)
            else:
                e = json.loads(payload)
                cls = getattr(errors, e.get("kind", ""), None)
                if not (isinstance(cls, type) and issubclass(cls, AttnbaseError)):
                    cls = WarehouseError
                raise cls(e.get("message", "query failed"))
        return None

    @staticmethod
    def _result(done: dict, tables: list, t0: float) -> UserResult:
        table = pa.concat_tables(tables) if tables else pa.table({})
        return UserResult(table, done.get("cut_by") is not None,
                          (time.monotonic() - t0) * 1000, done.get("cut_by"))


#: What the zygote imports before it forks query processes (``_serve``'s own imports).
ZYGOTE_PRELOAD = ("duckdb", "pyarrow", "attnbase.warehouse.database",
                  "attnbase.warehouse.catalog.duckdb_file")


class QueryPool:
    """A fixed set of at most ``size`` query processes, reused query after query (a new
    interpreter pays for its imports and its first catalog open, on the cores the pages need;
    benchmarks/RESULTS.md: "query process start"), forked from a zygote unless ``fork`` is
    False. :meth:`fill` starts them ahead of the first query; a
    query takes an idle one, or starts one while fewer than ``size`` exist, or else waits
    for one (callers bound their concurrency to ``size``, so it does not wait in practice).
    A process is replaced only when it is gone: stopped at a limit, or niced by a long query
    whose priority cannot be restored. :attr:`started` counts the processes started."""

    def __init__(self, size: int, cwd: str | Path, *, fork: bool = True) -> None:
        from attnbase.warehouse.sandbox.zygote import Zygote

        self.size, self.cwd = max(1, size), Path(cwd).resolve()
        self._zygote = Zygote(f"{__name__}:_serve", ZYGOTE_PRELOAD) if fork else None
        self._idle: list[QueryProcess] = []
        self._count = 0  # processes of this pool: idle, running a query, or starting
        self._cond = threading.Condition()
        self._closed = False
        self.started = 0

    def _new(self) -> QueryProcess:
        """A new process (counted in :attr:`_count` by the caller); its ready frame awaited."""
        try:
            p = QueryProcess(self.cwd, self._zygote)
            self.started += 1
            p.wait_ready()
            return p
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def fill(self, n: int | None = None) -> None:
        """Start processes, on a thread of their own (non-blocking), until the pool holds
        ``n`` (default and at most ``size``)."""
        n = self.size if n is None else min(n, self.size)

        def start():
            while True:
                with self._cond:
                    if self._closed or self._count >= n:
                        return
                    self._count += 1
                try:
                    p = self._new()
                except (WarehouseError, OSError):
                    return
                self._give_back(p)

        threading.Thread(target=start, name="attnbase-query-pool", daemon=True).start()

    def _take(self) -> QueryProcess:
        deadline = time.monotonic() + START_S
        with self._cond:
            while True:
                while self._idle:
                    p = self._idle.pop()
                    if p.alive:
                        return p
                    p.kill(0)
                    self._count -= 1
                if self._count < self.size:
                    self._count += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WarehouseError("no query process became free in time; retry the query")
                self._cond.wait(left)
        return self._new()

    def _give_back(self, p: QueryProcess) -> None:
        with self._cond:
            if p.alive and not self._closed:
                self._idle.append(p)
                self._cond.notify()
                return
            self._count -= 1
            self._cond.notify()
        p.kill(0)

    def run(self, sql: str, **kwargs) -> UserResult:
        proc = self._take()
        try:
            return proc.run(sql, **kwargs)
        finally:
            if proc.alive and not proc.unnice():  # a niceness it cannot lose: replace it
                proc.kill(0)
            replace = not proc.alive
            self._give_back(proc)
            if replace:
                self.fill()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for p in idle:  # all signalled first, then reaped
            if p.alive:
                p.proc.kill()
        for p in idle:
            p.kill()
        if self._zygote is not None:
            self._zygote.close()


if __name__ == "__main__":
    _process_main()
