"""The query processes' pool: started once, reused query after query, replaced only when gone."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

#: ~0.4 s on one thread
LONG = "select count(*) from range(20000) a, range(5000) b where a.range > b.range"
RUNAWAY = "select count(*) from range(1000000) a, range(1000000) b where a.range > b.range"


def _limits(**kw):
    from attnbase.warehouse.sandbox.sqlproc import Limits

    return Limits(**{"time_s": 5.0, "memory_mb": 512, "max_bytes": 1 << 20, **kw})


def _run(pool, db, sql, **kw):
    from attnbase.warehouse.sandbox.sql import SANDBOX_CONFIG, user_query

    return user_query(db, sql, _limits(**kw), config=dict(SANDBOX_CONFIG), pool=pool)


def test_pool_reuses_its_processes(fake_run):
    """Concurrent and long (niced) queries keep the pool's processes; a process stopped at its
    limit is replaced by one new one."""
    from attnbase.errors import QueryLimitError
    from attnbase.warehouse.sandbox.sqlproc import QueryPool

    db = fake_run[0]
    pool = QueryPool(2, db.path)
    try:
        pids = set()

        def one():
            for _ in range(4):
                assert _run(pool, db, "select count(*) as n from runs").table.to_pylist() \
                    == [{"n": 1}]
                pids.update(p.pid for p in pool._idle)

        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert pool.started == 2 and len(pids) == 2
        assert {p.pid for p in pool._idle} == pids
        # forked from the pool's zygote, not started as new interpreters by this process
        assert {psutil.Process(pid).ppid() for pid in pids} == {pool._zygote._proc.pid}
        # a query past nice_after_s is niced; its process comes back at the pool's priority
        _run(pool, db, LONG, nice_after_s=0.05, nice=5)
        assert pool.started == 2 and {p.pid for p in pool._idle} == pids
        assert {os.getpriority(os.PRIO_PROCESS, p.pid) for p in pool._idle} \
            == {os.getpriority(os.PRIO_PROCESS, 0)}
        # control: a query stopped at its limit costs its process, and only that one
        with pytest.raises(QueryLimitError, match="time limit"):
            _run(pool, db, RUNAWAY, time_s=0.3)
        _run(pool, db, "select 1")
        deadline = time.monotonic() + 30  # the replacement starts in the background
        while len(pool._idle) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.started == 3 and len({p.pid for p in pool._idle} - pids) == 1
        kids = [psutil.Process(p.pid) for p in pool._idle]
        zygote = psutil.Process(pool._zygote._proc.pid)
    finally:
        pool.close()
    # closed: the zygote and its query processes are gone
    gone, alive = psutil.wait_procs([zygote, *kids], timeout=5)
    assert not alive


def test_pool_without_zygote(fake_run):
    """Control: ``fork=False`` starts each query process as a new interpreter of its own."""
    from attnbase.warehouse.sandbox.sqlproc import QueryPool

    db = fake_run[0]
    pool = QueryPool(1, db.path, fork=False)
    try:
        assert _run(pool, db, "select 1 as x").table.to_pylist() == [{"x": 1}]
        assert [psutil.Process(p.pid).ppid() for p in pool._idle] == [os.getpid()]
    finally:
        pool.close()


def test_query_processes_share_the_callers_session(fake_run):
    """Query processes stay in the caller's session (one scheduling group with the pages under
    Linux's autogroup, so a query's niceness weighs against them) and in a process group of
    their own (a terminal's Ctrl-C reaches the caller, which stops the query)."""
    from attnbase.warehouse.sandbox.sqlproc import QueryPool, QueryProcess

    db = fake_run[0]
    pool = QueryPool(1, db.path)
    try:
        _run(pool, db, "select 1 as a")
        forked = pool._idle[0].pid
        alone = QueryProcess(db.path)  # a new interpreter (attnbase sql without a pool)
        try:
            alone.wait_ready()
            for pid in (forked, alone.pid, pool._zygote._proc.pid):
                assert os.getsid(pid) == os.getsid(0)  # the old setsid: its own session
                assert os.getpgid(pid) == pid != os.getpgid(0)
        finally:
            alone.kill()
    finally:
        pool.close()
