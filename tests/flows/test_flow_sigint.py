"""Ctrl-C stops ``attnbase flow run`` within 5 s (one line, exit 130) and the run resumes;
the README's pipeline example writes a database of its own (issue 10)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ATTNBASE = str(Path(sys.executable).with_name("attnbase"))
ROOT = Path(__file__).resolve().parents[2]


def test_example_pipeline_uses_its_own_database():
    cfg = tomllib.loads((ROOT / "examples" / "pipeline.toml").read_text())
    make_db = next(line.split("?=")[1].strip() for line in (ROOT / "Makefile").read_text().splitlines()
                   if line.startswith("DB ?="))
    assert cfg["db"] != make_db  # `make demo` then the README's flow run: no run-config conflict
    assert f"its own database, {cfg['db']}" in (ROOT / "README.md").read_text()


def _ledger_done(db: Path) -> int:
    from attnbase.warehouse import Database, read_sql

    if not Database(db).exists():
        return 0
    try:
        return int(read_sql(db, "SELECT count(*) FILTER (WHERE status = 'complete') AS n "
                                "FROM batches")["n"][0])
    except Exception:  # the catalog is being created or migrated
        return 0


@pytest.mark.slow
def test_sigint_stops_a_flow_run_within_5_s(tmp_path):
    db = tmp_path / "db"
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'db = "{db}"\nmodels = ["tiny-gpt2"]\nseqs = 400\nseq_len = 64\n'
                   'batch_size = 2\nanalyze = false\nreport = false\nworkers = 1\n')
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    # files, not pipes: nobody drains a pipe while the test waits, and a full one would stall
    # the run's progress output (a terminal never does)
    out_f, err_f = open(tmp_path / "out.txt", "w"), open(tmp_path / "err.txt", "w")
    proc = subprocess.Popen([ATTNBASE, "flow", "run", "--config", str(cfg)], env=env,
                            stdout=out_f, stderr=err_f, text=True)
    deadline = time.monotonic() + 400
    while _ledger_done(db) < 2:  # well inside the extraction
        assert proc.poll() is None, (tmp_path / "err.txt").read_text()[-2000:]
        assert time.monotonic() < deadline, "the flow never reached its second batch"
        time.sleep(0.5)
    import psutil

    # the flow process's children (Prefect's temporary API server): the SIGINT goes to the
    # flow process alone, as `kill -INT` or a supervisor sends it, not to a terminal's group
    children = psutil.Process(proc.pid).children(recursive=True)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    finally:
        proc.kill()
        out_f.close()
        err_f.close()
    took = time.monotonic() - t0
    gone, alive = psutil.wait_procs(children, timeout=10)
    for p in alive:  # never leave one behind, whatever the assertion below says
        p.kill()
    assert children and not alive, f"{len(alive)} of {len(children)} children outlived the run"
    err = (tmp_path / "err.txt").read_text()
    assert took < 5.0, f"flow run took {took:.1f} s to stop after SIGINT"
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1].startswith("interrupted: the flow run stopped")
    assert "Traceback" not in err
    from attnbase.warehouse import Database
    from attnbase.warehouse.runs.verify import verify

    assert verify(Database(db)).ok  # what the ledger counts is intact; a rerun resumes from there
