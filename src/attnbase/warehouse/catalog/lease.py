"""One writer per run: a lease in the catalog (``run_leases``), held while a process writes a run.

``run_leases(run_id, pid, host, purpose, config_hash, token, acquired_at, heartbeat_at)``: one
row per run being written (``extract``, ``compact``, ``analyze``). :func:`acquire` takes it in
one catalog transaction, or finds it held and then either waits for it (``wait=True``) or
refuses in one line naming the holder (:class:`~attnbase.errors.RunBusyError`). A lease whose
holder is dead is taken over: on the same host, when its PID no longer runs; elsewhere, when
its heartbeat (renewed every :data:`HEARTBEAT_S` by a thread of the holder) is older than
:data:`STALE_S`. The holder's own process may take it again (a resumed writer of one process).
Two extractions of one new run with different settings: the one that does not hold the lease
gets the one-line configuration conflict.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
import uuid
import weakref
from datetime import datetime, timezone

import psutil

from attnbase.errors import RunBusyError, RunConfigConflictError

TABLE = "run_leases"
DDL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    run_id VARCHAR PRIMARY KEY,
    pid INTEGER NOT NULL,
    host VARCHAR NOT NULL,
    purpose VARCHAR NOT NULL,
    config_hash VARCHAR,
    token VARCHAR NOT NULL,
    acquired_at TIMESTAMP NOT NULL,
    heartbeat_at TIMESTAMP NOT NULL
)
"""
#: Seconds between two heartbeats of a holder; a holder on another host whose heartbeat is
#: older than :data:`STALE_S` is taken for dead.
HEARTBEAT_S = 10.0
STALE_S = 60.0
#: Seconds between two looks at a held lease while waiting for it.
POLL_S = 0.5


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _host() -> str:
    return socket.gethostname()


def pid_gone(pid: int | str) -> bool:
    """Whether ``pid`` (a number or its text) names a process of this host that no longer
    runs: what a lease, or a file named after its maker's PID, is left over from. False for
    text that is no PID and for this process."""
    text = str(pid)
    return text.isdigit() and int(text) != os.getpid() and not psutil.pid_exists(int(text))


def holder_dead(row: dict) -> bool:
    """Whether the holder of lease ``row`` no longer runs: on this host, its PID is gone;
    elsewhere, its heartbeat is older than :data:`STALE_S` (``row["age_s"]`` where the catalog
    server measured the age by its own clock, else this host's clock)."""
    if row["host"] == _host():
        return pid_gone(row["pid"])
    age = row.get("age_s")
    if age is None:
        age = (_now() - row["heartbeat_at"]).total_seconds()
    return age > STALE_S


def describe(row: dict) -> str:
    """``PID 123 on host (extract since 22:41:03 UTC)``."""
    acquired = row["acquired_at"]
    if acquired.tzinfo is not None:
        acquired = acquired.astimezone(timezone.utc)
    since = acquired.strftime("%H:%M:%S")
    return f"PID {row['pid']} on {row['host']} ({row['purpose']} since {since} UTC)"


def holder(db, run_id: str) -> dict | None:
    """The live lease of ``run_id`` (None: nobody writes it)."""
    if not db.exists():
        return None
    with db.connect(read_only=True, stats=False) as con:
        row = _row(con, run_id)
    return None if row is None or holder_dead(row) else row


def _row(con, run_id: str) -> dict | None:
    try:
        cur = con.execute(f"SELECT * FROM {TABLE} WHERE run_id = ?", [run_id])
    except Exception:  # a catalog some migration has not reached (opened read-only)
        return None
    r = cur.fetchone()
    return None if r is None else dict(zip([d[0] for d in cur.description], r))


#: leases of this process whose heartbeat thread may still run
_LIVE: "weakref.WeakSet[Lease]" = weakref.WeakSet()
#: how long interpreter exit waits for a heartbeat in progress
EXIT_JOIN_S = 5.0


def stop_heartbeats() -> None:
    """Stop every heartbeat thread of this process and wait for a beat in progress (at
    interpreter exit, ``atexit``). A daemon thread still inside DuckDB when the interpreter
    finalises is ended by ``pthread_exit`` through DuckDB's C++ frames, which aborts the whole
    process (exit 134, "FATAL: exception not rethrown"); an unreleased lease stays in the
    catalog and is taken over as its holder's PID is gone (:func:`holder_dead`)."""
    for lease in list(_LIVE):
        lease._stop.set()
    for lease in list(_LIVE):
        lease._beat.join(EXIT_JOIN_S)


atexit.register(stop_heartbeats)


class Lease:
    """A held lease; :meth:`release` (or a context manager's exit) gives it back."""

    def __init__(self, db, run_id: str, token: str) -> None:
        self.db, self.run_id, self.token = db, run_id, token
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True,
                                      name=f"attnbase-lease-{run_id}")
        _LIVE.add(self)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._renew()
            except Exception:  # the catalog busy for a moment: the next beat renews it
                pass

    def _renew(self) -> None:
        with self.db.transaction(stats=False) as con:
            con.execute(f"UPDATE {TABLE} SET heartbeat_at = ? WHERE run_id = ? AND "
                        "token = ?", [_now(), self.run_id, self.token])

    def _delete(self) -> None:
        with self.db.transaction(stats=False) as con:
            con.execute(f"DELETE FROM {TABLE} WHERE run_id = ? AND token = ?",
                        [self.run_id, self.token])

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self._delete()
        except Exception:  # the catalog gone or busy: the lease dies with this process
            pass

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(db, run_id: str, purpose: str, *, wait: bool = False,
            config_hash: str | None = None, timeout: float | None = None) -> Lease:
    """Take ``run_id``'s lease for ``purpose``; see the module docstring. ``wait``: poll until
    the holder gives it back (``timeout`` seconds at most, None: no limit)."""
    token = uuid.uuid4().hex
    me, host = os.getpid(), _host()

    def take() -> dict | None:
        with db.transaction(stats=False) as con:
            row = _row(con, run_id)
            if not may_take(row):
                return row
            now = _now()
            con.execute(f"DELETE FROM {TABLE} WHERE run_id = ?", [run_id])
            con.execute(f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [run_id, me, host, purpose, config_hash, token, now, now])
            return None

    take_turns(run_id, take, wait=wait, config_hash=config_hash, timeout=timeout)
    return Lease(db, run_id, token)


def may_take(row: dict | None) -> bool:
    """Whether this process may take the lease ``row`` (None: nobody holds it): its holder is
    dead, or is this process."""
    return (row is None or holder_dead(row)
            or (row["pid"] == os.getpid() and row["host"] == _host()))


def take_turns(run_id: str, take, *, wait: bool, config_hash: str | None,
               timeout: float | None) -> None:
    """Call ``take()`` until it takes the lease (returns None; else it returns the holder's
    row): a holder with other settings is a :class:`RunConfigConflictError` at once, a busy
    one a :class:`RunBusyError` unless ``wait`` (``timeout`` seconds at most, None: no
    limit). Every backend's ``acquire`` goes through here."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        row = take()
        if row is None:
            return
        if (config_hash is not None and row.get("config_hash") is not None
                and row["config_hash"] != config_hash):
            raise RunConfigConflictError(
                f"run {run_id!r} is being extracted by {describe(row)} with other settings "
                f"(config {row['config_hash'][:12]}, yours {config_hash[:12]}); use another "
                f"--run, or --overwrite once it has finished")
        if not wait or (deadline is not None and time.monotonic() >= deadline):
            raise RunBusyError(
                f"run {run_id!r} is being written by {describe(row)}; wait for it to finish "
                "(--wait waits), or stop that process")
        time.sleep(POLL_S)
