"""Lazy array access to a run: ``open_run(db_dir, run_id) -> xarray.Dataset``."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from attnbase.warehouse.database import Database
from attnbase.warehouse.runs.derived import open_derived


def _attr(value):
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, bool) or value is None:
        return value if value is not None else ""
    return value


def open_run(db_dir: str | Path | Database, run_id: str):
    """The arrays of ``run_id`` as a lazy ``xarray.Dataset`` with named dims.

    Variables are the run's arrays (``tokens (seq, pos)``, ``attn_logits (layer, head, seq,
    query, key)``, ...), stored or derived (``attn_logits`` of a derived-logits run is formed
    from its queries and keys on access, equal to the captured values); nothing is read until
    values are asked for. ``hidden`` has
    ``n_layers + 1`` entries along its first axis (0 = embeddings, ``i`` = the residual stream
    entering layer ``i``), so in the Dataset that axis is named ``hidden_layer`` (the store itself
    keeps ``layer``; ``tokens``-only or ``hidden``-only stores keep it too). Every dimension has
    an integer coordinate, and the token strings are coordinates: ``token (seq, pos)``,
    ``query_token (seq, query)``, ``key_token (seq, key)`` (:func:`_with_coords`). ``ds.attrs``
    holds the run's ``runs`` row. Seqs of batches not yet written read as NaN; every value is read through
    :meth:`RunStore.read <attnbase.warehouse.runs.store.RunStore.read>`, so a chunk that fails
    its checksum, or is missing from a batch the ledger counts complete, raises
    ArrayCorruptError naming it (and a derived array is formed by the catalog's recipe).
    Raises RunNotFoundError.
    """
    import xarray as xr

    db = Database.of(db_dir)
    info = db.run_info(run_id)
    store = db.run(run_id).store()
    store.group()  # a clear error when the store is missing
    def _open(drop):
        return xr.open_zarr(store.zarr_store(), consolidated=False, chunks=None, zarr_format=3,
                            mask_and_scale=False, drop_variables=drop)

    names = store.stored_names()
    if "hidden" in names and len(names) > 2:
        # hidden has n_layers + 1 entries along `layer` (0 = embeddings): one Dataset cannot
        # hold two sizes of one dim, so the xarray view calls that axis `hidden_layer`.
        ds = _open(["hidden"])
        hidden = _open([n for n in names if n != "hidden"]).rename_dims({"layer": "hidden_layer"})
        ds = xr.merge([ds, hidden], compat="no_conflicts", join="exact", combine_attrs="override")
    else:
        ds = _open(None)
    for name in names:  # read through the store: checked against the ledger, corrupt chunks
        arr = store.array(name)  # named, bfloat16 arrays (stored as their bits) as float32
        if name in ds:
            ds[name] = xr.Variable(ds[name].dims, _lazy(store, name, arr), ds[name].attrs)
    for name, recipe in store.derived().items():  # attn_logits of a derived-logits run:
        arr = open_derived(name, recipe, store.array)  # its shape now, formed on access
        ds[name] = xr.Variable(arr.metadata.dimension_names, _lazy(store, name, arr))
    ds.attrs.update({k: _attr(v) for k, v in info.items() if k != "config"})
    return _with_coords(ds, str(info.get("model") or ""))


def _with_coords(ds, model: str):
    """``ds`` with an integer coordinate on every dimension (``layer``, ``head``, ``seq``,
    ``pos``, ``query``, ``key``, ...: ``ds.sel(layer=3, head=1)``), and the token strings:
    ``token (seq, pos)``, and as ``query_token (seq, query)`` / ``key_token (seq, key)`` for the
    attention arrays, decoded by the run's tokenizer (:func:`attnbase.tokentext.token_labels`;
    ``#<id>`` where none is found, ``ds.attrs["token_source"]`` says which)."""
    import numpy as np

    ds = ds.assign_coords({dim: np.arange(size) for dim, size in ds.sizes.items()})
    if "tokens" not in ds:
        return ds
    from attnbase.errors import ArrayCorruptError
    from attnbase.tokentext import token_labels

    try:
        ids = np.asarray(ds["tokens"].values)
    except ArrayCorruptError as err:  # the run opens; reading ds["tokens"] names the chunk
        ds.attrs["token_source"] = f"no token strings: {err}"
        return ds
    unique, inverse = np.unique(ids, return_inverse=True)
    labels, source = token_labels(model, unique.tolist())
    text = np.asarray(labels, dtype=object)[inverse.reshape(ids.shape)]
    ds = ds.assign_coords(token=(("seq", "pos"), text))
    if "query" in ds.sizes and ds.sizes["query"] == ds.sizes["pos"]:
        ds = ds.assign_coords(query_token=(("seq", "query"), text))
    if "key" in ds.sizes and ds.sizes["key"] == ds.sizes["pos"]:
        ds = ds.assign_coords(key_token=(("seq", "key"), text))
    ds.attrs["token_source"] = source
    return ds


def _lazy(store, name: str, arr):
    """An array read through :meth:`RunStore.read` (a derived one, or a bfloat16 one kept as
    its bits) as xarray's lazily indexed data: nothing is read or formed until values are
    asked for, and then only the selection (corrupt chunks, or inputs, are named)."""
    from xarray.backends import BackendArray
    from xarray.core import indexing

    class _ThroughStore(BackendArray):
        def __init__(self) -> None:
            self.shape = arr.shape
            self.dtype = arr.dtype

        def __getitem__(self, key):
            return indexing.explicit_indexing_adapter(
                key, self.shape, indexing.IndexingSupport.BASIC, self._raw)

        def _raw(self, key):
            return store.read(name, key)

    return indexing.LazilyIndexedArray(_ThroughStore())
