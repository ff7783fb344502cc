"""A query process dies with its server (issue 44, item 12): ``attnbase serve`` killed with
SIGKILL (as the OOM killer does) in the middle of a long query leaves no query process
running; before, the process (re-parented to PID 1) kept computing at full CPU."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from serve_fixtures import Server

RUNAWAY = "SELECT sum(hash(i)) AS s FROM range(100000000000) t(i)"  # minutes on one thread


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_server_killed_mid_query_takes_its_query_process_along(tmp_path, serve_db):
    import httpx

    srv = Server(serve_db, "--sql-time-limit-ms", "120000")
    busy: list[int] = []
    try:
        zygotes = [p for p in _children(srv.proc.pid)
                   if b"sandbox.zygote" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(zygotes) == 1, zygotes
        def ask() -> None:
            try:
                httpx.post(srv.url + "/api/sql", json={"sql": RUNAWAY}, timeout=60)
            except httpx.HTTPError:  # the server is killed under it
                pass

        threading.Thread(target=ask, daemon=True).start()
        deadline = time.monotonic() + 20
        while not busy and time.monotonic() < deadline:  # the process that is computing
            time.sleep(0.5)
            busy = [p for p in _children(zygotes[0]) if _alive(p) and _cpu_s(p) > 0.5]
        assert busy, "no query process started computing"  # control: the query runs
        cpu0 = _cpu_s(busy[0])
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(5)
        gone_at = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            if not any(_alive(p) for p in busy + zygotes):
                gone_at = time.monotonic() - t0
                break
            time.sleep(0.05)
        print(f"query process gone {gone_at} s after the server's SIGKILL")
        assert gone_at is not None, (
            f"query process {busy} still alive 5 s after its server's SIGKILL "
            f"(cpu {cpu0:.1f} s -> {_cpu_s(busy[0]):.1f} s)")
    finally:
        for p in busy:  # never leave a runaway behind, whatever the outcome
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        srv.stop()


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def test_the_command_killed_mid_query_takes_its_query_process_along(serve_db):
    """The same for ``attnbase sql`` (its query process is a child of the command)."""
    import subprocess

    from serve_fixtures import ATTNBASE

    proc = subprocess.Popen([str(ATTNBASE), "sql", "--db", str(serve_db), "--timeout-ms",
                             "120000", RUNAWAY], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    busy: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while not busy and time.monotonic() < deadline:
            time.sleep(0.5)
            busy = [p for p in _descendants(proc.pid) if _alive(p) and _cpu_s(p) > 0.5]
        assert busy, "no query process started computing"  # control: the query runs
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        t0 = time.monotonic()
        while any(_alive(p) for p in busy) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert not any(_alive(p) for p in busy), f"query process {busy} outlived its command"
    finally:
        for p in busy:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
