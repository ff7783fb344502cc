"""A reader trusts the catalog over the run store's own copies (issue 44, item 1): a derived
array is formed by the catalog's recipe (``arrays.derivation``); a store whose copy of it
(``zarr.json``) differs is refused in one line naming the run and ``verify``, never read with
changed values.

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
