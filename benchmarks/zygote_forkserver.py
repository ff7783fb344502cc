"""A query process replaced: the zygote against multiprocessing's forkserver (not a test).

    python benchmarks/zygote_forkserver.py [--rounds 40]

The service replaces a query process stopped at a limit; the next query waits for the new one
to send its ready frame. Both starters preload the same modules (``sqlproc.ZYGOTE_PRELOAD`` and
``querychild``) once, then fork one child per request that runs ``querychild.serve`` on a request
and an answer pipe: the zygote (:class:`~attnbase.warehouse.sandbox.zygote.Zygote`) and a
``multiprocessing.get_context("forkserver")`` Process (the pipes' descriptors sent by
``reduction.DupFd``). Alternating rounds time, for each, the start through
:class:`~attnbase.warehouse.sandbox.sqlproc.QueryProcess` until its ready frame, then one
``SELECT 42`` on that process, then its kill. Prints the medians of both and their ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from multiprocessing import reduction

from attnbase.warehouse.sandbox import querychild, sqlproc
from attnbase.warehouse.sandbox.zygote import Zygote


class _Fd:
    """A descriptor a forkserver child receives (``DupFd`` while the Process is pickled)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


def _forkserver_child(cwd: str, inp: int, out: int) -> None:
    os.chdir(cwd)
    querychild.serve(os.fdopen(inp, "rb", buffering=0), os.fdopen(out, "wb", buffering=0))


class _Child:
    """A forkserver Process with the surface :class:`QueryProcess` uses."""

    def __init__(self, proc, stdin_fd: int, stdout_fd: int) -> None:
        self._p = proc
        self.pid = proc.pid
        self.stdin = os.fdopen(stdin_fd, "wb", buffering=0)
        self.stdout = os.fdopen(stdout_fd, "rb", buffering=0)

    def poll(self):
        return self._p.exitcode

    def wait(self, timeout=None):
        self._p.join(timeout)
        return self._p.exitcode

    def kill(self) -> None:
        self._p.kill()


class ForkServer:
    """``fork(cwd)`` as :class:`Zygote` has it, on multiprocessing's forkserver."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["__main__", *sqlproc.ZYGOTE_PRELOAD, querychild.__name__])

    def fork(self, cwd) -> _Child:
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            p = self.ctx.Process(target=_forkserver_child, args=(str(cwd), _Fd(req_r), _Fd(res_w)),
                                 daemon=True)
            p.start()
        finally:
            os.close(req_r)
            os.close(res_w)
        return _Child(p, req_w, res_r)


def _one(starter, db: str) -> tuple[float, float]:
    """(ms to the ready frame, ms of the first query) of one new query process."""
    t0 = time.perf_counter()
    qp = sqlproc.QueryProcess(db, starter)
    qp.wait_ready()
    t1 = time.perf_counter()
    qp.run("SELECT 42", db=db, file=None, config={},
           limits=sqlproc.Limits(time_s=10.0, memory_mb=512, max_bytes=1 << 20))
    t2 = time.perf_counter()
    qp.kill()
    return (t1 - t0) * 1000, (t2 - t1) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    from attnbase.warehouse import Database

    with tempfile.TemporaryDirectory() as tmp:
        Database(tmp).catalog.ensure_migrated()  # an empty database: the query's catalog
        starters = {"zygote": Zygote(sqlproc.CHILD_TARGET, sqlproc.ZYGOTE_PRELOAD),
                    "forkserver": ForkServer()}
        times: dict = {k: ([], []) for k in starters}
        for name, s in starters.items():  # warm: the zygote and the fork server start
            _one(s, tmp)
        for i in range(args.rounds):
            order = list(starters) if i % 2 == 0 else list(starters)[::-1]
            for name in order:
                ready, query = _one(starters[name], tmp)
                times[name][0].append(ready)
                times[name][1].append(query)
        starters["zygote"].close()
        med = {k: (statistics.median(r), statistics.median(q)) for k, (r, q) in times.items()}
        for k, (r, q) in med.items():
            print(f"{k:>10}: start to ready {r:.2f} ms, first query {q:.2f} ms, "
                  f"both {r + q:.2f} ms (medians of {args.rounds})")
        z, f = med["zygote"], med["forkserver"]
        print(f"forkserver / zygote: start {f[0] / z[0]:.2f}x, start + query "
              f"{(f[0] + f[1]) / (z[0] + z[1]):.2f}x")


if __name__ == "__main__":
    main()
