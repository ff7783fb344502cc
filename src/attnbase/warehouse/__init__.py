"""warehouse: Zarr v3 run stores, the DuckDB catalog, read-only SQL and array readers.

``Database`` (catalog + layout), ``RunWriter`` (open or resume a run, persist a batch, finish;
it knows no models: the loop that feeds it is :mod:`attnbase.runner`), ``open_run`` (lazy
``xarray.Dataset``) and ``read_sql`` (read-only queries -> polars).
Attributes are imported lazily so that ``attnbase sql`` never pays for zarr or torch.
"""

from __future__ import annotations

from attnbase._lazy import lazy_getattr

_EXPORTS = {
    "Database": "attnbase.warehouse.database",
    "RunRecord": "attnbase.warehouse.database",
    "RunWriter": "attnbase.warehouse.runs.writer",
    "open_run": "attnbase.warehouse.runs.reader",
    "read_sql": "attnbase.warehouse.sandbox.sql",
    "RunStore": "attnbase.warehouse.runs.store",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__():
    return __all__
