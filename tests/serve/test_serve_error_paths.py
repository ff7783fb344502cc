"""Error pages and JSON errors never show the server's absolute paths (issue 44, one-line
list): a real server over a database in its user's home directory, asked questions that fail
(an unknown run or page, bad SQL, a damaged chunk whose message names its file), answers with
the file named relative to the database directory, and neither the database's absolute path
nor the home directory appears in any answer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from serve_fixtures import Server

sys.path.insert(0, str(Path(__file__).parents[1] / "warehouse"))

CHUNK = "runs/a/store.zarr/attn_logits/c/0/0/0/0/0"


@pytest.mark.slow
def test_no_error_answer_names_a_server_path(tmp_path):
    import httpx
    from fakes import fake_batches, fake_config, fake_info

    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database

    home = tmp_path / "home" / "someone"
    db = Database(home / "db")
    info, cfg = fake_info(), fake_config()
    ingest_batches(db, "a", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    chunk = db.path / CHUNK
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x55
    chunk.write_bytes(bytes(data))
    srv = Server(db.path, env={"HOME": str(home)})
    answers = {}
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as api:
            for path in ("/api/runs/a/heads/0/0/pattern?seq=0", "/runs/a/heads/0/0?seq=0",
                         "/api/runs/nope", "/runs/nope", "/no/such/page", "/reports/a/x.html",
                         "/sql?sql=select+*+from+nope",
                         "/sql?sql=select+*+from+read_parquet('runs/a/store.zarr/zarr.json')"):
                r = api.get(path)
                answers[path] = (r.status_code, r.text)
            for sql in ("select * from nope",
                        "select * from read_parquet('runs/a/store.zarr/zarr.json')",
                        f"select * from read_parquet('{db.path}/row_stats/x.parquet')"):
                r = api.post("/api/sql", json={"sql": sql})
                answers[sql] = (r.status_code, r.text)
    finally:
        srv.stop()
    assert all(code >= 400 for code, _ in answers.values()), answers
    leaks = {k: text for k, (_, text) in answers.items() if str(home) in text
             or str(home.resolve()) in text}
    assert not leaks, leaks
    code, text = answers["/api/runs/a/heads/0/0/pattern?seq=0"]  # control: the file is named
    assert code == 500 and f"({CHUNK})" in text and "attnbase extract" in text, text
