"""The one watchdog of a running DuckDB query: a time limit and Ctrl-C, by interrupting the
query's own connection.

DuckDB has no statement timeout (docs/toolchain.md). :func:`run_limited` runs the query's work in a worker
thread while the calling thread watches it; when the time limit passes, ``cancel`` is set (a
server shutting down) or the calling thread gets ``KeyboardInterrupt`` (Ctrl-C in ``attnbase
sql``), it calls ``con.interrupt()`` and keeps calling it every :data:`RESEND_S` until the work
returns: an interrupt that arrives before DuckDB starts executing is cleared and dropped, so one
call is not enough. Only that connection is interrupted; every other query of the process runs on.

Used by :mod:`attnbase.warehouse.sandbox.sql` (``attnbase sql --timeout-ms``) and the service's
``POST /api/sql`` alike.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

from attnbase import interrupt
from attnbase.errors import QueryInterrupted, QueryLimitError

T = TypeVar("T")

#: Seconds between two interrupts sent to a query that should stop.
RESEND_S = 0.005
#: Seconds the watching thread waits between checks of the deadline (and of Ctrl-C).
POLL_S = 0.02
#: Seconds of re-sending after which a query that ignores interrupts is left to its thread (a
#: daemon): the caller gets its error; nothing more can be done from Python.
GIVE_UP_S = 30.0


class _Outcome:
    __slots__ = ("value", "error", "done")

    def __init__(self) -> None:
        self.value = None
        self.error: BaseException | None = None
        self.done = threading.Event()


def _stop(con, out: _Outcome) -> None:
    """Interrupt ``con`` until the work returns (bounded by :data:`GIVE_UP_S`)."""
    give_up = time.monotonic() + GIVE_UP_S
    while True:
        try:
            con.interrupt()
            if out.done.wait(RESEND_S) or time.monotonic() > give_up:
                return
        except KeyboardInterrupt:  # a second Ctrl-C: we are stopping already
            continue


def run_limited(con, work: Callable[[], T], *, timeout_s: float | None = None,
                cancel: threading.Event | None = None, limit_name: str = "time limit") -> T:
    """``work()`` (which runs queries on ``con``) stopped after ``timeout_s`` seconds, when
    ``cancel`` is set, or on Ctrl-C of the calling thread.

    Raises :class:`QueryLimitError` (the time limit or ``cancel``; the message names
    ``limit_name`` and the limit in ms) or :class:`QueryInterrupted` (Ctrl-C); any other
    error of ``work`` propagates unchanged.
    """
    out = _Outcome()

    def body() -> None:
        try:
            out.value = work()
        except BaseException as err:  # handed to the watching thread
            out.error = err
        finally:
            out.done.set()

    started = time.monotonic()
    deadline = None if timeout_s is None else started + timeout_s
    worker = threading.Thread(target=body, name="attnbase-query", daemon=True)
    worker.start()
    reason = None
    try:
        while not out.done.wait(POLL_S):
            if interrupt.requested():  # a Ctrl-C DuckDB swallowed before this loop
                reason = "interrupt"
                break
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            if deadline is not None and time.monotonic() >= deadline:
                reason = "time"
                break
    except KeyboardInterrupt:
        reason = "interrupt"
    if reason is not None:
        _stop(con, out)
    if out.error is None and out.done.is_set():
        return out.value  # finished before the interrupt took hold
    if reason is not None:
        raise stop_error(reason, (time.monotonic() - started) * 1000, timeout_s, limit_name)
    assert out.error is not None
    raise out.error


def stop_error(reason: str, elapsed_ms: float, timeout_s: float | None,
               limit_name: str = "time limit") -> QueryLimitError | QueryInterrupted:
    """The one-line error of a query stopped for ``reason`` ('interrupt', 'cancelled' or
    'time') after ``elapsed_ms``."""
    if reason == "interrupt":
        return QueryInterrupted(f"query interrupted (Ctrl-C) after {elapsed_ms:.0f} ms; "
                                "nothing was changed")
    if reason == "cancelled":
        return QueryLimitError("query stopped: the server is shutting down")
    return QueryLimitError(
        f"query stopped at its {limit_name} of {timeout_s * 1000:.0f} ms (ran "
        f"{elapsed_ms:.0f} ms); narrow it (WHERE run_id = ..., LIMIT) or ask for a longer "
        "limit")
