"""A reader trusts the catalog over the run store's own copies (issue 44, items 1 and 3):

- a derived array is formed by the catalog's recipe (``arrays.derivation``); a store whose copy
  of it (``zarr.json``) differs is refused in one line naming the run and ``verify``, never read
  with changed values;
- a chunk file missing from a batch the ledger counts complete is an ArrayCorruptError naming
  the chunk, the run and the fix, never zarr's fill value (NaN, or token id 0).

The run is synthetic (tests/warehouse/fakes.py) with a logits recipe, so ``attn_logits`` is
derived from the stored queries and keys as for a real float32 model.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest


@pytest.fixture
def derived_run(db):
    from fakes import fake_batches, fake_config, fake_info

    from attnbase.contract import LogitsRecipe
    from attnbase.runner import ingest_batches

    recipe = LogitsRecipe(keys="keys", scale=(0.5, 0.25), causal=True, window=(None, None))
    info = dataclasses.replace(fake_info(), logits_recipe=recipe)
    cfg = fake_config()
    ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    assert {r["name"]: r["derived"] for r in db.array_rows("r1")}["attn_logits"]
    return db


def _flip_scale(db, run_id: str, layer: int = 0) -> None:
    """One character of layer ``layer``'s scale in the store's copy of the recipe changed."""
    path = db.run(run_id).store_path / "zarr.json"
    meta = json.loads(path.read_text())
    scale = meta["attributes"]["attnbase_derived"]["attn_logits"]["scale"]
    scale[layer] = float(str(scale[layer]).replace("5", "6", 1))
    path.write_text(json.dumps(meta))


def test_a_changed_recipe_in_the_store_is_refused_naming_verify(derived_run, cli):
    from attnbase import open_run
    from attnbase.errors import ArrayCorruptError

    db = derived_run
    before = open_run(db.path, "r1")["attn_logits"][0, 0, 0].values
    assert np.isfinite(before[np.tril_indices(before.shape[0])]).all()  # control: it reads
    _flip_scale(db, "r1")
    with pytest.raises(ArrayCorruptError) as err:
        open_run(db.path, "r1")["attn_logits"][0, 0, 0].values
    msg = str(err.value)
    assert "\n" not in msg and "run 'r1'" in msg and "attnbase verify --run r1" in msg, msg
    assert "recipe" in msg and "attn_logits" in msg
    # the stored arrays do not depend on the recipe: they still read
    assert np.isfinite(open_run(db.path, "r1")["queries"][0, 0, 0].values).all()
    # verify names the same damage (it did before this change too)
    code, out, err_ = cli("verify", "--db", db.path, "--run", "r1")
    assert code == 1 and "is not the catalog's" in out + err_, (out, err_)


def test_the_catalogs_recipe_is_the_one_used(derived_run):
    """The catalog's recipe forms the values: a recipe changed in the catalog changes them
    (the store's copy changed alongside, so the two agree)."""
    from attnbase import open_run

    db = derived_run
    before = open_run(db.path, "r1")["attn_logits"][1, 0, 0].values
    row = {r["name"]: r for r in db.array_rows("r1")}["attn_logits"]
    rec = json.loads(row["derivation"])
    rec["scale"][1] *= 2
    with db.transaction() as con:
        con.execute("UPDATE arrays SET derivation = ? WHERE run_id = 'r1' AND name = "
                    "'attn_logits'", [json.dumps(rec, sort_keys=True)])
    path = db.run("r1").store_path / "zarr.json"
    meta = json.loads(path.read_text())
    meta["attributes"]["attnbase_derived"]["attn_logits"]["scale"][1] *= 2
    path.write_text(json.dumps(meta))
    after = open_run(db.path, "r1")["attn_logits"][1, 0, 0].values
    live = np.isfinite(before)
    np.testing.assert_array_equal(after[live], 2 * before[live])


@pytest.mark.parametrize("array", ["queries", "tokens"])
def test_a_missing_chunk_of_a_complete_batch_is_named(derived_run, array, cli):
    from attnbase import open_run
    from attnbase.errors import ArrayCorruptError

    db = derived_run
    store = db.run("r1").store_path
    chunk = store / array / "c" / ("0/0/1/0/0" if array == "queries" else "1/0")
    chunk.unlink()
    ds = open_run(db.path, "r1")
    for name in ([array, "attn_logits"] if array == "queries" else [array]):
        sel = (0, 0, 2) if name != "tokens" else (2,)  # seq 2: batch 1
        with pytest.raises(ArrayCorruptError) as err:
            ds[name][sel].values
        msg = str(err.value)
        assert "\n" not in msg and f"array {array!r} chunk" in msg and "run 'r1'" in msg, msg
        assert "is missing" in msg and "batch 1 complete" in msg and "--repair" in msg, msg
        assert "attnbase verify --run r1" in msg, msg
    # control: the other batches read, finite
    sel = (0, 0, 0) if array != "tokens" else (0,)
    assert np.isfinite(ds[array][sel].values).all()
    # the command line: one line, exit 2 (analyze reads the keys; the study the logits)
    if array == "queries":
        code, out, err = cli("study", "distances", "--db", db.path, "--run", "r1")
        assert code == 2 and "Traceback" not in err and err.count("\n") == 1, (code, out, err)
        assert "array 'queries' chunk (0, 0, 1, 0, 0)" in err and "is missing" in err, err


def test_a_missing_chunk_of_a_pending_batch_reads_as_not_written(derived_run):
    """Negative control: a batch the ledger does not count (still being extracted) has no
    chunks yet; reading it is no error (the service says "not written yet")."""
    from attnbase import open_run

    db = derived_run
    with db.ledger() as con:
        con.execute("UPDATE batches SET status = 'pending' WHERE run_id = 'r1' AND batch = 1")
        con.execute("UPDATE runs SET status = 'running' WHERE run_id = 'r1'")
    (db.run("r1").store_path / "queries" / "c" / "0" / "0" / "1" / "0" / "0").unlink()
    assert np.isnan(open_run(db.path, "r1")["queries"][0, 0, 2].values).all()
