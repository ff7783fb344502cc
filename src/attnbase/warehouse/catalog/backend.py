"""What the rest of attnbase needs from a catalog: one small interface, one class per backend.

A database is its catalog (the tables of docs/architecture.md, behind :class:`CatalogBackend`)
plus its runs' bytes (:mod:`attnbase.warehouse.runs`). Everything above the catalog reaches it
through these operations only, by way of :class:`~attnbase.warehouse.database.Database` (which
delegates to its backend) or ``Database.catalog``:

* :meth:`~CatalogBackend.connect` a short-lived connection, read-only or writing, and
  :meth:`~CatalogBackend.open` one that the caller keeps (a query process, the service);
* :meth:`~CatalogBackend.transaction` a writing transaction, and :meth:`~CatalogBackend.ledger`
  the one that changes which batches are complete and which statistics files readers see
  (:mod:`attnbase.warehouse.catalog.ledger`: SQL on the embedded catalog, PostgreSQL tables of
  their own for a team);
* :meth:`~CatalogBackend.migrate` / :meth:`~CatalogBackend.ensure_migrated` the schema
  (:mod:`attnbase.warehouse.catalog.migrations`);
* :meth:`~CatalogBackend.acquire_lease` / :meth:`~CatalogBackend.lease_holder` one writer per
  run (:mod:`attnbase.warehouse.catalog.lease`);
* :meth:`~CatalogBackend.damaged_tables` the catalog's own tables that fail their checksums
  (``attnbase verify``);
* ``lock_timeout``: how long an operation waits for a catalog another writer holds, the one
  retry policy of the write path, before :class:`~attnbase.errors.CatalogLockedError`.

The embedded default is one DuckDB file in the database directory
(:class:`~attnbase.warehouse.catalog.duckdb_file.DuckDBFileBackend`);
:func:`attnbase.warehouse.catalog.catalog_backend` is the one place that picks a backend for a
database, so another one is added there and in a module of its own, with no caller changed.
Connections speak DuckDB's Python API (``execute``, ``sql``, ``register``, ``cursor``), whatever
the backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Iterator

#: Seconds a connection waits for a catalog held by another process (or, in this process, by a
#: connection of the other mode) before :class:`~attnbase.errors.CatalogLockedError`.
LOCK_TIMEOUT_S = 5.0


class CatalogBackend(ABC):
    """One database's catalog. The constructor only stores parameters: nothing is opened or
    created before the first operation."""

    #: Seconds an operation waits for a catalog held by another writer before
    #: :class:`~attnbase.errors.CatalogLockedError`.
    lock_timeout: float

    @abstractmethod
    def exists(self) -> bool:
        """Whether the catalog has been created (a read never creates one)."""

    @abstractmethod
    def missing(self) -> Exception:
        """The one-line error for a database that does not exist, naming how to make one."""

    def default_store(self) -> str | None:
        """The ``s3://`` root new runs are put under when no ``--store`` is given (None: the
        database's own directory)."""
        return None

    @abstractmethod
    def open(self, read_only: bool, config: dict | None = None, stats: bool = True) -> Any:
        """A connection the caller keeps and closes, waiting up to :attr:`lock_timeout` for
        another writer. ``config``: the SQL sandbox's settings (:mod:`attnbase.warehouse.sandbox`);
        ``stats=False``: without the views of statistics files on object storage (the write
        path's own transactions never read them)."""

    @abstractmethod
    def connect(self, read_only: bool = False, config: dict | None = None,
                stats: bool = True) -> AbstractContextManager[Any]:
        """A short-lived connection, closed on exit; migrates first where needed. A read-only
        one raises :class:`~attnbase.errors.WarehouseError` where no catalog exists."""

    @contextmanager
    def transaction(self, stats: bool = True) -> Iterator[Any]:
        """A writing connection inside one transaction: committed on success, else rolled back."""
        with self.connect(read_only=False, stats=stats) as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    @abstractmethod
    def ledger(self) -> AbstractContextManager[Any]:
        """A :class:`~attnbase.warehouse.catalog.ledger.Ledger`: one writing transaction over
        which batches are complete and which statistics files readers see; on commit the
        views read exactly the listed files."""

    @abstractmethod
    def migrate(self) -> list:
        """Apply pending migrations (creating the catalog if needed); the ones applied."""

    @abstractmethod
    def ensure_migrated(self) -> None:
        """Migrate unless every migration is applied already (checked once per instance)."""

    def acquire_lease(self, run_id: str, purpose: str, *, wait: bool = False,
                      config_hash: str | None = None, timeout: float | None = None):
        """Take ``run_id``'s writer lease (:func:`attnbase.warehouse.catalog.lease.acquire`)."""
        from attnbase.warehouse.catalog import lease

        return lease.acquire(self, run_id, purpose, wait=wait, config_hash=config_hash,
                             timeout=timeout)

    def lease_holder(self, run_id: str) -> dict | None:
        """The live lease of ``run_id``, or None (:func:`attnbase.warehouse.catalog.lease.holder`)."""
        from attnbase.warehouse.catalog import lease

        return lease.holder(self, run_id)

    def damaged_tables(self) -> list[tuple[str, str]]:
        """``(table, one-line message)`` of each catalog table whose stored bytes fail their
        checksums, every table read whole; none where the backend keeps no such bytes itself
        (a team database's tables are PostgreSQL's)."""
        return []
