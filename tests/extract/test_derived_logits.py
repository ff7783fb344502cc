"""Derived attention logits (docs/architecture.md "Arrays of a run"): a run of the default capture
stores queries and keys, and the reader forms ``attn_logits`` from them equal to what the capture
saw. Each family runs twice on the same windows, once storing the logits and once deriving them:
values, masks, row statistics and study results must be the same."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnbase.contract import logits_mode
from attnbase.errors import ExtractError
from attnbase.extract import ExtractConfig, capture_batches, corpus_windows
from attnbase.runner import extract_run
from attnbase.warehouse.database import Database
from attnbase.warehouse.runs.store import RunStore

FAMILY_MODELS = ("tiny-gpt2", "tiny-neox", "tiny-llama", "tiny-gemma3", "minilm")
STORED = ("keys", "queries", "logits", "hidden")


def _pair(db_dir, model: str, n_seqs=4, seq_len=16, batch_size=2):
    """Runs ``stored`` and ``derived`` of ``model`` on the same windows."""
    for run, capture in (("stored", STORED), ("derived", None)):
        kw = {} if capture is None else {"capture": capture}
        cfg = ExtractConfig(model=model, n_seqs=n_seqs, seq_len=seq_len, batch_size=batch_size,
                            device="cpu", **kw)
        extract_run(Database(db_dir), run, cfg, progress=False)
    db = Database(db_dir)
    return db, RunStore(db.store_path("stored"), "stored"), RunStore(db.store_path("derived"), "derived")


def _row_stats(db, run):
    with db.connect(read_only=True) as con:
        return con.execute("SELECT * EXCLUDE (run_id) FROM row_stats WHERE run_id = ? "
                           "ORDER BY layer, head, seq, query", [run]).fetchnumpy()


@pytest.fixture(scope="module", params=FAMILY_MODELS)
def pair(request, tmp_path_factory):
    return request.param, *_pair(tmp_path_factory.mktemp(request.param), request.param)


def test_derived_logits_equal_the_stored_ones(pair):
    model, db, stored, derived = pair
    assert "attn_logits" in stored.stored_names()
    assert "attn_logits" not in derived.stored_names() and "attn_logits" in derived.names()
    want, got = stored.read("attn_logits"), derived.read("attn_logits")
    assert got.dtype == np.float32 and got.shape == want.shape
    # -inf exactly where the mask puts it, every other value bit for bit
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    max_abs = float(np.abs(got[fin] - want[fin]).max())
    print(f"{model}: max |derived - stored| = {max_abs}")
    assert max_abs == 0.0
    # a selection forms the same values as the whole array
    assert np.array_equal(derived.read("attn_logits", (1, slice(1, 3), 2, slice(3, 9))),
                          want[1, 1:3, 2, 3:9])
    assert np.array_equal(derived.read_layer("attn_logits", 0), want[0])


def test_row_stats_are_the_same_as_with_stored_logits(pair):
    _, db, *_ = pair
    a, b = _row_stats(db, "stored"), _row_stats(db, "derived")
    assert set(a) == set(b)
    for col in a:
        assert np.array_equal(a[col], b[col], equal_nan=True), col


def test_catalog_records_the_derivation_and_saves_the_bytes(pair):
    model, db, stored, derived = pair
    rows = {r["name"]: r for r in db.array_rows("derived")}
    assert rows["attn_logits"]["derived"] is True
    recipe = json.loads(rows["attn_logits"]["derivation"])
    assert recipe["inputs"][0] == "queries"
    assert recipe["inputs"][1] == ("keys_rot" if db.run_info("derived")["rotary"] else "keys")
    assert len(recipe["scale"]) == db.run_info("derived")["n_layers"]
    assert {r["name"]: r["derived"] for r in db.array_rows("stored")}["attn_logits"] is False
    assert derived.nbytes_stored() < stored.nbytes_stored()


def test_open_run_forms_them_lazily(pair):
    import attnbase

    _, db, stored, _ = pair
    ds = attnbase.open_run(db, "derived")
    assert ds.attn_logits.dims == ("layer", "head", "seq", "query", "key")
    assert np.array_equal(ds.attn_logits.isel(layer=1, seq=0).values,
                          stored.read("attn_logits")[1, :, 0])


@pytest.mark.slow  # 6-17 s: run by `make test-slow`
def test_study_results_are_exactly_equal(tmp_path):
    from attnbase.stats import studies

    db, *_ = _pair(tmp_path, "tiny-llama", n_seqs=6, seq_len=16)
    out = {}
    for run in ("stored", "derived"):
        studies.distances_study(db, run)
        out[run] = (studies.reversal_study(db, run, draws=2000)[1],
                    studies.clusters_study(db, run, draws=99)[1])
    assert out["stored"] == out["derived"]


def test_verify_recomputes_a_sample_of_rows_and_names_a_drifted_recipe(tmp_path):
    from attnbase.warehouse.runs.derived import DERIVED_ATTR
    from attnbase.warehouse.runs.verify import ROW_SAMPLE, verify

    db, _, derived = _pair(tmp_path, "tiny-gpt2")
    res = verify(db, "derived")
    assert res.ok, [str(p) for p in res.problems]
    assert res.rows_checked == ROW_SAMPLE
    # the store's recipe no longer the catalog's, and scaled wrongly: both are named
    grp = derived.group("a")
    attrs = dict(grp.attrs)
    attrs[DERIVED_ATTR]["attn_logits"]["scale"] = [2.0] * 4
    grp.attrs.update(attrs)
    res = verify(db, "derived")
    kinds = {p.kind for p in res.problems}
    assert "array" in kinds, [str(p) for p in res.problems]
    assert any("is not the catalog's" in str(p) for p in res.problems)


def test_compact_drops_stored_logits_after_checking_them(tmp_path, cli):
    db, stored, _ = _pair(tmp_path, "tiny-neox")
    before = stored.read("attn_logits")
    size = stored.nbytes_stored()
    code, out, err = cli("compact", "--db", tmp_path, "--run", "stored")
    assert code == 0, err
    assert "max abs difference 0" in out and "MiB freed" in out
    fresh = RunStore(db.store_path("stored"), "stored")
    assert "attn_logits" not in fresh.stored_names()
    assert fresh.nbytes_stored() < size
    assert np.array_equal(fresh.read("attn_logits"), before)
    assert {r["name"]: r["derived"] for r in db.array_rows("stored")}["attn_logits"] is True
    code, out, _ = cli("verify", "--db", tmp_path, "--run", "stored")
    assert code == 0 and "agree" in out
    code, out, _ = cli("compact", "--db", tmp_path, "--run", "stored")  # idempotent
    assert code == 0 and "nothing to compact" in out
    # the default capture's logits are derived already: only its statistics files to merge
    code, out, _ = cli("compact", "--db", tmp_path, "--run", "derived")
    assert code == 0 and "attn_logits" not in out and "files -> 2" in out
    code, out, _ = cli("compact", "--db", tmp_path, "--run", "derived")
    assert code == 0 and "nothing to compact" in out


def test_capture_refuses_a_recipe_the_model_does_not_follow(load_lm):
    from dataclasses import replace

    lm = load_lm("tiny-llama")
    win = corpus_windows(lm, "default", n_seqs=1, seq_len=8, seed=0)
    r = lm.info.logits_recipe
    wrong = [replace(r, scale=(r.scale[0] * 2, *r.scale[1:])), replace(r, causal=False),
             replace(r, window=(4, *r.window[1:]))]
    for recipe in wrong:
        bad = replace(lm, info=replace(lm.info, logits_recipe=recipe))
        with pytest.raises(ExtractError, match="--capture ...,logits"):
            next(capture_batches(bad, win.tokens, 1, ("keys", "queries")))


def test_rounded_queries_and_unknown_families_store_their_logits(load_lm):
    from dataclasses import replace

    info = load_lm("tiny-gpt2").info
    assert logits_mode(info, ("keys", "queries", "hidden"), "float32") == "derived"
    # half models form their logits in float32 from q and k, stored exactly by default
    assert logits_mode(info, ("keys", "queries", "hidden"), "bfloat16") == "derived"
    assert logits_mode(info, ("keys", "queries", "hidden"), "float16") == "derived"
    assert logits_mode(info, ("keys", "queries"), "bfloat16", "bfloat16") == "derived"
    # q and k rounded below the model's precision: the logits cannot be formed again
    assert logits_mode(info, ("keys", "queries"), "float32", "float16") == "stored"
    assert logits_mode(info, ("keys", "queries"), "bfloat16", "float16") == "stored"
    assert logits_mode(info, ("keys", "queries", "logits"), "float32") == "stored"
    assert logits_mode(info, ("keys", "hidden"), "float32") == "none"
    assert logits_mode(replace(info, logits_recipe=None), ("keys", "queries"), "float32") == "stored"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_real_causal_lms_derive_their_logits_exactly(tmp_path, model):
    """The real causal LMs (GQA 9/3, and Gemma-3's QK-norm, query scaling and 5:1 sliding
    windows of 512 at 640 tokens so that rows leave the window)."""
    seq_len = 640 if model == "gemma3-270m" else 128
    db, stored, derived = _pair(tmp_path, model, n_seqs=2, seq_len=seq_len, batch_size=1)
    for layer in range(db.run_info("derived")["n_layers"]):
        want, got = stored.read_layer("attn_logits", layer), derived.read_layer("attn_logits", layer)
        assert np.array_equal(np.isneginf(got), np.isneginf(want)), layer
        fin = np.isfinite(want)
        assert float(np.abs(got[fin] - want[fin]).max()) == 0.0, layer
    a, b = _row_stats(db, "stored"), _row_stats(db, "derived")
    for col in a:
        assert np.array_equal(a[col], b[col], equal_nan=True), col


@pytest.mark.slow
def test_long_context_gpt2_small_shape_without_stored_logits(tmp_path):
    """1,024 tokens on the GPT-2-small shape (12 x 12 heads): the derived run stores queries,
    keys and hidden only (75 MB of q and k and 41 MB of hidden a sequence, against 604 MB of
    logits), and its logits read back with the causal mask."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from extract import gpt2_small_dir

    model = str(gpt2_small_dir(tmp_path))
    cfg = ExtractConfig(model=model, n_seqs=2, seq_len=1024, batch_size=1, device="cpu")
    extract_run(Database(tmp_path / "db"), "long", cfg, progress=False)
    db = Database(tmp_path / "db")
    store = RunStore(db.store_path("long"), "long")
    assert "attn_logits" not in store.stored_names()
    per_seq = 12 * 12 * 1024 * 64 * 4 * 2 + 13 * 1024 * 768 * 4  # queries + keys, hidden
    assert store.nbytes_stored() < 2 * per_seq * 1.01 < 2 * 12 * 12 * 1024 * 1024 * 4 / 5
    z = store.read("attn_logits", (11, 3, 1))
    assert z.shape == (1024, 1024) and np.isneginf(z[0, 1:]).all() and np.isfinite(np.diag(z)).all()
    with db.connect(read_only=True) as con:
        n = con.execute("SELECT count(*) FROM row_stats WHERE run_id = 'long'").fetchone()[0]
    assert n == 12 * 12 * 2 * 1024


def test_a_catalog_from_before_derived_logits_upgrades_and_reads_as_before(tmp_path):
    """Migration 12 on a catalog whose ``arrays`` lacks the new columns: its stored-logits run
    reads as before and verifies clean."""
    import duckdb

    cfg = ExtractConfig(model="tiny-gpt2", n_seqs=2, seq_len=12, batch_size=2, device="cpu",
                        capture=STORED)
    extract_run(Database(tmp_path), "old", cfg, progress=False)
    want = RunStore(Database(tmp_path).store_path("old"), "old").read("attn_logits")
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"))
    con.execute("ALTER TABLE arrays DROP COLUMN derivation")
    con.execute("ALTER TABLE arrays DROP COLUMN derived")
    con.execute("DELETE FROM schema_migrations WHERE version = 12")
    con.close()
    db = Database(tmp_path)
    assert 12 in [m.version for m in db.migrate()]
    assert {r["name"]: r["derived"] for r in db.array_rows("old")}["attn_logits"] is False
    assert np.array_equal(RunStore(db.store_path("old"), "old").read("attn_logits"), want)
    from attnbase.warehouse.runs.verify import verify

    assert verify(db, "old").ok
