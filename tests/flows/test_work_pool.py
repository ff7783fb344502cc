"""Jobs through a Prefect work pool: a real ``prefect server start``, two ``attnbase worker``
processes, ``attnbase flow submit``; each run written once; a worker SIGKILLed mid-run and its
run finished by the other worker after a resubmission; Ctrl-C stops a worker."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from poolhelpers import (kill_tree, ledger, logs, pipeline_config, pool_with_workers, run,
                         submit)
from poolhelpers import client_env as _env
from poolhelpers import free_port as _free_port

POOL = "gpu"
#: batches of the run a worker is killed in: long enough to be stopped mid-way
KILL_N = 80


# --- fast: one-line refusals, no server ----------------------------------------------------

def test_submit_refuses_a_bad_config_in_one_line_before_asking_a_server(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text('models = "tiny-gpt2"\n')
    env = _env(tmp_path / "prefect", f"http://127.0.0.1:{_free_port()}/api")
    r = run(["flow", "submit", cfg, "--pool", POOL], env, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "key 'models' must be a list" in r.stderr and "Traceback" not in r.stderr


def test_worker_without_a_reachable_api_fails_at_once_in_one_line(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/api"  # nothing listens there
    t0 = time.monotonic()
    r = run(["worker", "--pool", POOL], _env(tmp_path / "prefect", url), timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"no Prefect server answers at PREFECT_API_URL={url}" in r.stderr
    assert time.monotonic() - t0 < 30  # no retries, no server started


@pytest.mark.slow
def test_submit_and_worker_refusals_without_a_server(tmp_path):
    """A missing config, ``submit`` with no server answering, and no server named at all."""
    cfg = tmp_path / "p.toml"
    cfg.write_text('models = ["tiny-gpt2"]\n')
    url = f"http://127.0.0.1:{_free_port()}/api"
    env = _env(tmp_path / "prefect", url)
    r = run(["flow", "submit", tmp_path / "none.toml", "--pool", POOL], env, timeout=120)
    assert r.returncode == 2 and "does not exist" in r.stderr and r.stderr.count("\n") == 1
    r = run(["flow", "submit", cfg, "--pool", POOL], env, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"no Prefect server answers at PREFECT_API_URL={url}" in r.stderr
    r = run(["worker", "--pool", POOL], _env(tmp_path / "prefect", None), timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "no Prefect server is named: set PREFECT_API_URL" in r.stderr


# --- slow: a real server and two workers ---------------------------------------------------

@pytest.fixture(scope="module")
def pool_setup(tmp_path_factory):
    """A Prefect server, a directory database, and two ``attnbase worker`` processes serving
    pool ``gpu``; all stopped at the end."""
    base = tmp_path_factory.mktemp("pool")
    with pool_with_workers(base, POOL, 2) as (api, env, workers):
        yield {"base": base, "api": api, "env": env, "db": base / "db", "workers": workers}


def _marks(db: Path, run: str) -> dict:
    """``{batch: written_at}`` of the run's complete batches."""
    from attnbase.warehouse import read_sql

    df = read_sql(db, f"SELECT batch, written_at FROM batches WHERE run_id = '{run}' AND "
                      "status = 'complete'")
    return dict(zip(df["batch"].to_list(), map(str, df["written_at"].to_list())))


@pytest.mark.slow
def test_two_workers_run_submitted_configs_each_run_written_once(pool_setup):
    """Two configs, the first submitted twice: all three flow runs complete; each run's batches
    are written once (the duplicate waited for the run's lease, then found it complete)."""
    base = pool_setup["base"]
    a = pipeline_config(base, "a", "tiny-gpt2", 8, 2, analyze=True)
    b = pipeline_config(base, "b", "tiny-llama", 8, 2, analyze=False)
    env = pool_setup["env"]
    subs = [submit(env, a, POOL, "--wait"), submit(env, a, POOL, "--wait")]
    time.sleep(1)
    subs.append(submit(env, b, POOL, "--wait"))
    outs = [p.communicate(timeout=600) for p in subs]
    for p, (out, err) in zip(subs, outs):
        assert p.returncode == 0, (out, err, logs(base))
        lines = out.splitlines()
        assert lines[0].startswith("flow run ") and lines[0].endswith(" queued"), out
        assert "prefect flow-run logs" in lines[1]
        assert ": COMPLETED (triggered" in lines[-1], out
    ids = {o.splitlines()[0].split("(")[1].split(")")[0] for o, _ in outs}
    assert len(ids) == 3
    db = pool_setup["db"]
    # 4 batches each, a row_stats and a col_stats file per batch: no batch written twice
    assert ledger(db, "a-tiny-gpt2-default") == {"complete": 4, "files": 8, "status": "complete"}
    assert ledger(db, "b-tiny-llama-default") == {"complete": 4, "files": 8, "status": "complete"}
    from attnbase.warehouse import read_sql

    heads = read_sql(db, "SELECT count(*) AS n FROM head_metrics WHERE run_id = "
                         "'a-tiny-gpt2-default'")["n"][0]
    assert heads > 0  # the analysis ran in the worker too
    from attnbase.warehouse import Database
    from attnbase.warehouse.runs.verify import verify

    assert verify(Database(db)).ok


@pytest.mark.slow
def test_a_worker_killed_mid_run_leaves_it_to_the_other_after_resubmission(pool_setup):
    """SIGKILL the worker running a flow run (and its flow-run process: a machine that dies);
    the same config submitted again is finished by the other worker, which writes only the
    batches the ledger lacks. Then Ctrl-C stops the last worker within seconds."""
    import psutil

    base, db = pool_setup["base"], pool_setup["db"]
    cfg = pipeline_config(base, "k", "tiny-gpt2", KILL_N, 1, analyze=False)
    run_id = "k-tiny-gpt2-default"
    first = submit(pool_setup["env"], cfg, POOL)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    deadline = time.monotonic() + 300
    while ledger(db, run_id)["complete"] < 2:
        assert time.monotonic() < deadline, logs(base)
        time.sleep(0.2)

    def running_engine(w: subprocess.Popen) -> bool:
        return any("prefect.engine" in " ".join(c.cmdline())
                   for c in psutil.Process(w.pid).children(recursive=True))

    busy = [w for w in pool_setup["workers"] if running_engine(w)]
    assert len(busy) == 1, logs(base)
    kill_tree(busy[0].pid)
    before = ledger(db, run_id)
    marks = _marks(db, run_id)
    assert 2 <= before["complete"] < KILL_N and before["status"] == "running", before
    other = next(w for w in pool_setup["workers"] if w is not busy[0])
    again = submit(pool_setup["env"], cfg, POOL, "--wait")
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0 and ": COMPLETED" in out, (out, err, logs(base))
    after = ledger(db, run_id)
    assert after == {"complete": KILL_N, "files": 2 * KILL_N, "status": "complete"}
    # the batches done before the kill were not written again: their marks are as they were
    now = _marks(db, run_id)
    assert {b: now[b] for b in marks} == marks and len(now) - len(marks) == KILL_N - len(marks)
    from attnbase.warehouse import Database
    from attnbase.warehouse.runs.verify import verify

    assert verify(Database(db)).ok
    # Ctrl-C (SIGINT to the worker) stops it within seconds, saying how to resume
    assert other.poll() is None
    t0 = time.monotonic()
    other.send_signal(signal.SIGINT)
    other.wait(timeout=30)
    assert time.monotonic() - t0 < 5 and other.returncode == 130
    log = logs(base)
    assert f"`attnbase flow submit CONFIG --pool {POOL}` again" in log


@pytest.mark.slow
def test_a_pool_of_another_type_or_a_missing_database_is_refused_in_one_line(pool_setup):
    import httpx

    r = httpx.post(f"{pool_setup['api']}/work_pools/", json={"name": "k8s", "type": "kubernetes"})
    assert r.status_code == 201, r.text
    cfg = pipeline_config(pool_setup["base"], "t", "tiny-gpt2", 2, 2, analyze=False)
    for args in (["worker", "--pool", "k8s"], ["flow", "submit", cfg, "--pool", "k8s"]):
        r = run(args, pool_setup["env"], timeout=300)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "work pool 'k8s' is of type 'kubernetes'" in r.stderr
    r = run(["worker", "--pool", POOL, "--db", pool_setup["base"] / "nodb"], pool_setup["env"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "no attnbase database at" in r.stderr and "attnbase init --db" in r.stderr
