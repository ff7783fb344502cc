"""``attnbase schedule`` against a real local Prefect server that the command starts and stops."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbase.flows.serving import ServerHandle, server_healthy

ATTNBASE = str(Path(sys.executable).with_name("attnbase"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
               PREFECT_LOGGING_LEVEL="WARNING", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def test_server_healthy_is_a_200_from_health_and_false_otherwise():
    """200 on ``/health`` (after a redirect too) is healthy; another status, a closed port and a
    URL that is not one are not."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/moved/health":
                self.send_response(307)
                self.send_header("Location", "/ok/health")
                self.end_headers()
                return
            self.send_response(200 if self.path == "/ok/health" else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert server_healthy(f"{base}/ok") and server_healthy(f"{base}/ok/")
        assert server_healthy(f"{base}/moved")
        assert not server_healthy(f"{base}/down")
    finally:
        server.shutdown()
        server.server_close()
    assert not server_healthy(f"http://127.0.0.1:{_free_port()}/api")
    assert not server_healthy("not a url") and not server_healthy("")


def test_schedule_rejects_a_bad_cron_before_starting_a_server(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text('models = ["tiny-gpt2"]\n')
    port = _free_port()
    r = subprocess.run([ATTNBASE, "schedule", "--config", str(cfg), "--cron", "every minute"],
                       env=_env(tmp_path, port), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "is not a cron expression" in r.stderr
    assert not server_healthy(f"http://127.0.0.1:{port}/api")
    r = subprocess.run([ATTNBASE, "schedule", "--config", str(cfg), "--cron", "* * * * *", "--for",
                        "1"], env={**_env(tmp_path, port), "PREFECT_API_URL": "http://example.org/api"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no Prefect server answers" in r.stderr


@pytest.mark.slow
def test_schedule_serves_a_cron_run_against_a_local_server(tmp_path):
    db = tmp_path / "db"
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'db = "{db}"\nmodels = ["tiny-gpt2"]\nseqs = 4\nseq_len = 16\nbatch_size = 2\n'
                   f'analyze = false\nreport = false\n')
    port = _free_port()
    t0 = time.monotonic()
    r = subprocess.run([ATTNBASE, "schedule", "--config", str(cfg), "--cron", "* * * * *",
                        "--for", "90"], env=_env(tmp_path, port), capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    m = re.search(r"started a local Prefect server: .* \(pid (\d+),.*stop it with `kill -TERM (\d+)`",
                  out)
    assert m and m.group(1) == m.group(2), out[-3000:]
    assert re.search(r"flow run \S+ \([0-9a-f-]+\): COMPLETED", out), out[-3000:]
    assert "stopped the Prefect server" in out
    assert not server_healthy(f"http://127.0.0.1:{port}/api")
    assert time.monotonic() - t0 < 400
    from attnbase.warehouse import read_sql

    assert read_sql(db, "SELECT status FROM runs WHERE run_id = 'tiny-gpt2-default'").item() == "complete"
    # the server was given the project-local PREFECT_HOME: its database and log live there
    assert (tmp_path / "prefect" / "server.log").exists()


def test_server_handle_describes_how_to_stop_it():
    h = ServerHandle("http://127.0.0.1:4321/api", 12345, True, "/x/server.log", "/x")
    assert "pid 12345" in h.describe() and "kill -TERM 12345" in h.describe()
    assert "already running" in ServerHandle("u", None, False, None, "/x").describe()


def test_schedule_lines_name_zone_next_run_and_trigger():
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from attnbase.flows.serving import local_timezone, schedule_lines

    now = datetime(2026, 12, 1, 22, 33, 10, tzinfo=ZoneInfo("Europe/Paris"))
    lines = schedule_lines("attnbase-pipeline/nightly", "0 3 * * *", "Europe/Paris",
                           "http://127.0.0.1:4200/api", now)
    assert lines == [
        "deployment: attnbase-pipeline/nightly",
        "schedule: cron '0 3 * * *' in time zone Europe/Paris (this machine's)",
        "next run: 2026-12-02 03:00 Europe/Paris (in 4 h 27 min)",
        "run it now: PREFECT_API_URL=http://127.0.0.1:4200/api prefect deployment run "
        "'attnbase-pipeline/nightly'"]
    # the same instant in another zone: the cron fires at 03:00 of that zone
    later = schedule_lines("d", "0 3 * * *", "America/New_York", "u", now)[2]
    assert later == "next run: 2026-12-02 03:00 America/New_York (in 10 h 27 min)"
    assert local_timezone()  # an IANA name, never empty
