"""Fan-out to object storage: a LocalCluster of 2 worker processes writes one run's chunks and
statistics files to a moto S3 server, one worker is SIGKILLed mid-run, and the run completes
byte-identical to a one-process run (only the flow process writes the catalog)."""

from __future__ import annotations

import os
import signal
import threading
import time

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
    from attnbase.warehouse.location import Remote

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
    extract_run(db, "one", cfg, progress=False)
    d = Database(db)
    a, b = RunStore(d.store_path("dsk"), "dsk"), RunStore(d.store_path("one"), "one")
    assert a.remote and a.names() == b.names()
    for name in a.names():
        assert a.read(name).tobytes() == b.read(name).tobytes(), name
    from attnbase.warehouse.verify import verify

    res = verify(d)
    assert res.ok, [str(p) for p in res.problems]
    q = "SELECT * EXCLUDE (run_id) FROM row_stats WHERE run_id = ? ORDER BY layer, head, seq, query"
    assert read_sql(d, q, ["dsk"]).equals(read_sql(d, q, ["one"]))
