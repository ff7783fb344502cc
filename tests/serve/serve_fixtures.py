"""The service's test database and a real ``attnbase serve`` subprocess on a free loopback port.

The database is a real one: ``tiny-gpt2`` (seeded random weights, the bundled tokenizer) extracted
on the bundled corpus (8 x 16 tokens), analysed with few null draws, with a distances and a
clusters study; plus a second ``runs`` row whose model name is markup (escaping), a stand-in
stored report and a file beside the catalog that must never be served.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ATTNBASE = Path(sys.executable).parent / "attnbase"
RUN = "tiny-a"
MARKUP_MODEL = '<script>alert("x")</script><b>bold</b>'
REPORT_HTML = "<!doctype html><title>stored report of tiny-a</title><p>the stored report</p>"
SECRET = "secret-outside-reports-3f9a"


def build_database(path: Path) -> Path:
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.stats import studies
    from attnbase.stats.analyze import analyze_run
    from attnbase.warehouse import Database

    db = Database(path)
    cfg = ExtractConfig(model="tiny-gpt2", corpus="default", n_seqs=8, seq_len=16, batch_size=4,
                        device="cpu")
    extract_run(db, RUN, cfg, progress=False)
    analyze_run(db, RUN, draws=5, gauss_draws=20, seed=3, n_boot=200)
    sid = studies.distances_study(db, RUN, max_rows=60, dissimilarities=("cosine", "js"))
    studies.clusters_study(db, RUN, distances=sid, draws=19)
    with db.transaction() as con:  # a run whose model name is markup (never extracted)
        con.execute("""INSERT INTO runs BY NAME SELECT 'markup-run' AS run_id, ? AS model,
                       * EXCLUDE (run_id, model) REPLACE ('failed' AS status)
                       FROM runs WHERE run_id = ?""", [MARKUP_MODEL, RUN])
    (path / "reports" / RUN).mkdir(parents=True)
    (path / "reports" / RUN / "report.html").write_text(REPORT_HTML)
    (path / "secret.txt").write_text(SECRET)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``attnbase serve`` as a subprocess; stopped by PID (SIGINT, then SIGKILL)."""

    def __init__(self, db: Path, *args: str, env: dict | None = None,
                 cwd: Path | None = None) -> None:
        self.db, self.port = db, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(ATTNBASE), "serve", "--db", str(db), "--port", str(self.port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})}, cwd=cwd)
        self.first_line = self.proc.stdout.readline().strip()
        if self.proc.poll() is not None or not self.first_line:
            raise RuntimeError(f"attnbase serve did not start: {self.proc.stderr.read()}")
        self._wait_ready()

    def _wait_ready(self) -> None:
        import httpx

        for _ in range(100):  # bounded: 10 s
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("attnbase serve never answered /healthz")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 10.0) -> float:
        """Send ``sig`` to the PID; return seconds until it exited (SIGKILL after ``timeout``)."""
        if self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        return time.monotonic() - t0
