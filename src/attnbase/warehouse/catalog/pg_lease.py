"""Run leases of a team database: a PostgreSQL table beside the DuckLake catalog, judged by
the server's clock.

``attnbase_run_leases`` has the columns of :data:`attnbase.warehouse.catalog.lease.DDL`, in
PostgreSQL (``timestamptz``). Every heartbeat is the server's ``now()``, and a lease's age is
measured by the server (``now() - heartbeat_at``): a writer whose clock runs ahead or behind
cannot take over a live lease. Takers of one run queue on a transaction-scoped advisory lock,
so two machines never both find a lease free. The rules of who may take a lease are
:mod:`attnbase.warehouse.catalog.lease`'s (a dead PID on the same host, a stale heartbeat
elsewhere, the holder's own process).
"""

from __future__ import annotations

import os
import uuid

from attnbase.warehouse.catalog import lease as rules

TABLE = "attnbase_run_leases"
DDL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    run_id text PRIMARY KEY,
    pid integer NOT NULL,
    host text NOT NULL,
    purpose text NOT NULL,
    config_hash text,
    token text NOT NULL,
    acquired_at timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL
)
"""
_SELECT = (f"SELECT run_id, pid, host, purpose, config_hash, token, acquired_at, heartbeat_at, "
           f"extract(epoch FROM now() - heartbeat_at)::float8 AS age_s FROM {TABLE} "
           "WHERE run_id = %s")


def _row(cur, run_id: str) -> dict | None:
    cur.execute(_SELECT, [run_id])
    r = cur.fetchone()
    return None if r is None else dict(zip([d.name for d in cur.description], r))


def holder(backend, run_id: str) -> dict | None:
    """The live lease of ``run_id`` (None: nobody writes it)."""
    with backend.pg() as pg, pg.cursor() as cur:
        row = _row(cur, run_id)
    return None if row is None or rules.holder_dead(row) else row


class PgLease(rules.Lease):
    """A held lease of a team database (renewed and given back in PostgreSQL)."""

    def __init__(self, backend, run_id: str, token: str) -> None:
        self.backend = backend
        super().__init__(backend, run_id, token)

    def _renew(self) -> None:
        with self.backend.pg() as pg:
            pg.execute(f"UPDATE {TABLE} SET heartbeat_at = now() WHERE run_id = %s AND token = %s",
                       [self.run_id, self.token])

    def _delete(self) -> None:
        with self.backend.pg() as pg:
            pg.execute(f"DELETE FROM {TABLE} WHERE run_id = %s AND token = %s",
                       [self.run_id, self.token])


def acquire(backend, run_id: str, purpose: str, *, wait: bool = False,
            config_hash: str | None = None, timeout: float | None = None) -> PgLease:
    """Take ``run_id``'s lease (:func:`attnbase.warehouse.catalog.lease.acquire`'s rules)."""
    token = uuid.uuid4().hex

    def take() -> dict | None:
        with backend.pg() as pg, pg.transaction(), pg.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"attnbase:{run_id}"])
            row = _row(cur, run_id)
            if not rules.may_take(row):
                return row
            cur.execute(f"DELETE FROM {TABLE} WHERE run_id = %s", [run_id])
            cur.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, %s, %s, %s, %s, now(), now())",
                        [run_id, os.getpid(), rules._host(), purpose, config_hash, token])
            return None

    rules.take_turns(run_id, take, wait=wait, config_hash=config_hash, timeout=timeout)
    return PgLease(backend, run_id, token)
