"""``/flows`` and ``/api/flows`` over real HTTP: off without ``--prefect-api`` (404 with the
hint), 503 in one line when the Prefect server does not answer, and (slow) the deployments,
cron schedule and last run of a real ``prefect server start``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
from serve_fixtures import Server, free_port

from attnbase.flows.serving import OFFLINE_ENV, server_healthy


def test_flows_off_without_prefect_api(serve_db):
    srv = Server(serve_db, env={"PREFECT_API_URL": ""})  # empty: click reads it as unset
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            r = c.get("/api/flows")
            assert r.status_code == 404
            detail = r.json()["detail"]
            assert "--prefect-api" in detail and "\n" not in detail
            page = c.get("/flows")
            assert page.status_code == 404 and "--prefect-api" in page.text
            assert 'href="/flows"' not in c.get("/").text  # the nav links only when configured
    finally:
        srv.stop()


def test_flows_unreachable_or_silent_prefect_is_503_one_line(serve_db):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"  # nothing listens there (yet)
    srv = Server(serve_db, "--prefect-api", api)
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            t0 = time.monotonic()
            r = c.get("/api/flows")
            assert time.monotonic() - t0 < 5
            assert r.status_code == 503
            detail = r.json()["detail"]
            assert api in detail and "did not answer" in detail and "\n" not in detail
            page = c.get("/flows")
            assert page.status_code == 503 and "did not answer" in page.text
            assert "Traceback" not in page.text
            assert 'href="/flows"' in c.get("/").text
            # now something listens there but never answers: bounded by prefect_timeout_s (3 s)
            with socket.socket() as silent:
                silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                silent.bind(("127.0.0.1", port))
                silent.listen(8)
                t0 = time.monotonic()
                r = c.get("/api/flows")
                waited = time.monotonic() - t0
            assert r.status_code == 503 and "ReadTimeout" in r.json()["detail"]
            assert 2.5 < waited < 6
    finally:
        srv.stop()


RUN_FLOW = textwrap.dedent("""
    from prefect import flow

    @flow(name="attnbase-probe", flow_run_name="probe-run-1")
    def probe():
        return 1

    probe()
""")


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A real ``prefect server start`` on a free loopback port; stopped by PID (SIGTERM)."""
    home = tmp_path_factory.mktemp("prefect")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, **OFFLINE_ENV, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    try:
        for _ in range(240):  # bounded: 120 s
            if server_healthy(api) or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert server_healthy(api), (home / "server.log").read_text()[-2000:]
        yield api, {**env, "PREFECT_API_URL": api}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()


@pytest.mark.slow
def test_flows_of_a_real_prefect_server(serve_db, prefect_api, tmp_path):
    api, env = prefect_api
    # one real flow run against the server, then a cron deployment of that flow
    subprocess.run([sys.executable, "-c", RUN_FLOW], env=env, check=True, timeout=120,
                   cwd=tmp_path, capture_output=True)
    flow_id = httpx.post(f"{api}/flows/", json={"name": "attnbase-probe"}).json()["id"]
    r = httpx.post(f"{api}/deployments/", json={
        "name": 'nightly "probe"', "flow_id": flow_id, "paused": False,
        "schedules": [{"schedule": {"cron": "0 3 * * *", "timezone": "UTC"}, "active": True}]})
    assert r.status_code in (200, 201), r.text

    srv = Server(serve_db, "--prefect-api", api)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            data = c.get("/api/flows").json()
            assert data["prefect_api"] == api
            [dep] = data["deployments"]
            assert dep["name"] == 'nightly "probe"' and dep["flow"] == "attnbase-probe"
            assert dep["paused"] is False
            assert dep["schedules"] == [{"kind": "cron", "value": "0 3 * * *",
                                         "timezone": "UTC", "active": True}]
            [run] = data["flow_runs"]
            assert run["name"] == "probe-run-1" and run["flow"] == "attnbase-probe"
            assert run["state_type"] == "COMPLETED" and run["deployment"] is None
            assert run["start_time"] and run["end_time"] and run["end_time"] >= run["start_time"]

            html = c.get("/flows").text
            # Prefect refuses < > & / % in names: a quote shows the escaping
            assert "nightly &#34;probe&#34;" in html and 'nightly "probe"' not in html
            assert "0 3 * * *" in html and "probe-run-1" in html and "Completed" in html
    finally:
        srv.stop()
