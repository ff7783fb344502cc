"""The service reads what the ledger counts and names damage right: a pending batch's
sequences, a stray and a partial statistics file are invisible to the pattern route and to SQL;
a damaged ``keys`` chunk is named as ``keys``; a damaged statistics file is a JSON 5xx naming it."""

from __future__ import annotations

import shutil

import pytest
from serve_fixtures import RUN, Server


@pytest.fixture(scope="module")
def damaged_db(serve_db, tmp_path_factory):
    path = tmp_path_factory.mktemp("integrity") / "db"
    shutil.copytree(serve_db, path)
    return path


@pytest.fixture(scope="module")
def api(damaged_db):
    import httpx

    srv = Server(damaged_db)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            yield c
    finally:
        srv.stop()


def _count(api, seq_lo, seq_hi):
    r = api.post("/api/sql", json={"sql": f"SELECT count(*) AS n FROM row_stats WHERE run_id = "
                                          f"'{RUN}' AND seq BETWEEN {seq_lo} AND {seq_hi}"})
    assert r.status_code == 200, r.text
    return r.json()["rows"][0][0] if "rows" in r.json() else r.json()["data"][0]["n"]


def _pattern(api, layer, seq):
    return api.get(f"/api/runs/{RUN}/heads/{layer}/0/pattern", params={"seq": seq})


def test_pending_stray_and_partial_are_invisible(api, damaged_db):
    from attnbase.warehouse import Database

    db = Database(damaged_db)
    run = db.run(RUN)
    per_batch = _count(api, 4, 7)
    assert per_batch > 0 and _pattern(api, 0, 5).status_code == 200  # control
    d = run.table_dir("row_stats")
    shutil.copy(run.batch_file("row_stats", 0), d / "b000000 copy.parquet")  # a stray copy
    shutil.copy(run.batch_file("row_stats", 0), d / "b000001.parquet.partial")
    with db.ledger() as con:  # batch 1 (seqs 4-7): chunks and files there, ledger mark not
        con.execute("UPDATE batches SET status = 'pending' WHERE run_id = ? AND batch = 1", [RUN])
        con.execute("DELETE FROM stat_files WHERE run_id = ? AND batch = 1", [RUN])
    assert _count(api, 4, 7) == 0 and _count(api, 0, 3) == per_batch
    r = _pattern(api, 0, 5)
    assert r.status_code == 404 and "batch 1 is not complete" in r.json()["detail"], r.text
    assert _pattern(api, 0, 1).status_code == 200


def test_a_damaged_keys_chunk_is_named_keys(api, damaged_db):
    from attnbase.warehouse import Database

    chunk = Database(damaged_db).run(RUN).store_path / "keys" / "c" / "1" / "0" / "0" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    r = _pattern(api, 1, 2)
    assert r.status_code == 500, r.text
    detail = r.json()["detail"]
    assert "array 'keys' chunk (1, 0, 0, 0, 0)" in detail and "--repair" in detail, detail
    assert "queries" not in detail


def test_a_damaged_statistics_file_is_a_json_5xx_naming_it(api, damaged_db):
    from attnbase.warehouse import Database

    path = Database(damaged_db).run(RUN).batch_file("row_stats", 0)
    path.write_bytes(path.read_bytes()[:-40])
    r = api.post("/api/sql", json={"sql": f"SELECT count(*) FROM row_stats WHERE run_id = "
                                          f"'{RUN}'"})
    assert r.status_code == 500, r.text
    detail = r.json()["detail"]
    assert "row_stats/run_id=tiny-a/b000000.parquet" in detail and "--repair" in detail, detail
    r = api.get(f"/runs/{RUN}/heads/0/0", params={"seq": 1})  # the head page reads that file
    assert r.status_code == 500 and "b000000.parquet" in r.text and "Traceback" not in r.text


def test_a_changed_recipe_in_the_store_is_a_json_5xx_not_changed_probabilities(serve_db, tmp_path):
    """Issue 44 item 1: the store's copy of the logits recipe (zarr.json) changed by one
    character answers a one-line JSON 500 naming the run and ``verify``, not other numbers."""
    import json

    import httpx

    path = tmp_path / "db"
    shutil.copytree(serve_db, path)
    zj = path / "runs" / RUN / "store.zarr" / "zarr.json"
    meta = json.loads(zj.read_text())
    rec = meta["attributes"]["attnbase_derived"]["attn_logits"]
    rec["scale"][0] = float(str(rec["scale"][0]).replace("5", "6", 1))
    zj.write_text(json.dumps(meta))
    srv = Server(path)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as api:
            r = _pattern(api, 0, 0)
            assert r.status_code == 500, r.text
            detail = r.json()["detail"]
            assert "\n" not in detail and f"run '{RUN}'" in detail and "recipe" in detail, detail
            assert f"attnbase verify --run {RUN}" in detail, detail
            assert str(path) not in detail, detail  # no machine path
            # control: what the recipe plays no part in still answers
            assert api.get(f"/api/runs/{RUN}/heads/0/0").status_code == 200
    finally:
        srv.stop()


def test_a_missing_chunk_of_a_complete_batch_is_a_json_5xx(serve_db, tmp_path):
    """Issue 44 item 3: a chunk file deleted from a complete run is a JSON 500 naming the chunk
    and the fix, not "not written yet"; the other batch still answers."""
    import httpx

    path = tmp_path / "db"
    shutil.copytree(serve_db, path)
    (path / "runs" / RUN / "store.zarr" / "queries" / "c" / "1" / "0" / "0" / "0" / "0").unlink()
    srv = Server(path)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as api:
            r = _pattern(api, 1, 2)  # layer 1, seq 2: batch 0
            assert r.status_code == 500, r.text
            detail = r.json()["detail"]
            assert "not written yet" not in detail, detail
            assert "array 'queries' chunk (1, 0, 0, 0, 0)" in detail and "missing" in detail
            assert "batch 0 complete" in detail and "--repair" in detail, detail
            assert str(path) not in detail, detail
            assert _pattern(api, 1, 5).status_code == 200  # control: batch 1 is whole
            assert _pattern(api, 0, 2).status_code == 200  # control: layer 0's chunk is there
    finally:
        srv.stop()
