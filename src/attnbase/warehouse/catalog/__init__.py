"""The catalog: the database's tables (schema and its migrations, :mod:`.schema`,
:mod:`.migrations`), the ledger of statistics files (:mod:`.statledger`) and the run leases
(:mod:`.lease`), behind one small interface (:class:`.backend.CatalogBackend`) with one
implementation per backend: the embedded DuckDB file (:mod:`.duckdb_file`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnbase.warehouse.catalog.backend import CatalogBackend


def catalog_backend(root: str | Path, *, lock_timeout: float) -> "CatalogBackend":
    """The catalog of the database at ``root``: the embedded DuckDB file ``root/catalog.duckdb``
    (the only backend so far)."""
    from attnbase.warehouse.catalog.duckdb_file import DuckDBFileBackend

    return DuckDBFileBackend(root, lock_timeout=lock_timeout)
