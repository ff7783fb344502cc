"""Tokens: ``attnbase token create|list|revoke`` and a real server that needs them; Ctrl-C.

A copy of the session database gets tokens (so the other module's server stays open); its server
runs with ``--access-log`` so that the log can be searched for the tokens.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time

import httpx
import pytest
from serve_fixtures import RUN, Server




@pytest.fixture(scope="module")
def auth_db(serve_db, tmp_path_factory):
    db = tmp_path_factory.mktemp("auth") / "db"
    shutil.copytree(serve_db, db)
    return db


@pytest.fixture(scope="module")
def tokens(auth_db):
    """Made by the command's own function; ``test_token_cli`` drives the command itself."""
    from attnbase.serve.auth import create_token
    from attnbase.warehouse import Database

    db = Database(auth_db)
    return {"alice": create_token(db, "alice"), "bob": create_token(db, "bob"),
            "soon": create_token(db, "soon", expires_days=1)}


def test_token_cli(cli, auth_db, tokens):
    code, out, err = cli("token", "create", "--db", auth_db, "--name", "carol",
                         "--expires-days", "30")
    assert code == 0, err
    token = out.strip().splitlines()[-1]  # the last line is the token alone
    assert token.startswith("ab_") and len(token) == 46 and token not in out.splitlines()[0]
    code, out, _ = cli("token", "list", "--db", auth_db)
    assert code == 0 and "alice\tactive" in out and "carol\tactive" in out
    assert all(t not in out for t in [*tokens.values(), token])
    code, _, err = cli("token", "create", "--db", auth_db, "--name", "alice")
    assert code == 2 and "exists already" in err and err.count("\n") == 1
    code, _, err = cli("token", "revoke", "--db", auth_db, "--name", "nobody")
    assert code == 2 and "no token named 'nobody'" in err
    code, _, err = cli("token", "create", "--db", auth_db, "--name", "bad name!")
    assert code == 2 and "not valid" in err


@pytest.fixture(scope="module")
def auth_server(auth_db, tokens):
    srv = Server(auth_db, "--access-log", "--sql-time-limit-ms", "20000")
    yield srv
    srv.stop()


def test_only_hashes_are_stored(auth_db, tokens):
    import duckdb

    raw = (auth_db / "catalog.duckdb").read_bytes()
    assert all(t.encode() not in raw for t in tokens.values())
    with duckdb.connect(str(auth_db / "catalog.duckdb"), read_only=True) as con:
        hashes = [h for (h,) in con.execute("SELECT token_sha256 FROM api_tokens").fetchall()]
    import hashlib

    assert {hashlib.sha256(t.encode()).hexdigest() for t in tokens.values()} <= set(hashes)
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in hashes)


def test_bearer_needed_everywhere_but_healthz(auth_server, tokens):
    url = auth_server.url
    assert httpx.get(url + "/healthz").status_code == 200
    for path in ("/api/runs", f"/api/runs/{RUN}/heads/0/0", "/api/openapi.json"):
        r = httpx.get(url + path)
        assert r.status_code == 401 and "missing API token" in r.json()["detail"]
        r = httpx.get(url + path, headers={"Authorization": "Bearer ab_wrong"})
        assert r.status_code == 401 and "wrong API token" in r.json()["detail"]
        r = httpx.get(url + path, headers={"Authorization": f"Bearer {tokens['alice']}"})
        assert r.status_code == 200
    r = httpx.post(url + "/api/sql", json={"sql": "select 1"})
    assert r.status_code == 401
    r = httpx.post(url + "/api/sql", json={"sql": "select 1 as a"},
                   headers={"Authorization": f"Bearer {tokens['alice']}"})
    assert r.status_code == 200 and r.json()["rows"] == [[1]]
    # a page without a token goes to the login form
    r = httpx.get(url + f"/runs/{RUN}")
    assert r.status_code == 303 and r.headers["location"].startswith("/login?next=")


def test_login_form_sets_httponly_cookie(auth_server, tokens):
    with httpx.Client(base_url=auth_server.url) as c:
        r = c.post("/login", data={"token": "ab_wrong", "next": f"/runs/{RUN}"})
        assert r.status_code == 401 and "wrong API token" in r.text
        r = c.post("/login", data={"token": tokens["bob"], "next": f"/runs/{RUN}"})
        assert r.status_code == 303 and r.headers["location"] == f"/runs/{RUN}"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        page = c.get(f"/runs/{RUN}")
        assert page.status_code == 200 and 'id="head-grid"' in page.text
        assert c.post("/login", data={"token": tokens["bob"], "next": "//evil.example/"}
                      ).headers["location"] == "/"


def test_revoked_and_expired_tokens_get_401(cli, auth_server, auth_db, tokens):
    import duckdb

    h = {"Authorization": f"Bearer {tokens['soon']}"}
    assert httpx.get(auth_server.url + "/api/runs", headers=h).status_code == 200
    # another process writes the catalog while the server reads it: expire 'soon'
    with duckdb.connect(str(auth_db / "catalog.duckdb")) as con:
        con.execute("UPDATE api_tokens SET expires_at = TIMESTAMP '2000-01-01' "
                    "WHERE name = 'soon'")
    r = httpx.get(auth_server.url + "/api/runs", headers=h)
    assert r.status_code == 401 and "expired" in r.json()["detail"]
    code, out, _ = cli("token", "revoke", "--db", auth_db, "--name", "bob")
    assert code == 0 and "revoked" in out
    r = httpx.get(auth_server.url + "/api/runs",
                  headers={"Authorization": f"Bearer {tokens['bob']}"})
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    r = httpx.get(auth_server.url + "/api/runs",
                  headers={"Authorization": f"Bearer {tokens['alice']}"})
    assert r.status_code == 200


QS_SECRET = "qs-secret-5b2d"


def test_query_strings_reach_the_server_not_the_log(auth_server, tokens):
    """The log is read by the last test: these paths must appear there without their query."""
    h = {"Authorization": f"Bearer {tokens['alice']}"}
    r = httpx.get(auth_server.url + f"/api/runs?token={QS_SECRET}", headers=h)
    assert r.status_code == 200
    r = httpx.get(auth_server.url + "/sql", params={"sql": f"select '{QS_SECRET}' as s"},
                  headers=h)
    assert r.status_code == 200 and QS_SECRET in r.text  # control: the query did reach it


def test_ctrl_c_stops_within_2s_and_no_token_was_logged(auth_server, tokens):
    """Last in the module: SIGINT while a runaway query runs; then read the whole log."""
    h = {"Authorization": f"Bearer {tokens['alice']}"}
    out = {}

    def runaway():
        try:
            r = httpx.post(auth_server.url + "/api/sql", headers=h, timeout=30, json={
                "sql": "select count(*) from row_stats a, row_stats b, row_stats c "
                       "where a.entropy + b.entropy > c.entropy"})
            out["code"] = r.status_code
        except httpx.TransportError as err:
            out["code"] = type(err).__name__

    t = threading.Thread(target=runaway)
    t.start()
    time.sleep(0.5)
    took = auth_server.stop(signal.SIGINT)
    t.join(10)
    assert took < 2.0, f"Ctrl-C took {took:.2f} s"
    assert out["code"] in (400, "RemoteProtocolError", "ReadError")
    log = auth_server.proc.stdout.read() + auth_server.proc.stderr.read()
    assert "GET /api/runs" in log  # the access log was on
    assert all(t not in log for t in tokens.values())
    assert QS_SECRET not in log and "GET /sql " in log  # paths without query strings


@pytest.mark.slow
def test_token_lifecycle_back_to_open_loopback(cli, serve_db, tmp_path):
    """Expiry in hours; revoking the last active token says what follows; deleting every token
    reopens the server on loopback."""
    db = tmp_path / "db"
    shutil.copytree(serve_db, db)
    code, out, err = cli("token", "create", "--db", db, "--name", "ci", "--expires-hours", "2")
    assert code == 0 and "expires in 2 hours" in out, err
    token = out.strip().splitlines()[-1]
    code, out, _ = cli("token", "list", "--db", db)
    assert code == 0 and out.startswith("ci\tactive")
    srv = Server(db)
    try:
        h = {"Authorization": f"Bearer {token}"}
        assert httpx.get(srv.url + "/api/runs", headers=h).status_code == 200
        assert httpx.get(srv.url + "/api/runs").status_code == 401
        code, out, _ = cli("token", "revoke", "--db", db, "--name", "ci")
        assert code == 0 and "last active one" in out and "token delete" in out
        assert httpx.get(srv.url + "/api/runs", headers=h).status_code == 401
        assert httpx.get(srv.url + "/api/runs").status_code == 401  # control: still closed
        code, out, _ = cli("token", "delete", "--db", db, "--name", "ci")
        assert code == 0 and "no tokens left" in out
        assert httpx.get(srv.url + "/api/runs").status_code == 200  # open again on loopback
        code, _, err = cli("token", "delete", "--db", db, "--name", "ci")
        assert code == 2 and "no token named 'ci'" in err
    finally:
        srv.stop()
