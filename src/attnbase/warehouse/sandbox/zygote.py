"""Query processes forked from a zygote, started faster than a new interpreter
(benchmarks/RESULTS.md: "query process start").

A new query process (``python -m attnbase.warehouse.sandbox.querychild``) spends CPU importing
DuckDB, pyarrow and attnbase before it can run a query; a server that replaces a process
stopped at a limit pays it again, under load, on the cores its pages need. A :class:`Zygote`
(``python -m attnbase.warehouse.sandbox.zygote FD TARGET PRELOAD``) imports the modules ``PRELOAD``
names and ``TARGET`` (``module:function``) once, with no DuckDB connection and no thread of its
own, then forks one child per request, which calls ``function(inp, out)``: it starts with the
imports done and shares the zygote's pages until it writes them.

Protocol (a Unix socket pair of whole messages): the zygote sends ``R`` once imported; each
request is the child's working directory with two descriptors (SCM_RIGHTS: the child's
request pipe to read and its answer pipe to write); the zygote answers with the child's PID
(8 bytes, big-endian). The children are not the caller's: :class:`Forked` watches one through
a pidfd (its exit, its SIGKILL without the risk of a reused PID). The zygote reaps them and
ends when its socket closes (its server gone); each child watches the server's pidfd (opened
by the zygote at its start, inherited) and kills itself when the server is gone, also in the
middle of a query (:func:`watch_parent`).

Kept in place of multiprocessing's ``forkserver`` context, which does the same job more slowly:
with the same preload and the same child, a child of the fork server sends its ready frame
several times later than one of the zygote (it unpickles its process object and runs
multiprocessing's bootstrap first; benchmarks/RESULTS.md: "a query process replaced,
multiprocessing's forkserver").
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

_PID = struct.Struct(">q")
#: Seconds the zygote may take to import what its children need.
START_S = 30.0


def watch_parent(pidfd: int | None, ppid: int) -> None:
    """End this process (SIGKILL) as soon as its server is gone, whatever it is doing: a query
    process must not outlive the server that started it (a server killed by the OOM killer
    left its running query at 90 % CPU, re-parented to PID 1). ``pidfd``: the server's
    (:func:`os.pidfd_open`, readable once it exits; immune to a reused PID); where there is
    none, ``ppid`` is polled against :func:`os.getppid` every 0.2 s. A daemon thread."""

    def watch() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            import time

            while os.getppid() == ppid:
                time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="attnbase-server-watch", daemon=True).start()


def server_pidfd() -> tuple[int | None, int]:
    """``(pidfd, pid)`` of this process's parent, the server (pidfd None where the kernel has
    none). (A parent that died before this looked leaves a pipe or socket that is closed
    already: the process ends at its first read.)"""
    ppid = os.getppid()
    try:
        fd: int | None = os.pidfd_open(ppid)
    except (AttributeError, OSError):
        fd = None
    return fd, ppid


def _child(serve, cwd: str, inp_fd: int, out_fd: int, server: tuple) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    watch_parent(*server)  # the zygote's server (its pidfd inherited across the fork)
    os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the caller, not the query; the same session
    os.chdir(cwd)
    serve(os.fdopen(inp_fd, "rb", buffering=0), os.fdopen(out_fd, "wb", buffering=0))


def _zygote_main(fd: int, target: str, preload: str) -> None:
    """Import ``preload`` (comma-separated modules) and ``target`` (``module:function``),
    then fork one child per request that calls ``function(inp, out)``."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel
    server = server_pidfd()  # the server, whose exit ends every child (watch_parent)
    for name in filter(None, preload.split(",")):
        importlib.import_module(name)
    module, _, func = target.partition(":")
    serve = getattr(importlib.import_module(module), func)

    sock = socket.socket(fileno=fd)
    sock.sendall(b"R")
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 2)
        except OSError:
            return
        if not msg or len(fds) != 2:
            return
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                sock.close()
                _child(serve, msg.decode(), *fds, server)
            except BaseException:  # noqa: BLE001  the caller sees the pipe close
                code = 1
            os._exit(code)
        for f in fds:
            os.close(f)
        sock.sendall(_PID.pack(pid))


class Zygote:
    """One zygote process (started on first use, again if it died) that imports ``preload``
    and ``target`` (``module:function``); :meth:`fork` a child in ``cwd`` that calls
    ``function(inp, out)`` on its request and answer pipes."""

    def __init__(self, target: str, preload: tuple[str, ...] = ()) -> None:
        self.target, self.preload = target, preload
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._closed = False

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # whole messages
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "attnbase.warehouse.sandbox.zygote", str(theirs.fileno()),
                 self.target, ",".join(self.preload)],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                process_group=0)
        finally:
            theirs.close()
        ours.settimeout(START_S)
        try:
            ok = ours.recv(1) == b"R"
        except OSError:
            ok = False
        if not ok:
            ours.close()
            self._stop()
            from attnbase.errors import WarehouseError

            raise WarehouseError("the query processes' zygote did not start; retry the query")
        ours.settimeout(None)
        self._sock = ours

    def fork(self, cwd: str | Path) -> "Forked":
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            with self._lock:
                if self._closed:
                    raise OSError("the query processes' zygote was closed")
                for attempt in (0, 1):  # a zygote that died meanwhile: one new one
                    if self._sock is None:
                        self._start()
                    try:
                        socket.send_fds(self._sock, [str(cwd).encode()], [req_r, res_w])
                        raw = b""
                        while len(raw) < _PID.size:
                            chunk = self._sock.recv(_PID.size - len(raw))
                            if not chunk:
                                raise OSError("zygote gone")
                            raw += chunk
                        break
                    except OSError:
                        self._stop()
                        if attempt:
                            raise
            pid = _PID.unpack(raw)[0]
        finally:
            os.close(req_r)  # the child's ends: only the child holds them now
            os.close(res_w)
        return Forked(pid, req_w, res_r)

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(5)
            self._proc = None

    def close(self) -> None:
        """Stop the zygote, also while another thread waits for it to start (that thread's
        fork then fails)."""
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        with self._lock:
            self._stop()


class Forked:
    """A query process forked by the zygote, with the surface of :class:`subprocess.Popen`
    that :class:`~attnbase.warehouse.sandbox.sqlproc.QueryProcess` uses (``stdin``, ``stdout``,
    ``pid``, ``poll``, ``kill``, ``wait``), through a pidfd."""

    def __init__(self, pid: int, stdin_fd: int, stdout_fd: int) -> None:
        self.pid = pid
        self.stdin = os.fdopen(stdin_fd, "wb", buffering=0)
        self.stdout = os.fdopen(stdout_fd, "rb", buffering=0)
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # gone already
            self._pidfd = None
        self.returncode = None if self._pidfd is not None else -signal.SIGKILL

    def poll(self):
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self._gone()
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("attnbase query process", timeout)
            self._gone()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _gone(self) -> None:
        self.returncode = -signal.SIGKILL  # reaped by the zygote: its status is not ours
        os.close(self._pidfd)
        self._pidfd = None


if __name__ == "__main__":
    _zygote_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
