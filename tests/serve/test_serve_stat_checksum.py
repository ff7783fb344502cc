"""A byte flipped inside a statistics file's data page (issue 44, item 6): the bytes still
decode, to a different ``sum(sink_mass)``; the service checks each listed file's CRC-32C once
per version (path, size, mtime) and answers a question that reads the damaged file with a JSON
500 naming the run, the file and ``attnbase verify``, never with the changed sum. A question
that rules the run out answers; the file restored answers the right sum again."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from serve_fixtures import RUN, Server


def flip_in_page(path: Path, column: str = "sink_mass") -> bytes:
    """Flip one bit near the end of ``column``'s first data page (inside the values, which
    still decode); returns the file's original bytes."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(meta.column(i) for i in range(meta.num_columns)
                 if meta.column(i).path_in_schema == column)
    saved = path.read_bytes()
    data = bytearray(saved)
    data[chunk.data_page_offset + chunk.total_compressed_size - 12] ^= 0x40
    path.write_bytes(bytes(data))
    return saved


def test_a_flipped_data_page_is_refused_not_summed(two_runs):
    import httpx
    import pyarrow.parquet as pq

    db = two_runs
    path = db.run("g").batch_file("row_stats", 1)
    srv = Server(db.path)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as api:
            def total(where=""):
                return api.post("/api/sql", json={
                    "sql": f"SELECT sum(sink_mass) AS s FROM row_stats {where}"})

            r = total()  # control: the undamaged files answer the files' own sum
            assert r.status_code == 200, r.text
            right = r.json()["rows"][0][0]
            own = sum(sum(pq.read_table(f, columns=["sink_mass"])["sink_mass"].to_pylist())
                      for f in db.path.glob("row_stats/run_id=*/b*.parquet"))
            assert right == pytest.approx(own, rel=1e-12)
            only_a = total("WHERE run_id = 'a'").json()["rows"][0][0]
            saved = flip_in_page(path)
            changed = pq.read_table(path, columns=["sink_mass"])["sink_mass"].to_pylist()
            assert changed != pq.read_table(pa_buffer(saved), columns=["sink_mass"])[
                "sink_mass"].to_pylist()  # the damage decodes: a silent wrong sum unchecked
            r = total()
            assert r.status_code == 500, r.text
            detail = r.json()["detail"]
            assert "\n" not in detail and detail.startswith("run 'g': row_stats file "), detail
            assert "row_stats/run_id=g/b000001.parquet" in detail and "checksum" in detail
            assert "attnbase verify --run g" in detail, detail
            r = total("WHERE run_id = 'a'")  # a question without run g answers
            assert r.status_code == 200 and r.json()["rows"][0][0] == only_a, r.text
            path.write_bytes(saved)  # restored (a new mtime): checked again, answers again
            r = total()
            assert r.status_code == 200 and r.json()["rows"][0][0] == right, r.text
    finally:
        srv.stop()


def pa_buffer(data: bytes):
    import pyarrow as pa

    return pa.BufferReader(data)


@pytest.mark.slow
def test_the_head_page_refuses_a_damaged_row_stats_file(serve_db, tmp_path):
    import httpx

    from attnbase.warehouse import Database

    db = Path(shutil.copytree(serve_db, tmp_path / "db"))
    with Database(db).connect(read_only=True) as con:
        (rel,) = con.execute("SELECT path FROM stat_files WHERE run_id = ? AND "
                             "table_name = 'row_stats' ORDER BY path LIMIT 1", [RUN]).fetchone()
    srv = Server(db)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as api:
            assert api.get(f"/runs/{RUN}/heads/0/0?seq=0").status_code == 200  # control
            saved = flip_in_page(db / rel)
            r = api.get(f"/runs/{RUN}/heads/0/0?seq=0")
            assert r.status_code == 500, r.text[:300]
            assert "checksum" in r.text and f"attnbase verify --run {RUN}" in r.text
            (db / rel).write_bytes(saved)
            assert api.get(f"/runs/{RUN}/heads/0/0?seq=0").status_code == 200
    finally:
        srv.stop()


def test_each_file_version_is_checksummed_once(two_runs):
    from attnbase.serve.filecheck import FileCheck

    db = two_runs
    with db.connect(read_only=True) as con:
        listed = [tuple(r) for r in con.execute(
            "SELECT run_id, table_name, path, crc32c, size FROM stat_files ORDER BY path"
        ).fetchall()]
    for f in listed:  # written long ago: a checksum of them is kept
        os.utime(db.path / f[2], ns=(time.time_ns() - 10**10,) * 2)
    check = FileCheck(db.path)
    assert check.damaged(listed) == {} and check.checksummed == len(listed)
    assert check.damaged(listed) == {} and check.checksummed == len(listed)  # cached
    path = db.path / listed[0][2]
    saved = flip_in_page(path) if listed[0][1] == "row_stats" else None
    if saved is None:
        saved = flip_in_page(path, "received")
    bad = check.damaged(listed)
    assert list(bad) == [listed[0][2]] and check.checksummed == len(listed) + 1
    path.write_bytes(saved)  # restored at once: maybe the same mtime, so read again each time
    assert check.damaged(listed) == {} and check.checksummed == len(listed) + 2
    assert check.damaged(listed) == {} and check.checksummed == len(listed) + 3


def test_the_streamed_checksum_is_the_catalogs(tmp_path):
    from attnbase.serve.filecheck import READ_BYTES, file_crc32c
    from attnbase.warehouse.runs.handle import crc32c

    data = os.urandom(2 * READ_BYTES + 123)
    (tmp_path / "f").write_bytes(data)
    assert file_crc32c(tmp_path / "f") == crc32c(data)
    (tmp_path / "e").write_bytes(b"")
    assert file_crc32c(tmp_path / "e") == crc32c(b"")
