"""Many writers, many processes, one team database: runs at once, a race for one run, a
writer killed mid-run, the catalog's server crashed mid-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from teamhelpers import attnbase, tiny_extract_args

pytestmark = pytest.mark.slow

#: windows of a run long enough to be stopped mid-way, one per batch: a stream marks its
#: batches complete every runner.LEDGER_EVERY_S (10 s), so the run must last well past that
N = 900


def _spawn(args, env):
    return subprocess.Popen([sys.executable, "-m", "attnbase.cli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _batches(url: str, run: str) -> tuple[int, int]:
    """(complete, listed statistics files) of ``run``."""
    from attnbase.warehouse import Database

    db = Database(url)
    with db.connect(read_only=True, stats=False) as con:
        done = con.execute("SELECT count(*) FROM batches WHERE run_id = ? AND status = 'complete'",
                           [run]).fetchone()[0]
        files = con.execute("SELECT count(*) FROM stat_files WHERE run_id = ?",
                            [run]).fetchone()[0]
    return int(done), int(files)


def _warm(url: str) -> None:
    """This process's catalog instance made (extensions loaded, lake attached: ~1 s) before a
    writer starts, so that polling it sees the writer mid-run."""
    from attnbase.warehouse import Database

    Database(url).run_ids()


def _wait_for_batches(url: str, run: str, n: int, proc, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if _batches(url, run)[0] >= n:
                return
        except Exception:  # noqa: BLE001  not registered yet
            pass
        time.sleep(0.05)
    raise AssertionError(f"run {run} did not reach {n} batches")


def test_four_processes_extract_four_runs_at_once(team, child_env, pg):
    url, _ = team
    procs = [_spawn(tiny_extract_args(url, f"w{i}", 16, 2), child_env(f"w{i}")) for i in range(4)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert pg.password not in out + err
    for i in range(4):
        assert _batches(url, f"w{i}") == (8, 16)  # 8 batches, a row_stats and a col_stats file each
    assert attnbase("verify", "--db", url, env=child_env("v")).stdout.startswith("ok: 4 run(s)")


def test_two_processes_race_for_one_run_and_each_batch_is_written_once(team, child_env):
    url, _ = team
    procs = [_spawn(tiny_extract_args(url, "race", 16, 2, "--wait"), child_env(f"r{i}"))
             for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    said = sorted(o for o, _ in outs)
    # one wrote all 8 batches, the other waited for it and found the run complete
    assert "is already complete (8 batches" in said[1] and "8/8 batches written" in said[0], said
    assert _batches(url, "race") == (8, 16)


def test_a_writer_killed_mid_run_is_finished_by_another_process(team, child_env):
    url, _ = team
    _warm(url)
    proc = _spawn(tiny_extract_args(url, "killed", N, 1), child_env("k1"))
    _wait_for_batches(url, "killed", 2, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = _batches(url, "killed")[0]
    assert 2 <= done_before < N
    out = attnbase(*tiny_extract_args(url, "killed", N, 1), env=child_env("k2")).stdout
    assert f"{N - done_before}/{N} batches written this time" in out
    assert _batches(url, "killed") == (N, 2 * N)
    assert attnbase("verify", "--db", url, env=child_env("v")).stdout.startswith("ok: 1 run(s)")


def test_the_catalog_server_crashed_for_ten_seconds_mid_run(tmp_path, child_env, monkeypatch):
    """``pg_ctl stop -m immediate`` mid-run, started again 10 s later: the writer goes on or
    stops in one line; a rerun finishes the run and ``verify`` is clean."""
    from pgserver import PgServer

    from attnbase.warehouse import Database

    server = PgServer().start()
    try:
        monkeypatch.setenv("PGPASSWORD", server.password)
        url = server.createdb("crash")
        Database(url).catalog.create(str(tmp_path / "data"))
        env = {**child_env("c1"), "PGPASSWORD": server.password}
        _warm(url)
        proc = _spawn(tiny_extract_args(url, "crash", N, 1), env)
        _wait_for_batches(url, "crash", 2, proc)
        assert _batches(url, "crash")[0] < N  # the writer is mid-run when the server goes
        server.crash()
        time.sleep(10)
        server.start()
        out, err = proc.communicate(timeout=600)
        print(f"\nthe writer across the crash: exit {proc.returncode}; {err.strip()[-300:]}")
        if proc.returncode != 0:
            assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
        assert server.password not in out + err
        attnbase(*tiny_extract_args(url, "crash", N, 1), env=env)
        assert _batches(url, "crash") == (N, 2 * N)
        assert attnbase("verify", "--db", url, env=env).stdout.startswith("ok: 1 run(s)")
    finally:
        server.remove()
