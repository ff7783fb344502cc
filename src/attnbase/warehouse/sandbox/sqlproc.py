"""User queries in a child process: limits that hold whatever the query does.

DuckDB checks interrupts between vectors, not inside one: ``select range(30000000)`` builds one
30-million-element list (~10 s, ~1.8 GB) and an interrupt sent at 1 s takes effect only when it
is done. A query a user sends (``attnbase sql``, ``POST /api/sql``, the ``/sql`` console)
therefore runs in a query process (:mod:`.querychild`, forked from the zygote or a new
interpreter), which the caller stops with SIGKILL at the query's time limit, at its memory
limit (the process's resident set, read from ``/proc`` every :data:`POLL_S`) or on
Ctrl-C/shutdown; the process's DuckDB has ``memory_limit`` (3/4 of the memory limit),
``threads`` and no spilling, so that its own operators fail cleanly first. The result comes
back as Arrow record batches, each counted against the row and byte caps as it arrives: the
rest is cut (``truncated``).

This module is the caller's side: :class:`QueryProcess` (one process, its limits enforced
from outside) and :class:`QueryPool` (processes reused query after query). The frames on the
pipes are :mod:`.frames`; what runs inside the process is :mod:`.querychild`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from attnbase import errors, interrupt
from attnbase.errors import AttnbaseError, QueryLimitError, WarehouseError
from attnbase.warehouse.sandbox.frames import HEAD, frame
from attnbase.warehouse.sandbox.sqlerrors import MEMORY_HINT
from attnbase.warehouse.sandbox.watchdog import stop_error

#: Seconds between two checks of the deadline, the memory and the cancel event.
POLL_S = 0.02
#: Seconds a new query process may take to import what it needs.
START_S = 30.0
#: Seconds a stopped query's answer waits for its process to exit (its memory returned).
STOP_WAIT_S = 0.5
#: Seconds a query process may take to open the catalog (or a snapshot of it) before the
#: query's own time starts.
OPEN_S = 10.0
#: The module a query process runs (``python -m``) and its function the zygote's children call.
CHILD_MODULE = "attnbase.warehouse.sandbox.querychild"
CHILD_TARGET = f"{CHILD_MODULE}:serve"


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
                [sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
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
        while len(head) < HEAD.size:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            chunk = os.read(fd, HEAD.size - len(head)) if ready else b""
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
            self.proc.stdin.write(frame(b"Q", req))
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
        while len(buf) >= HEAD.size:
            kind, n = HEAD.unpack_from(buf)
            if len(buf) < HEAD.size + n:
                return None
            payload = bytes(buf[HEAD.size:HEAD.size + n])
            del buf[:HEAD.size + n]
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


#: What the zygote imports before it forks query processes (:func:`.querychild.serve`'s own
#: imports).
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
        self._zygote = Zygote(CHILD_TARGET, ZYGOTE_PRELOAD) if fork else None
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

