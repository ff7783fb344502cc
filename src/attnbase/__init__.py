"""attnbase: an activation database for attention research."""

from attnbase._version import __version__

__all__ = ["__version__", "attach_lake", "connect", "extract_run", "open_run"]


def open_run(db, run_id):
    """Lazy ``xarray.Dataset`` over a run's Zarr store with named dims (see warehouse.open_run);
    ``db``: a database directory or address, or an :class:`attnbase.warehouse.Database`."""
    from attnbase.warehouse.runs.reader import open_run as _open_run

    return _open_run(db, run_id)


def extract_run(db, run_id, cfg, overwrite=False, progress=True):
    """Extract ``cfg`` (an :class:`attnbase.extract.ExtractConfig`) into run ``run_id`` of ``db``
    (a database directory or address, or an :class:`attnbase.warehouse.Database`; resumable;
    see :func:`attnbase.runner.extract_run`)."""
    from attnbase.runner import extract_run as _extract_run
    from attnbase.warehouse import Database

    return _extract_run(Database.of(db), run_id, cfg, overwrite=overwrite, progress=progress)


def connect(url, token=None, timeout=60.0):
    """A client of an ``attnbase serve`` at ``url``: ``.runs()``, ``.heads(run)``, ``.table1()``
    and ``.sql(query)`` as ``polars.DataFrame``; ``.pattern(run, layer, head, seq)`` (the T x T
    probabilities with the token texts, a heatmap in Jupyter); ``.head(run, layer, head)``;
    see :mod:`attnbase.serve.client`."""
    from attnbase.serve.client import connect as _connect

    return _connect(url, token, timeout)


def attach_lake(address):
    """A DuckDB connection with the team database at ``address`` (``postgresql://...``)
    attached read-only, ``row_stats``/``col_stats`` included; see
    :func:`attnbase.serve.client.attach_lake`."""
    from attnbase.serve.client import attach_lake as _attach_lake

    return _attach_lake(address)
