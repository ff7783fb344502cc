"""A statistics file of one run deleted while the service runs (issue 44, item 5): a question
that rules that run out by its run_id answers through ``POST /api/sql`` (the query process's
kept connection sees the file gone), one that takes it in is a JSON 5xx naming the file; with
the file back every question answers again."""

from __future__ import annotations

from serve_fixtures import Server


def test_a_file_deleted_under_the_server_fails_only_its_runs_questions(two_runs):
    import httpx

    db = two_runs
    srv = Server(db.path)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as api:
            def ask(sql):
                return api.post("/api/sql", json={"sql": sql})

            only_a = "SELECT count(*) AS n FROM col_stats WHERE run_id = 'a'"
            r = ask(only_a)
            assert r.status_code == 200, r.text
            n_a = r.json()["rows"][0][0]
            n_rows = ask("SELECT count(*) AS n FROM row_stats").json()["rows"][0][0]
            path = db.run("g").batch_file("col_stats", 1)
            saved = path.read_bytes()
            path.unlink()
            r = ask(only_a)  # the same query process, its connection kept
            assert r.status_code == 200 and r.json()["rows"][0][0] == n_a, r.text
            r = ask("SELECT count(*) AS n FROM row_stats")  # the other table lost nothing
            assert r.status_code == 200 and r.json()["rows"][0][0] == n_rows, r.text
            r = ask("SELECT count(*) AS n FROM col_stats")
            assert r.status_code == 500, r.text
            detail = r.json()["detail"]
            assert "\n" not in detail and detail.startswith("run 'g': col_stats file "), detail
            assert "col_stats/run_id=g/b000001.parquet" in detail and "missing" in detail
            assert "attnbase verify --run g" in detail, detail
            path.write_bytes(saved)  # control: back, and the whole answer comes back
            r = ask("SELECT count(*) AS n FROM col_stats")
            assert r.status_code == 200 and r.json()["rows"][0][0] == 2 * n_a, r.text
    finally:
        srv.stop()
