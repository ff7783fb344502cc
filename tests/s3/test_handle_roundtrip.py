"""One set of round-trip tests run against both kinds of run handle: a run under the database
directory and a run on object storage (a real moto S3 server). Whatever the warehouse does with
a run's bytes goes through :class:`~attnbase.warehouse.runs.handle.RunHandle`, so each test here
holds for both."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "warehouse"))


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """``(Database, store root or None)`` of each kind."""
    from attnbase.warehouse import Database

    store = None if request.param == "local" else f"{request.getfixturevalue('s3_bucket')}/runs"
    return Database(tmp_path / "db", lock_timeout=0.3), store


@pytest.fixture
def run(where):
    """A complete fake run 'r1' of each kind; returns (db, handle, info, cfg)."""
    from fakes import fake_batches, fake_config, fake_info

    from attnbase.runner import ingest_batches

    db, store = where
    info, cfg = fake_info(rotary=True, n_kv_heads=1), fake_config()
    ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False, store=store)
    return db, db.run("r1"), info, cfg


def test_the_resolver_names_the_kind_from_the_catalog(run, where):
    db, handle, _, _ = run
    _, store = where
    assert handle.remote == (store is not None)
    assert handle.url == (None if store is None else f"{store}/r1")
    want = (f"{store}/r1/store.zarr" if store else str(db.path / "runs" / "r1" / "store.zarr"))
    assert str(handle.store_path) == want
    assert db.find_run("r1")["store_url"] == handle.url
    # the handle is plain data: equal handles for equal places, and picklable (a Dask job)
    import pickle

    assert pickle.loads(pickle.dumps(handle)) == handle


def test_put_get_sizes_checksum_delete(run):
    import google_crc32c

    _, handle, _, _ = run
    data = bytes(range(256)) * 33
    path = handle.table_dir("row_stats") / "probe.bin"
    assert not handle.exists(path)
    handle.put(path, data)
    assert handle.exists(path)
    assert handle.get(path) == data
    assert handle.sizes(handle.table_dir("row_stats"))["probe.bin"] == len(data)
    assert handle.checksum(path) == (google_crc32c.value(data), len(data))
    assert handle.checksum(path) != (google_crc32c.value(data[:-1] + b"x"), len(data))  # control
    handle.delete(path)
    assert not handle.exists(path)
    handle.delete(path)  # absent: nothing


def test_arrays_read_back_as_written(run):
    from fakes import expected_arrays

    _, handle, info, cfg = run
    want = expected_arrays(info, cfg)
    store = handle.store()
    for name in ("tokens", "keys", "queries"):
        assert np.array_equal(store.read(name), want[name], equal_nan=True), name


def test_statistics_files_read_back_through_the_handle(run):
    from attnbase.warehouse.runs.statfiles import run_files_connection

    db, handle, info, cfg = run
    n_rows = info.n_layers * info.n_heads * cfg.n_seqs * cfg.seq_len
    from attnbase.warehouse.catalog.statledger import listed

    with db.connect(read_only=True) as cat:
        files = [(f.table, f.path) for f in listed(cat, "r1")]
    assert len(files) == 2 * 3  # a row and a col file per batch, listed in the catalog
    con = run_files_connection(handle, files)
    try:
        assert con.execute("SELECT count(*) FROM row_stats").fetchone()[0] == n_rows
        assert con.execute("SELECT count(*) FROM col_stats").fetchone()[0] == n_rows
    finally:
        con.close()
    from attnbase.warehouse import read_sql

    got = read_sql(db, "SELECT count(*) AS n FROM row_stats WHERE run_id = 'r1'").rows()
    assert got[0][0] == n_rows


def test_verify_is_clean_and_names_a_flipped_chunk(run):
    from attnbase.warehouse.runs.verify import verify

    db, handle, _, _ = run
    assert verify(db, "r1").ok
    chunk = handle.store_path / "tokens" / "c" / "1" / "0"
    good = handle.get(chunk)
    handle.put(chunk, good[:3] + bytes([good[3] ^ 0xFF]) + good[4:])
    problems = verify(db, "r1").problems
    assert [p.array for p in problems] == ["tokens"] and problems[0].chunk == (1, 0)
    handle.put(chunk, good)
    assert verify(db, "r1").ok


def test_delete_run_removes_every_byte(run):
    db, handle, _, _ = run
    assert handle.sizes(handle.base)
    db.delete_run("r1")
    assert handle.sizes(handle.base) == {}
    for table in ("row_stats", "col_stats"):
        assert handle.sizes(handle.table_dir(table)) == {}
    assert db.find_run("r1") is None
