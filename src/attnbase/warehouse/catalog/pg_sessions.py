"""The PostgreSQL sessions one process keeps for a team database: the write lock's and the
ledger's (:class:`KeptSessions`).

Opening a connection (TCP, authentication) cost 6.7-9 ms a transaction; a kept one costs a
round trip. Idle connections are kept per process and address, and a connection is kept only
when it is idle outside a transaction. A kept connection the server dropped (a restart) is
replaced by a new one once, before anything is sent on it that could be half done.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

#: the advisory lock every writing transaction of a team database's catalog holds
WRITE_LOCK_KEY = "hashtext('attnbase:catalog-write')"


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


class KeptSessions:
    """The idle connections of this process for the team database ``address``; ``connect()``
    makes a new one (autocommit, transient faults retried)."""

    _pools: dict = {}  # (pid, address) -> idle connections
    _guard = threading.Lock()

    def __init__(self, address: str, connect: Callable) -> None:
        self.address = address
        self.connect = connect

    def _idle(self) -> list:
        return self._pools.setdefault((os.getpid(), self.address), [])

    def idle_pids(self) -> list[int]:
        """The server PIDs of the sessions kept idle now."""
        with self._guard:
            return [c.info.backend_pid for c in self._idle() if not c.closed]

    def _pop_idle(self):
        """A kept idle connection, or None."""
        with self._guard:
            idle = self._idle()
            return idle.pop() if idle else None

    def take(self):
        """A kept idle connection, else a new one."""
        con = self._pop_idle()
        return con if con is not None else self.connect()

    def keep(self, con) -> None:
        """Keep ``con`` for the next taker, or close it where it is closed, broken or inside a
        transaction."""
        import psycopg

        if con.closed or con.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            con.close()
            return
        with self._guard:
            self._idle().append(con)

    @contextmanager
    def write_lock(self, timeout_s: float, locked: Callable[[], str]) -> Iterator[None]:
        """Hold the write lock (a session advisory lock) for the block, waiting up to
        ``timeout_s``, then :class:`~attnbase.errors.CatalogLockedError` with ``locked()``.
        Each lock held at once has a connection of its own: session locks are reentrant, so
        two threads on one session would not wait for each other."""
        import psycopg

        from attnbase.errors import CatalogLockedError

        sql = (f"SET lock_timeout = '{max(1, int(timeout_s * 1000))}ms'; "
               f"SELECT pg_advisory_lock({WRITE_LOCK_KEY})")
        con = self._pop_idle()
        try:
            if con is not None:
                try:
                    con.execute(sql)
                except psycopg.errors.LockNotAvailable:
                    raise
                except psycopg.Error:  # dropped by the server: a new one
                    con.close()
                    con = None
            if con is None:
                con = self.connect()
                con.execute(sql)
        except psycopg.errors.LockNotAvailable:
            self.keep(con)
            raise CatalogLockedError(locked()) from None
        except BaseException:
            if con is not None:
                con.close()
            raise
        try:
            yield
        finally:
            try:
                con.execute(f"SELECT pg_advisory_unlock({WRITE_LOCK_KEY})")
            except psycopg.Error:
                con.close()  # the lock goes with the session
            self.keep(con)

    @contextmanager
    def transaction(self, went_away: Callable[[str], Exception]) -> Iterator:
        """A cursor inside one transaction on a kept connection, committed after the block,
        rolled back if it raises. A connection lost inside it raises ``went_away(reason)``
        (nothing of it committed)."""
        import psycopg

        con = self.take()
        try:
            try:
                con.execute("BEGIN")
            except psycopg.OperationalError:  # a kept connection the server dropped
                con.close()
                con = self.connect()
                con.execute("BEGIN")
            with con.cursor() as cur:
                try:
                    yield cur
                except BaseException:
                    if not con.closed:
                        con.execute("ROLLBACK")
                    raise
            con.execute("COMMIT")
        except psycopg.OperationalError as err:
            con.close()
            raise went_away(_first_line(err)) from None
        finally:
            self.keep(con)
