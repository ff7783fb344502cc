"""The catalog: the database's tables (schema and its migrations, :mod:`.schema`,
:mod:`.migrations`), the ledger of batches and statistics files (:mod:`.ledger`,
:mod:`.statledger`) and the run leases (:mod:`.lease`), behind one small interface
(:class:`.backend.CatalogBackend`) with one implementation per backend: the embedded DuckDB
file (:mod:`.duckdb_file`) and DuckLake on PostgreSQL for a team (:mod:`.ducklake`, its ledger
in PostgreSQL's own tables :mod:`.pg_ledger`, its leases :mod:`.pg_lease`, the sessions it
keeps :mod:`.pg_sessions`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnbase.warehouse.catalog.backend import CatalogBackend


def catalog_backend(root: str | Path, *, lock_timeout: float) -> "CatalogBackend":
    """The catalog of the database at ``root``: DuckLake on PostgreSQL for a team database's
    address (``postgresql://...``, :mod:`.ducklake`), else the embedded DuckDB file
    ``root/catalog.duckdb``."""
    from attnbase.warehouse.catalog.team_url import is_team_url

    if is_team_url(root):
        from attnbase.warehouse.catalog.ducklake import DuckLakeBackend

        return DuckLakeBackend(str(root), lock_timeout=lock_timeout)
    from attnbase.warehouse.catalog.duckdb_file import DuckDBFileBackend

    return DuckDBFileBackend(root, lock_timeout=lock_timeout)
