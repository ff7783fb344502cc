"""warehouse: Zarr v3 run stores, the DuckDB catalog, read-only SQL and array readers.

``Database`` (catalog + layout), ``extract_run`` (resumable extraction into a run),
``open_run`` (lazy ``xarray.Dataset``) and ``read_sql`` (read-only queries -> polars).
Attributes are imported lazily so that ``attnbase sql`` never pays for zarr or torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Database": "attnbase.warehouse.catalog",
    "RunRecord": "attnbase.warehouse.catalog",
    "extract_run": "attnbase.warehouse.ingest",
    "open_run": "attnbase.warehouse.reader",
    "read_sql": "attnbase.warehouse.sql",
    "RunStore": "attnbase.warehouse.store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'attnbase.warehouse' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)


def __dir__():
    return __all__
