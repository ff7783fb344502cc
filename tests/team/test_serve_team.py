"""``attnbase serve --db postgresql://...``: a real server (stopped by PID) over a team database
on a real PostgreSQL: its pages read the lake's committed snapshots, its SQL cannot reach the
lake, its tokens live in the team database, and the password appears nowhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from fakes import fake_batches, fake_config, fake_info
from pgserver import free_port
from teamhelpers import attnbase

from attnbase.serve.lake_catalog import changed_tables

RUN = "a"


class TeamServer:
    """``attnbase serve --db URL`` in a process of its own; stopped by its PID."""

    def __init__(self, url: str, env: dict) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "attnbase.cli", "serve", "--db", url, "--port",
             str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.first_line = self.proc.stdout.readline().strip()
        if self.proc.poll() is not None or not self.first_line:
            raise RuntimeError(f"attnbase serve did not start: {self.proc.stderr.read()}")
        for _ in range(300):  # bounded: 30 s
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("attnbase serve never answered /healthz")

    def stop(self) -> str:
        """Stop it (SIGINT, then SIGKILL); its whole output."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        out, err = self.proc.communicate()
        return self.first_line + out + err


@pytest.fixture(scope="module")
def served(pg, tmp_path_factory):
    """A team database with one run, and a server over it; yields ``(url, server, seen)``
    where ``seen`` collects every answer's text (searched for the password at the end)."""
    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database

    os.environ["PGPASSWORD"] = pg.password
    url = pg.createdb("serve" + os.urandom(4).hex())
    data = tmp_path_factory.mktemp("serveteam") / "data"
    db = Database(url)
    db.catalog.create(str(data))
    info, cfg = fake_info(), fake_config()
    ingest_batches(db, RUN, cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "PGPASSWORD": pg.password, "HOME": str(home),
           "XDG_CACHE_HOME": str(home / ".cache")}
    server = TeamServer(url, env)
    seen: list[str] = []
    try:
        yield url, server, seen, env
    finally:
        log = server.stop()
        seen.append(log)
        assert pg.password not in "\n".join(seen)
        assert "database " + url in log


def _get(server, seen, path, **kw):
    r = httpx.get(server.base + path, timeout=60, **kw)
    seen.append(r.text + str(r.headers))
    return r


def _sql(server, seen, q, **kw):
    r = httpx.post(server.base + "/api/sql", json={"sql": q}, timeout=60, **kw)
    seen.append(r.text)
    return r


@pytest.mark.slow
def test_serve_over_a_team_database_answers_every_page(served):
    url, server, seen, _ = served
    for path in ("/", f"/runs/{RUN}", f"/runs/{RUN}/heads/0/0", "/api/runs",
                 f"/api/runs/{RUN}", f"/api/runs/{RUN}/heads/1/2",
                 f"/api/runs/{RUN}/heads/0/0/pattern?seq=1", "/sql"):
        r = _get(server, seen, path)
        assert r.status_code == 200, (path, r.text[:500])
        if path.startswith("/api/runs") or path == f"/runs/{RUN}":
            assert r.headers["etag"].endswith('-lake-' + r.headers["etag"].split("-lake-")[1])
    pattern = _get(server, seen, f"/api/runs/{RUN}/heads/0/0/pattern?seq=1").json()
    assert pattern["run_id"] == RUN and len(pattern["tokens"]) > 0
    r = _sql(server, seen, "SELECT run_id, status, (SELECT count(*) FROM row_stats) AS n "
                           "FROM runs")
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == [[RUN, "complete", r.json()["rows"][0][2]]]
    assert r.json()["rows"][0][2] > 0


@pytest.mark.slow
def test_sql_over_a_served_team_database_cannot_write_attach_or_reach_the_lake(served, pg):
    url, server, seen, _ = served
    for q in ("INSERT INTO runs (run_id) VALUES ('x')",
              "ATTACH 'ducklake:postgres:dbname=postgres' AS p",
              f"ATTACH 'postgres:{url}' AS p",
              "SELECT * FROM __ducklake_metadata_lake.public.ducklake_snapshot",
              "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'select 1')",
              "SELECT * FROM postgres_scan('dbname=postgres', 'public', 'attnbase_team')",
              "SELECT * FROM ducklake_snapshots('lake')",
              "SELECT * FROM duckdb_databases()",
              "SELECT * FROM duckdb_secrets()",
              "SELECT getenv('PGPASSWORD')",
              "SELECT current_setting('file_search_path')",
              "SELECT * FROM api_tokens",
              "SELECT * FROM attnbase_ledger.attnbase_ledger.version",
              "SELECT * FROM read_text('/proc/self/environ')"):
        r = _sql(server, seen, q)
        assert 400 <= r.status_code < 500, (q, r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/json"), q
        assert "detail" in r.json()
    # the query processes' DuckDB holds the local snapshot file alone: no lake to name
    r = _sql(server, seen, "SELECT table_catalog FROM information_schema.tables "
                           "GROUP BY ALL ORDER BY ALL")
    assert r.status_code == 200, r.text
    assert [row[0] for row in r.json()["rows"]] != [] and not any(
        "ducklake" in row[0] or row[0] in ("lake", "attnbase_ledger")
        for row in r.json()["rows"])


def _next_etag(server, seen, before: str, timeout_s: float = 10.0) -> str:
    """The ETag of ``/api/runs`` once it differs from ``before`` (fails after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        after = _get(server, seen, "/api/runs").headers["etag"]
        if after != before:
            return after
        time.sleep(0.1)
    raise AssertionError(f"the ETag stayed {before} for {timeout_s:.0f} s")


@pytest.mark.slow
def test_a_committed_batch_becomes_visible_and_an_open_one_does_not(served):
    from attnbase.warehouse import Database

    url, server, seen, _ = served
    count = "SELECT count(*) FROM run_metrics WHERE run_id = 'a'"
    before = _get(server, seen, "/api/runs").headers["etag"]
    n0 = _sql(server, seen, count).json()["rows"][0][0]
    db = Database(url)
    with db.transaction() as con:  # a writer's open transaction: not committed yet
        con.execute("INSERT INTO run_metrics (run_id, metric, value) VALUES ('a', 'probe', 1)")
        time.sleep(0.5)  # past the service's poll of the snapshot number
        assert _sql(server, seen, count).json()["rows"][0][0] == n0
        assert _get(server, seen, "/api/runs").headers["etag"] == before
    after = _next_etag(server, seen, before)
    assert _sql(server, seen, count).json()["rows"][0][0] == n0 + 1
    # the old tag is no longer current; the new one answers 304
    assert _get(server, seen, "/api/runs", headers={"If-None-Match": after}).status_code == 304
    assert _get(server, seen, "/api/runs", headers={"If-None-Match": before}).status_code == 200


@pytest.mark.slow
def test_a_ledger_transaction_alone_is_seen_once_committed(served):
    """A batch mark makes no DuckLake snapshot: the service's state includes the ledger's
    version, so the mark's commit changes the ETag and the copy, and an open one changes
    neither."""
    from attnbase.warehouse import Database

    url, server, seen, _ = served
    done = f"SELECT count(*) FROM batches WHERE run_id = '{RUN}' AND status = 'complete'"
    before = _get(server, seen, "/api/runs").headers["etag"]
    n0 = _sql(server, seen, done).json()["rows"][0][0]
    db = Database(url)
    with db.ledger() as led:
        led.set_status(RUN, [0], "pending")
        time.sleep(0.5)  # past the service's poll
        assert _sql(server, seen, done).json()["rows"][0][0] == n0
        assert _get(server, seen, "/api/runs").headers["etag"] == before
    after = _next_etag(server, seen, before)
    assert _sql(server, seen, done).json()["rows"][0][0] == n0 - 1
    with db.ledger() as led:  # put back for the tests after this one
        led.set_status(RUN, [0], "complete", written_at=None)
    for _ in range(100):
        if _sql(server, seen, done).json()["rows"][0][0] == n0:
            break
        time.sleep(0.1)
    assert _sql(server, seen, done).json()["rows"][0][0] == n0


@pytest.mark.slow
def test_a_report_of_a_team_database_is_served_by_its_server(served):
    url, server, seen, env = served
    assert _get(server, seen, f"/reports/{RUN}/report.html").status_code == 404
    made = attnbase("report", "--db", url, "--run", RUN, env=env)
    seen.append(made.stdout + made.stderr)
    html = made.stdout.strip().splitlines()[-2]
    assert html.endswith(f"reports/{RUN}/report.html")
    r = _get(server, seen, f"/reports/{RUN}/report.html")
    assert r.status_code == 200 and url in r.text  # it names the database by its address
    assert "<html" in r.text.lower()


@pytest.mark.slow
def test_tokens_of_a_team_database_guard_its_server(served, child_env):
    url, server, seen, env = served
    made = attnbase("token", "create", "--db", url, "--name", "analyst", env=env)
    seen.append(made.stdout + made.stderr)
    token = made.stdout.strip().splitlines()[-1]
    assert token.startswith("ab_")
    for _ in range(100):  # bounded: 10 s, until the server's snapshot holds the token
        if _get(server, seen, "/api/runs").status_code == 401:
            break
        time.sleep(0.1)
    assert _get(server, seen, "/api/runs").status_code == 401
    ok = _get(server, seen, "/api/runs", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200 and ok.json()
    listed = attnbase("token", "list", "--db", url, env=env)
    seen.append(listed.stdout + listed.stderr)
    assert "analyst" in listed.stdout and token not in listed.stdout
    gone = attnbase("token", "delete", "--db", url, "--name", "analyst", env=env)
    seen.append(gone.stdout + gone.stderr)
    for _ in range(100):
        if _get(server, seen, "/api/runs").status_code == 200:
            break
        time.sleep(0.1)
    assert _get(server, seen, "/api/runs").status_code == 200


def test_only_row_changes_of_known_tables_copy_just_those_tables():
    names = {5: "runs", 8: "batches", 20: "stat_files"}
    assert changed_tables(["inlined_insert:8,inlined_delete:8", "inserted_into_table:20"],
                          names) == {"batches", "stat_files"}
    assert changed_tables([], names) == set()
    # anything else (a table made, altered or dropped; an unknown id): copy every table
    assert changed_tables(['created_table:"main"."x"'], names) is None
    assert changed_tables(["altered_table:5"], names) is None
    assert changed_tables(["inlined_insert:99"], names) is None


def _doc_block(lang: str) -> str:
    """The first ``lang`` block of docs/scaling.md's section on reading a team database."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text()
    section = text[text.index("### Analysts read it live"):]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1).strip()


@pytest.mark.slow
def test_the_docs_one_liners_attach_the_lake_read_only(team, pg):
    import duckdb

    import attnbase
    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database
    from attnbase.warehouse.catalog.lake_extensions import extension_files
    from attnbase.warehouse.catalog.team_url import TeamURL

    url, _ = team
    info, cfg = fake_info(), fake_config()
    ingest_batches(Database(url), RUN, cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    u = TeamURL.parse(url)
    # the plain DuckDB session: the docs' line with this server's address (the extensions
    # loaded from their wheels, as INSTALL would fetch them)
    sql = _doc_block("sql").replace("dbname=attnbase host=db.example.org port=5432 user=attnbase",
                                    u.conninfo())
    assert u.conninfo() in sql
    con = duckdb.connect()
    for f in extension_files():
        con.execute(f"LOAD '{f}'")
    con.execute(sql)
    assert con.execute("SELECT run_id, status FROM runs").fetchall() == [(RUN, "complete")]
    n_batches = con.execute("SELECT count(*) FILTER (WHERE status = 'complete'), count(*) "
                            "FROM batches").fetchone()
    assert n_batches[0] == n_batches[1] > 0  # the ledger's views read PostgreSQL's tables
    with pytest.raises(duckdb.Error, match="read-only|read only"):
        con.execute("INSERT INTO run_metrics (run_id, metric, value) VALUES ('a', 'x', 1)")
    with pytest.raises(duckdb.Error, match="read-only|read only"):
        con.execute("DELETE FROM attnbase_ledger.attnbase_ledger.batches")
    con.close()
    # the notebook: the docs' line, with this address
    line = _doc_block("python").replace("postgresql://attnbase@db.example.org:5432/attnbase", url)
    assert url in line
    scope = {"attnbase": attnbase}
    exec(line, scope)
    con = scope["con"]
    n = con.execute("SELECT count(*) FROM row_stats WHERE run_id = ?", [RUN]).fetchone()[0]
    assert n > 0  # the views read the listed statistics files
    with pytest.raises(duckdb.Error, match="read-only|read only"):
        con.execute("DELETE FROM runs")
    con.close()


@pytest.mark.slow
def test_while_postgresql_is_away_the_last_snapshot_answers(served, pg):
    from attnbase.warehouse import Database

    url, server, seen, _ = served
    tag = _get(server, seen, "/api/runs").headers["etag"]
    pg.crash()  # pg_ctl stop -m immediate
    try:
        time.sleep(0.5)  # past the service's poll of the snapshot number
        for path in ("/api/runs", f"/runs/{RUN}", f"/api/runs/{RUN}/heads/0/0/pattern?seq=0"):
            r = _get(server, seen, path)
            assert r.status_code == 200, (path, r.text[:300])
            assert r.headers["etag"] == tag
        assert _sql(server, seen, "SELECT count(*) FROM runs").status_code == 200
    finally:
        pg.start()
    with Database(url).transaction() as con:  # back: the next commit is seen again
        con.execute("INSERT INTO run_metrics (run_id, metric, value) VALUES ('a', 'back', 1)")
    _next_etag(server, seen, tag)  # the failed poll is retried after 1 s
    r = _sql(server, seen, "SELECT count(*) FROM run_metrics WHERE metric = 'back'")
    assert r.json()["rows"] == [[1]]


@pytest.mark.slow
def test_serve_over_a_team_database_whose_data_is_on_s3(pg, tmp_path, monkeypatch):
    """Runs and the lake's Parquet files in a bucket (moto in server mode): the server's copies
    of the lake read them, its pages and SQL read the run's files in the bucket, and neither the
    password nor the S3 secret appears in an answer or the log."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "s3"))
    from s3_server import SECRET, aws_env, make_bucket, start_moto, stop_moto

    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database

    proc, endpoint = start_moto()
    server = None
    seen: list[str] = []
    try:
        env = {**os.environ, **aws_env(endpoint), "PGPASSWORD": pg.password,
               "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
        for k in ("PGPASSWORD", "XDG_CACHE_HOME", *aws_env(endpoint)):
            monkeypatch.setenv(k, env[k])
        url = pg.createdb("s3serve" + os.urandom(4).hex())
        db = Database(url)
        db.catalog.create(f"s3://{make_bucket(endpoint)}/team")
        info, cfg = fake_info(), fake_config()
        ingest_batches(db, RUN, cfg, info=info, corpus="default", corpus_hash="c0",
                       batches=fake_batches(info, cfg), progress=False)
        assert db.store_url(RUN).startswith("s3://")
        server = TeamServer(url, env)
        for path in (f"/runs/{RUN}", f"/runs/{RUN}/heads/0/0",
                     f"/api/runs/{RUN}/heads/0/0/pattern?seq=1"):
            r = _get(server, seen, path)
            assert r.status_code == 200, (path, r.text[:300])
        r = _sql(server, seen, f"SELECT count(*) FROM row_stats WHERE run_id = '{RUN}'")
        assert r.status_code == 200 and r.json()["rows"][0][0] > 0, r.text
    finally:
        if server is not None:
            seen.append(server.stop())
        stop_moto(proc)
    text = "\n".join(seen)
    assert pg.password not in text and SECRET not in text


@pytest.mark.slow
def test_a_damaged_statistics_file_of_a_team_database_is_refused_not_summed(served):
    """The service's checksum of each listed file holds over a team database too."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))
    from test_serve_stat_checksum import flip_in_page

    from attnbase.warehouse import Database

    url, server, seen, _ = served
    q = "SELECT sum(sink_mass) AS s FROM row_stats"
    right = _sql(server, seen, q)
    assert right.status_code == 200, right.text  # control: the file as written
    path = Database(url).run(RUN).batch_file("row_stats", 1)
    saved = flip_in_page(path)
    try:
        r = _sql(server, seen, q)
        assert r.status_code == 500, r.text
        detail = r.json()["detail"]
        assert detail.startswith(f"run '{RUN}': row_stats file ") and "checksum" in detail
        assert f"attnbase verify --run {RUN}" in detail and str(path.parent) not in detail
    finally:
        path.write_bytes(saved)
        os.utime(path, (time.time() - 5, time.time() - 5))  # a new version: checked again
    assert _sql(server, seen, q).json()["rows"] == right.json()["rows"]
