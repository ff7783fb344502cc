"""``attnbase compact``: drop a run's stored ``attn_logits`` once derivation reproduces them.

A run extracted with stored logits (every run before derived logits, or ``--capture
...,logits``) keeps its queries and keys; where its family derives logits
(:class:`~attnbase.contract.LogitsRecipe`), :func:`compact_run` forms every layer x seq chunk of
the logits from them, compares with the stored chunk (``-inf`` exactly where stored, values
equal or within :data:`COMPACT_RTOL` relative), and only then:

1. writes the recipe into the store's group attributes (from here on readers form the logits,
   which equal the stored ones: a crash leaves a consistent run, only bytes too many);
2. marks the ``arrays`` row derived in one catalog transaction;
3. deletes the stored array.

Run again after a crash between 1 and 3, it finishes the deletion.

A run on object storage (``runs.store_url``) is compacted the same way: its chunks are read
(and compared) through the object store, the recipe is one PUT of the group's ``zarr.json``
(an object is replaced whole), and step 3 deletes every object under ``.../attn_logits/``. The
catalog's ``arrays`` row is updated exactly as for a local run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnbase.contract import LogitsRecipe
from attnbase.errors import WarehouseError
from attnbase.warehouse.database import Database
from attnbase.warehouse.runs.derived import DerivedLogits, derived_attrs
from attnbase.warehouse.runs.store import RunStore

#: Largest relative difference (|derived - stored| / max(|stored|, 1)) compaction accepts; the
#: capture's arithmetic reproduces float32 runs exactly, so anything above this is a wrong recipe.
COMPACT_RTOL = 1e-6


@dataclass(frozen=True)
class CompactResult:
    run_id: str
    bytes_freed: int
    max_abs_diff: float
    max_rel_diff: float
    chunks_compared: int


def _read_checked(store: RunStore, arr, sel, layer: int) -> np.ndarray:
    """``arr[sel]``; a chunk that fails to decode -> ArrayCorruptError naming it (one line)."""
    try:
        return np.asarray(arr[sel])
    except Exception as err:
        store._raise_corrupt(arr, "attn_logits", err, first_axis=layer)
        raise


def already_derived(db: Database, run_id: str) -> bool:
    """Whether the catalog says ``run_id``'s logits are derived (nothing to check again)."""
    return any(r["name"] == "attn_logits" and r.get("derived") for r in db.array_rows(run_id))


def compact_run(db: Database, run_id: str, recipe: LogitsRecipe | None, *,
                wait: bool = False) -> CompactResult:
    """Check that ``recipe`` reproduces ``run_id``'s stored ``attn_logits``, then drop them
    (``recipe`` may be None for a run whose logits are derived already: only the leftovers of
    a stopped compaction are removed). Holds the run's lease (``wait``: for another writer of
    the run, else refuse)."""
    db.run_info(run_id)
    with db.catalog.acquire_lease(run_id, "compact", wait=wait):
        return _compact_run(db, run_id, recipe)


def _compact_run(db: Database, run_id: str, recipe: LogitsRecipe | None) -> CompactResult:
    info = db.run_info(run_id)
    if info["status"] != "complete":
        raise WarehouseError(f"run {run_id!r} is {info['status']!r}; finish it (rerun its "
                             "extract command) before compacting it")
    rows = {r["name"]: r for r in db.array_rows(run_id)}
    run = db.run(run_id)
    store = run.store()
    if "attn_logits" not in rows:
        raise WarehouseError(f"run {run_id!r} has no attn_logits to compact")
    if recipe is None and not rows["attn_logits"].get("derived"):
        raise WarehouseError(f"run {run_id!r}: compacting stored logits needs the model's recipe")
    stored_dir = store.path / "attn_logits"
    if rows["attn_logits"].get("derived"):
        freed = sum(run.sizes(stored_dir).values())  # a compaction stopped before its last step
        run.delete_tree(stored_dir)
        return CompactResult(run_id, freed, 0.0, 0.0, 0)
    missing = [n for n in recipe.inputs if n not in rows or rows[n].get("derived")]
    if missing:
        raise WarehouseError(f"run {run_id!r} stores no {', '.join(missing)}: its logits cannot "
                             "be derived, so they stay stored")
    stored = store.group()["attn_logits"]
    derived = DerivedLogits(store.array("queries"), store.array(recipe.keys), recipe)
    if tuple(stored.shape) != derived.shape:
        raise WarehouseError(f"run {run_id!r}: stored attn_logits {tuple(stored.shape)} do not "
                             f"match its queries' shape {derived.shape}")
    worst_abs = worst_rel = 0.0
    chunks = 0
    step = stored.chunks[2]
    for layer in range(stored.shape[0]):
        for s0 in range(0, stored.shape[2], step):
            sel = (layer, slice(None), slice(s0, s0 + step))
            want = _read_checked(store, stored, sel, layer)
            got = _read_checked(store, derived, sel, layer)  # names a failing q or k chunk
            inf_w, inf_g = np.isneginf(want), np.isneginf(got)
            if not np.array_equal(inf_w, inf_g) or not np.isfinite(got[~inf_g]).all():
                raise WarehouseError(
                    f"run {run_id!r}: derived logits mask other entries than the stored ones at "
                    f"layer {layer}, seqs {s0}..{s0 + step - 1}; the logits stay stored")
            diff = np.abs(got[~inf_g].astype(np.float64) - want[~inf_w])
            if diff.size:
                worst_abs = max(worst_abs, float(diff.max()))
                worst_rel = max(worst_rel, float((diff / np.maximum(
                    np.abs(want[~inf_w].astype(np.float64)), 1.0)).max()))
            chunks += 1
            if worst_rel > COMPACT_RTOL:
                raise WarehouseError(
                    f"run {run_id!r}: derived logits differ from the stored ones by {worst_rel:.3g} "
                    f"(relative) at layer {layer}, seqs {s0}..{s0 + step - 1}, above "
                    f"{COMPACT_RTOL:g}; the logits stay stored")
    grp = store.group("a")
    grp.attrs.update(derived_attrs({"attn_logits": recipe.to_json()}))
    with db.transaction() as con:
        con.execute("UPDATE arrays SET derived = true, derivation = ? "
                    "WHERE run_id = ? AND name = 'attn_logits'", [recipe.to_json(), run_id])
    db.forget_location(run_id)  # its readers now form the logits by the catalog's recipe
    freed = sum(run.sizes(stored_dir).values())
    if not run.remote:
        del grp["attn_logits"]
    run.delete_tree(stored_dir)  # its zarr.json and chunks: nothing else names them (v3)
    return CompactResult(run_id, freed, worst_abs, worst_rel, chunks)
