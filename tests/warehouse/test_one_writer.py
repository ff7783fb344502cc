"""One writer per run: a second writer of a run refuses in one line naming the first, or waits
for it; a dead holder's lease is taken over; two new runs of one name with other settings give
the one-line configuration conflict; an analysis of a run being written names its writer."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from test_faults import BATCH, N_BATCHES, N_SEQS, child, resume

from attnbase import faults
from attnbase.errors import RunBusyError, StatsError
from attnbase.warehouse import Database, read_sql


from attnbase.warehouse.catalog import lease
def _until_held(db, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            row = lease.holder(db, "r1")
        except Exception:  # the catalog being created or held for a moment
            row = None
        if row is not None:
            return row
        time.sleep(0.1)
    raise AssertionError("the first writer never took the lease")


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.slow
def test_a_second_writer_refuses_or_waits_and_every_batch_is_written_once(tmp_path, monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    db = Database(tmp_path / "db", lock_timeout=10)
    cmd, env = child(db.path, pause=4.0)  # 4 batches: ~16 s of writing
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        row = _until_held(db, first)
        assert row["pid"] == first.pid and row["purpose"] == "extract"
        # the same settings, refused: one line naming the holder
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        line = _one_line(second.stderr)
        assert f"is being written by PID {first.pid} on " in line and "--wait" in line
        # an analysis of the run being written names its writer (and writes nothing)
        with pytest.raises((RunBusyError, StatsError), match=f"PID {first.pid}"):
            from attnbase.stats.analyze import analyze_run

            analyze_run(db, "r1")
        # a waiting writer starts once the first is done, and finds nothing left to write
        waiting = subprocess.run(cmd, env={**env, "ATTNBASE_TEST_WAIT": "1"},
                                 capture_output=True, text=True, timeout=120)
        assert waiting.returncode == 0, waiting.stderr
    finally:
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    written = [int(out.split()[-1]), int(waiting.stdout.split()[-1])]
    assert written == [N_BATCHES, 0]  # every batch written once in all
    assert lease.holder(db, "r1") is None  # given back


@pytest.mark.slow
def test_two_new_runs_of_one_name_with_other_settings_conflict_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    db = Database(tmp_path / "db", lock_timeout=10)
    runs = []
    for n_seqs in (N_SEQS, N_SEQS + 2):
        cmd, env = child(db.path, pause=0.3, n_seqs=n_seqs)
        runs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
    results = [(p.wait(timeout=180), *p.communicate()) for p in runs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    (loser,) = [err for code, _, err in results if code == 2]
    line = _one_line(loser)
    assert "other settings" in line or "different configuration" in line or "config" in line
    (winner,) = [out for code, out, _ in results if code == 0]
    n = read_sql(db, "SELECT n_seqs FROM runs WHERE run_id = 'r1'")["n_seqs"][0]
    want = -(-n // BATCH)
    assert int(winner.split()[-1]) == want
    got = read_sql(db, "SELECT count(*) AS n FROM batches WHERE status = 'complete'")["n"][0]
    assert got == want


def test_a_dead_holders_lease_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    db = Database(tmp_path / "db", lock_timeout=10)
    cmd, env = child(db.path, kill_at="stats_written:3")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, p.stderr
    with db.connect(read_only=True) as con:  # the killed writer's lease is still there
        (pid,) = con.execute("SELECT pid FROM run_leases WHERE run_id = 'r1'").fetchone()
        done = con.execute("SELECT count(*) FROM batches WHERE status = 'complete'").fetchone()[0]
    assert pid != os.getpid() and lease.holder(db, "r1") is None  # its holder is dead
    assert done < N_BATCHES
    rec, _, _ = resume(db)
    assert rec.status == "complete" and rec.batches_written == N_BATCHES - done
    with db.connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM run_leases").fetchone()[0] == 0


def test_a_live_holder_is_refused_in_one_line(db):
    """In-process: a lease row of a live process on this host (the parent of this test)."""
    db.migrate()
    with db.transaction() as con:
        con.execute("INSERT INTO run_leases VALUES ('r1', ?, ?, 'extract', 'h0', 't', "
                    "now()::TIMESTAMP, now()::TIMESTAMP)", [os.getppid(), lease._host()])
    with pytest.raises(RunBusyError) as err:
        lease.acquire(db, "r1", "compact")
    assert f"PID {os.getppid()}" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(RunBusyError):  # waiting has a limit when asked for one
        lease.acquire(db, "r1", "compact", wait=True, timeout=0.3)
    with lease.acquire(db, "r2", "compact"):  # another run: free
        pass
