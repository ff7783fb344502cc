"""Round-trip contract: every way of reading a run gives back exactly what was captured."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import expected_arrays, fake_batches, fake_config, fake_info

from attnbase.contract import ARRAY_DIMS
from attnbase.warehouse import Database, open_run
from attnbase.runner import ingest_batches
from attnbase.warehouse.runs.store import RunStore


class RoundtripBase:
    """Subclasses implement ``read(db, run_id, name) -> np.ndarray`` for one access path."""

    info_kw: dict = {"rotary": True, "n_kv_heads": 1}
    cfg_kw: dict = {}

    def read(self, db: Database, run_id: str, name: str) -> np.ndarray:
        raise NotImplementedError

    def roundtrip(self, tmp_path, **cfg_kw):
        info = fake_info(**self.info_kw)
        cfg = fake_config(**{**self.cfg_kw, **cfg_kw})
        db = Database(tmp_path / "db")
        ingest_batches(db, "rt", cfg, info=info, corpus="default", corpus_hash="c",
                       batches=fake_batches(info, cfg, seed=3), progress=False)
        want = expected_arrays(info, cfg, seed=3)
        got = {name: self.read(db, "rt", name) for name in want}
        return want, got

    @pytest.mark.parametrize("batch_size", [1, 2, 5, 8])
    def test_roundtrip_identical(self, tmp_path, batch_size):
        want, got = self.roundtrip(tmp_path, batch_size=batch_size)
        assert set(got) == {"tokens", "keys", "keys_rot", "queries", "attn_logits", "hidden"}
        for name in want:
            assert got[name].dtype == want[name].dtype, name
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)

    def test_roundtrip_float16_and_partial_capture(self, tmp_path):
        want, got = self.roundtrip(tmp_path, dtype="float16", capture=("logits",))
        assert set(got) == {"tokens", "attn_logits"}
        assert got["attn_logits"].dtype == np.float16
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


class TestStoreRoundtrip(RoundtripBase):
    def read(self, db, run_id, name):
        return RunStore(db.store_path(run_id), run_id).read(name)


class TestLayerRoundtrip(RoundtripBase):
    """Through ``Database.read_layer`` (layer by layer; tokens through the store)."""

    def read(self, db, run_id, name):
        if ARRAY_DIMS[name][0] != "layer":
            return RunStore(db.store_path(run_id), run_id).read(name)
        n = db.array_rows(run_id)
        shape = {r["name"]: r["shape"] for r in n}[name]
        return np.stack([db.read_layer(run_id, name, i) for i in range(shape[0])])


class TestStreamedLayerRoundtrip(RoundtripBase):
    """Through ``Database.read_layers`` (every layer, each read one ahead in a thread)."""

    def read(self, db, run_id, name):
        if ARRAY_DIMS[name][0] != "layer":
            return RunStore(db.store_path(run_id), run_id).read(name)
        got = list(db.read_layers(run_id, name))
        assert [layer for layer, _ in got] == list(range(len(got)))
        # a subset, in the order asked for
        sub = [layer for layer, _ in db.read_layers(run_id, name, [len(got) - 1, 0])]
        assert sub == [len(got) - 1, 0]
        return np.stack([block for _, block in got])


class TestXarrayRoundtrip(RoundtripBase):
    def read(self, db, run_id, name):
        ds = open_run(db.path, run_id)
        dims = ARRAY_DIMS[name]
        if name == "hidden":  # n_layers + 1 entries: its own dim name in one Dataset
            dims = ("hidden_layer",) + dims[1:]
        assert ds[name].dims == dims
        return ds[name].values


def test_open_run_is_lazy_and_has_attrs(fake_run):
    db, info, cfg = fake_run
    ds = open_run(db.path, "r1")
    assert ds.attrs["model"] == "fake" and ds.attrs["status"] == "complete"
    assert ds["attn_logits"].dims == ("layer", "head", "seq", "query", "key")
    assert ds.sizes["seq"] == cfg.n_seqs and ds.sizes["layer"] == info.n_layers
    # lazy: nothing has been loaded into memory yet
    assert not ds["attn_logits"].variable._in_memory
    # tokens with value 0 are not masked as missing
    assert ds["tokens"].dtype == np.int32


def test_open_run_via_package(fake_run):
    import attnbase

    db, _, _ = fake_run
    ds = attnbase.open_run(db.path, "r1")
    assert ds["hidden"].dims == ("hidden_layer", "seq", "pos", "d_model")
    assert ds.sizes["hidden_layer"] == ds.sizes["layer"] + 1


def test_catalog_arrays_match_store(fake_run):
    db, info, cfg = fake_run
    rows = {r["name"]: r for r in db.array_rows("r1")}
    store = RunStore(db.store_path("r1"), "r1")
    assert sorted(rows) == store.names()
    for name, row in rows.items():
        arr = store.array(name)
        assert tuple(row["shape"]) == arr.shape
        assert tuple(row["chunks"]) == arr.chunks
        assert tuple(row["dims"]) == ARRAY_DIMS[name] == tuple(arr.metadata.dimension_names)
        assert row["dtype"] == str(arr.dtype)
        assert row["path"] == f"runs/r1/store.zarr/{name}"
        assert (db.path / row["path"] / "zarr.json").exists()
        seq_ax = ARRAY_DIMS[name].index("seq")
        assert row["chunks"][seq_ax] == cfg.batch_size
        if ARRAY_DIMS[name][0] == "layer":  # one layer x one batch per chunk
            assert row["chunks"][0] == 1
            assert tuple(row["chunks"][1:]) == tuple(
                cfg.batch_size if d == "seq" else n
                for d, n in zip(ARRAY_DIMS[name][1:], row["shape"][1:]))


def test_codecs_checksum_everything_and_compress_where_it_pays(fake_run):
    """crc32c on every chunk; zstd only on causal logits (half -inf) and tokens."""
    db, info, _ = fake_run
    store = RunStore(db.store_path("r1"), "r1")
    assert info.causal
    for name in store.names():
        meta = store.array(name).metadata.to_dict()
        names = [c["name"] for c in meta["codecs"]]
        want = ["bytes", "zstd", "crc32c"] if name in ("attn_logits", "tokens") else ["bytes", "crc32c"]
        assert names == want, name
        if name != "tokens":
            assert str(meta["fill_value"]).lower() == "nan"


def test_read_unknown_array_names_what_exists(fake_run):
    from attnbase.errors import WarehouseError

    db, _, _ = fake_run
    with pytest.raises(WarehouseError, match="stores no array 'nope'.*attn_logits"):
        db.read_layer("r1", "nope", 0)


@pytest.mark.parametrize("batch_size", [2, 3])  # 3: the last batch leaves a padded edge chunk
def test_direct_chunk_files_equal_zarrs(tmp_path, monkeypatch, batch_size):
    """The store encodes its own codec chains (raw + crc32c, zstd + crc32c) without zarr's
    per-chunk pipeline: every chunk file must be byte for byte the one zarr writes."""
    from attnbase.warehouse.runs import store as store_mod

    info = fake_info(rotary=True, n_kv_heads=1)
    cfg = fake_config(batch_size=batch_size)

    def files(root):
        return {p.relative_to(root): p.read_bytes()
                for p in sorted(root.rglob("c/**/*")) if p.is_file()}

    def run(name):
        db = Database(tmp_path / name)
        ingest_batches(db, "rt", cfg, info=info, corpus="default", corpus_hash="c",
                       batches=fake_batches(info, cfg, seed=3), progress=False)
        return files(db.store_path("rt"))

    direct = run("direct")
    monkeypatch.setattr(store_mod, "_chunk_encoder", lambda arr: None)
    through_zarr = run("zarr")
    assert direct.keys() == through_zarr.keys() and len(direct) > 10
    for key in direct:
        assert direct[key] == through_zarr[key], key
    # the compressed chains are among them (tokens and causal logits)
    assert any(k.parts[0] == "tokens" for k in direct)
