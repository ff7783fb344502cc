"""Fan-out to object storage: a LocalCluster of 2 worker processes writes one run's chunks and
statistics files to a moto S3 server, one worker is SIGKILLed mid-run, and the run completes
byte-identical to a one-process run (only the flow process writes the catalog)."""

from __future__ import annotations

import os
import signal
import threading
import time

import polars as pl
import psutil
import pytest

from attnbase.warehouse import Database, RunStore, read_sql

CFG = dict(model="tiny-llama", seqs=16, seq_len=16, batch_size=2, device="cpu")


def _workers(exclude: set[int]) -> list[psutil.Process]:
    """The Dask worker processes this process spawned (its children running spawn_main)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if p.pid not in exclude and "spawn_main" in cmd and "resource_tracker" not in cmd:
            out.append(p)
    return out


@pytest.mark.slow
def test_two_dask_workers_to_s3_one_killed(tmp_path, s3_bucket, moto_endpoint):
    from attnbase.extract.config import ExtractConfig
    from attnbase.flows.extract import extract_flow
    from attnbase.runner import extract_run
    from attnbase.warehouse.runs.location import Remote

    db = tmp_path / "db"
    store = f"{s3_bucket}/runs"
    stats = Remote(f"{store}/dsk/row_stats/run_id=dsk")
    killed: list[int] = []
    stop = threading.Event()

    def killer() -> None:
        # once the first batch's statistics file is on the store, SIGKILL one worker
        deadline = time.monotonic() + 300
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                done = [k for k in stats.files() if k.startswith("b")]
            except Exception:
                done = []
            procs = _workers(set())
            if done and len(procs) >= 2:
                os.kill(procs[0].pid, signal.SIGKILL)
                killed.append(len(done))  # batches on the store when it died
                return
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        out = extract_flow(db=str(db), run_id="dsk", task_runner="dask", workers=2, store=store,
                           **CFG)
    finally:
        stop.set()
        t.join(timeout=10)
    assert killed, "no worker was killed mid-run (the run finished before its first batch file?)"
    assert killed[0] < 8  # mid-run: batches were still to be written
    assert out["status"] == "complete"
    ledger = read_sql(db, "SELECT count(*) FILTER (WHERE status = 'complete') AS n, count(*) AS t "
                      "FROM batches WHERE run_id = 'dsk'")
    assert ledger["n"][0] == ledger["t"][0] == 8
    # the one-process reference of the same config, local
    cfg = ExtractConfig(model="tiny-llama", n_seqs=16, seq_len=16, batch_size=2, device="cpu")
    extract_run(Database(db), "one", cfg, progress=False)
    d = Database(db)
    a, b = RunStore(d.store_path("dsk"), "dsk"), RunStore(d.store_path("one"), "one")
    assert a.remote and a.names() == b.names()
    for name in a.names():
        assert a.read(name).tobytes() == b.read(name).tobytes(), name
    from attnbase.warehouse.runs.verify import verify

    res = verify(d)
    assert res.ok, [str(p) for p in res.problems]
    q = "SELECT * EXCLUDE (run_id) FROM row_stats WHERE run_id = ? ORDER BY layer, head, seq, query"
    assert read_sql(d, q, ["dsk"]).equals(read_sql(d, q, ["one"]))


@pytest.mark.slow
def test_analysis_fans_out_over_layers_and_equals_one_process(tmp_path, s3_bucket):
    """With the Dask runner a run's analysis is one task per layer on 2 worker processes, each
    reading the run's store and statistics files itself (here on S3, and a local twin); the
    flow process combines and writes, and every result row equals single-process analyze_run's."""
    from prefect import flow

    from attnbase.extract.config import ExtractConfig
    from attnbase.flows.analyze import analyze_runs
    from attnbase.flows.runners import make_task_runner
    from attnbase.runner import extract_run
    from attnbase.stats.analyze import RESULT_TABLES, analyze_run

    db = tmp_path / "db"
    cfg = ExtractConfig(model="tiny-llama", n_seqs=8, seq_len=16, batch_size=4, device="cpu")
    extract_run(Database(db), "s3r", cfg, progress=False, store=f"{s3_bucket}/runs")
    extract_run(Database(db), "loc", cfg, progress=False)

    @flow(name="fan-out-test")
    def fan_out():
        with make_task_runner("dask", 2) as runner:
            return analyze_runs(runner, str(db), ["s3r", "loc"], 20, 0, fan_out=True)

    out = fan_out()
    n_layers = Database(db).run_info("s3r")["n_layers"]
    assert [o["layers"] for o in (out["s3r"][0], out["loc"][0])] == [n_layers + 1] * 2

    def snap(run):
        return {t: read_sql(db, f"SELECT * EXCLUDE (run_id) FROM {t} WHERE run_id = ? "
                            "ORDER BY ALL", [run]) for t in RESULT_TABLES}

    fanned = {run: snap(run) for run in ("s3r", "loc")}
    for run in ("s3r", "loc"):
        analyze_run(Database(db), run, draws=20)
        one = snap(run)
        for t in RESULT_TABLES:
            assert one[t].height > 0 and fanned[run][t].equals(one[t]), (
                run, t, fanned[run][t].join(one[t], on=list(one[t].columns[:-1]))
                .filter(pl.col("value") != pl.col("value_right")))
    # the S3 run and its local twin: the same bytes, so the same rows
    for t in RESULT_TABLES:
        assert fanned["s3r"][t].equals(fanned["loc"][t]), t
    assert not _workers(set())  # the cluster's processes ended with the flow


def _ledger(db) -> dict[int, object]:
    """``{batch: written_at}`` of the complete batches (empty while the catalog is busy)."""
    from attnbase.warehouse.database import Database as _Db

    if not (db / "catalog.duckdb").exists():
        return {}
    try:
        with _Db(db, lock_timeout=0.5).connect(read_only=True, stats=False) as con:
            return dict(con.execute("SELECT batch, written_at FROM batches "
                                    "WHERE status = 'complete'").fetchall())
    except Exception:  # being created, migrated or written by the coordinator
        return {}


@pytest.mark.slow
def test_coordinator_killed_resumes_from_the_ledger(tmp_path, s3_bucket, moto_endpoint):
    """`attnbase flow run` (dask, 2 workers, store on S3) SIGKILLed with its whole process group
    once a batch is ledgered: no process outlives it; the same command then completes, only the
    batches the ledger did not count are recomputed, the arrays equal a one-process run's byte
    for byte and verify is clean."""
    import subprocess
    import sys
    from pathlib import Path

    from s3_server import aws_env

    from attnbase.extract.config import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.warehouse.runs.verify import verify

    db = tmp_path / "db"
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'db = "{db}"\nmodels = ["tiny-llama"]\nseqs = 32\nseq_len = 16\n'
                   'batch_size = 2\ntask_runner = "dask"\nworkers = 2\n'
                   f'store = "{s3_bucket}/runs"\nanalyze = true\nreport = false\n')
    env = {**os.environ, **aws_env(moto_endpoint), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_LOGGING_LEVEL": "WARNING"}
    cmd = [str(Path(sys.executable).with_name("attnbase")), "flow", "run", "--config", str(cfg)]
    log = open(tmp_path / "first.txt", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own group: the kill reaches all
    deadline = time.monotonic() + 300
    try:
        while not _ledger(db):
            assert proc.poll() is None, (tmp_path / "first.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "no batch was ledgered in 300 s"
            time.sleep(0.2)
        family = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    gone, alive = psutil.wait_procs(family, timeout=15)
    for p in alive:  # never leave one behind, whatever the assertion says
        p.kill()
    assert family and not alive, [p.cmdline() for p in alive]
    before = _ledger(db)
    assert 1 <= len(before) < 16, before  # killed mid-run
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    after = _ledger(db)
    assert sorted(after) == list(range(16))
    # the batches ledgered before the kill were not recomputed: their marks are the old ones
    assert {b: after[b] for b in before} == before
    run = "tiny-llama-default"
    one = ExtractConfig(model="tiny-llama", n_seqs=32, seq_len=16, batch_size=2, device="cpu")
    extract_run(Database(db), "one", one, progress=False)
    d = Database(db)
    a, b = RunStore(d.store_path(run), run), RunStore(d.store_path("one"), "one")
    assert a.remote and a.names() == b.names()
    for name in a.names():
        assert a.read(name).tobytes() == b.read(name).tobytes(), name
    res = verify(d)
    assert res.ok, [str(p) for p in res.problems]
    assert read_sql(d, "SELECT count(*) AS n FROM head_metrics WHERE run_id = ?",
                    [run])["n"][0] > 0  # the rerun analysed it too (fanned out)
