"""The ledger: which batches of a run are complete (``batches``) and which statistics files
readers see (``stat_files``), written through one small interface with one class per backend.

A :class:`Ledger` is one open writing transaction over those two tables
(:meth:`CatalogBackend.ledger <attnbase.warehouse.catalog.backend.CatalogBackend.ledger>`):
everything done through it becomes visible to readers at its commit, or not at all.

* :class:`DuckLedger`: the embedded catalog, SQL on its DuckDB connection (the tables are the
  catalog's own; :mod:`attnbase.warehouse.catalog.statledger`);
* :class:`attnbase.warehouse.catalog.pg_ledger.PgLedger`: a team database, plain PostgreSQL
  tables beside DuckLake's, so that a batch mark is one short PostgreSQL transaction that no
  other writer waits for (DuckLake commits take turns: benchmarks/RESULTS.md, "A team database").

Readers do not go through a ledger: they read ``batches`` and ``stat_files`` by SQL on any
catalog connection (a team database's lake has views of those names over the PostgreSQL
tables).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime
from typing import Iterable, Sequence

from attnbase.warehouse.catalog import statledger
from attnbase.warehouse.catalog.statledger import FileRecord

#: The ledger's tables, in the order a run's rows are removed.
TABLES = ("stat_files", "batches")


class Ledger(ABC):
    """One open ledger transaction (see the module doc)."""

    @abstractmethod
    def listed(self, run_id: str, table: str | None = None) -> list[FileRecord]:
        """The files listed for ``run_id`` (and ``table``), by table and path."""

    @abstractmethod
    def record(self, run_id: str, records: Iterable[FileRecord], *,
               written_at: datetime | None = None) -> None:
        """List ``records``, replacing rows of the same paths; ``written_at``: the rows' time
        (now)."""

    @abstractmethod
    def forget(self, run_id: str, *, batches: Sequence[int] | None = None,
               paths: Sequence[str] | None = None) -> None:
        """Unlist the files of ``batches`` and/or ``paths`` (neither: every file of the run)."""

    @abstractmethod
    def add_batches(self, run_id: str, rows: Sequence[tuple]) -> None:
        """Replace the run's batches by ``rows``: ``(batch, first_seq, n_seqs)`` (pending) or
        ``(batch, first_seq, n_seqs, status, written_at)``."""

    @abstractmethod
    def set_status(self, run_id: str, batches: Sequence[int], status: str,
                   written_at: datetime | None = None) -> None:
        """Mark ``batches`` ``'complete'`` (at ``written_at``) or ``'pending'``."""

    @abstractmethod
    def complete(self, run_id: str) -> set[int]:
        """The run's complete batches."""

    @abstractmethod
    def delete_run(self, run_id: str) -> None:
        """Remove every ledger row of the run."""


def full_rows(rows: Sequence[tuple]) -> list[tuple]:
    return [tuple(r) if len(r) == 5 else (*r, "pending", None) for r in rows]


class DuckLedger(Ledger):
    """The embedded catalog's ledger: SQL on its open DuckDB transaction ``con`` (also reachable
    as ``execute``, for the tests that put a catalog into a state by hand)."""

    def __init__(self, con) -> None:
        self.con = con

    def execute(self, *args):
        return self.con.execute(*args)

    def listed(self, run_id, table=None):
        return statledger.listed(self.con, run_id, table)

    def record(self, run_id, records, *, written_at=None):
        statledger.record(self.con, run_id, records, written_at=written_at)

    def forget(self, run_id, *, batches=None, paths=None):
        statledger.forget(self.con, run_id, batches=batches, paths=paths)

    def add_batches(self, run_id, rows):
        self.con.execute("DELETE FROM batches WHERE run_id = ?", [run_id])
        self.con.executemany("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?)",
                             [[run_id, *r] for r in full_rows(rows)])

    def set_status(self, run_id, batches, status, written_at=None):
        self.con.execute("UPDATE batches SET status = ?, written_at = ? "
                         "WHERE run_id = ? AND list_contains(?, batch)",
                         [status, written_at if status == "complete" else None, run_id,
                          [int(b) for b in batches]])

    def complete(self, run_id):
        return {int(b) for (b,) in self.con.execute(
            "SELECT batch FROM batches WHERE run_id = ? AND status = 'complete'",
            [run_id]).fetchall()}

    def delete_run(self, run_id):
        for table in TABLES:
            self.con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
