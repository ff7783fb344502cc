"""Helpers of the work-pool tests (tests/flows, tests/team): a real Prefect server, ``attnbase
worker`` processes in sessions of their own, ``attnbase flow submit``, the run's ledger."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ATTNBASE = [sys.executable, "-m", "attnbase.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_env(home: Path, api_url: str | None, base: dict | None = None) -> dict[str, str]:
    """``base`` (default this process's environment) without its PREFECT_ settings, with a
    Prefect home of its own and ``api_url`` as PREFECT_API_URL (None: unset)."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_LOGGING_LEVEL="WARNING", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def run(args, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([*ATTNBASE, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def submit(env: dict, cfg: Path, pool: str, *extra) -> subprocess.Popen:
    return subprocess.Popen([*ATTNBASE, "flow", "submit", str(cfg), "--pool", pool, *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def logs(base: Path) -> str:
    return "\n".join(p.read_text()[-2000:] for p in sorted(base.glob("worker*.log")))


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it, as a machine that dies."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


@contextlib.contextmanager
def pool_with_workers(base: Path, pool: str, n: int, env: dict | None = None):
    """A Prefect server on a free port and ``n`` ``attnbase worker --pool POOL`` processes
    (logs ``base/worker<i>.log``), all stopped at the end (the workers by SIGKILL of their
    process trees, the server by its process group). Yields ``(api_url, client_env, workers)``."""
    from attnbase.flows.serving import ensure_server

    api = f"http://127.0.0.1:{free_port()}/api"
    server = ensure_server(api, str(base / "server-home"))
    workers: list[subprocess.Popen] = []
    try:
        cenv = client_env(base / "client-home", api, env)
        for i in range(n):
            log = open(base / f"worker{i}.log", "w")
            workers.append(subprocess.Popen([*ATTNBASE, "worker", "--pool", pool], env=cenv,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, cwd=base))
        deadline = time.monotonic() + 180
        while not all("started" in (base / f"worker{i}.log").read_text() for i in range(n)):
            assert all(w.poll() is None for w in workers), logs(base)
            assert time.monotonic() < deadline, logs(base)
            time.sleep(0.5)
        yield api, cenv, workers
    finally:
        for w in workers:
            kill_tree(w.pid)
            w.wait(timeout=30)
        server.stop()


def pipeline_config(base: Path, name: str, model: str, seqs: int, batch: int, analyze: bool,
                    db: str | Path | None = None) -> Path:
    """A pipeline file ``base/<name>.toml``: runs named ``<name>-<model>-default``, no report."""
    cfg = base / f"{name}.toml"
    cfg.write_text(f'db = "{db or base / "db"}"\nmodels = ["{model}"]\nrun_prefix = "{name}-"\n'
                   f"seqs = {seqs}\nseq_len = 32\nbatch_size = {batch}\n"
                   f"analyze = {str(analyze).lower()}\nreport = false\nworkers = 1\n")
    return cfg


def ledger(db, run: str) -> dict:
    """``complete`` batches, listed statistics ``files`` and ``status`` of ``run`` in ``db``."""
    from attnbase.warehouse import Database

    database = Database(db)
    if not database.exists():
        return {"complete": 0, "files": 0, "status": None}
    try:
        with database.connect(read_only=True, stats=False) as con:
            done = con.execute("SELECT count(*) FROM batches WHERE run_id = ? AND status = "
                               "'complete'", [run]).fetchone()[0]
            files = con.execute("SELECT count(*) FROM stat_files WHERE run_id = ?",
                                [run]).fetchone()[0]
            st = con.execute("SELECT status FROM runs WHERE run_id = ?", [run]).fetchone()
    except Exception:  # noqa: BLE001  the catalog is being made or another process holds it
        return {"complete": 0, "files": 0, "status": None}
    return {"complete": int(done), "files": int(files), "status": st[0] if st else None}
