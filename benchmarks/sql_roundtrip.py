"""What a user's question costs through its query process, against the same query in one process.

    python benchmarks/sql_roundtrip.py --db D [--queries 150]

``D`` is a database that ``benchmarks/serve.py`` built (its run ``big``). The same run-scoped
questions (one head of ``big``, a mean per sequence) are asked, in interleaved rounds:

- through a query process (``user_query`` on a one-process ``QueryPool``, as the service asks):
  the caller's CPU (the check, the request and the Arrow frames, the memory poll) and the query
  process's CPU, separately;
- in this process, the way the query process runs them (``_serve_one`` on a snapshot copy, the
  same configuration), to a buffer.

Prints CPU milliseconds per question (user + system) and the minor page faults per question.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import resource
import shutil
import tempfile
from pathlib import Path

import psutil
from serve import SQL, H, L  # the mix's run-scoped question over the run ``big``


def _minflt(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    from attnbase.warehouse import Database
    from attnbase.warehouse.sandbox import querychild
    from attnbase.warehouse.sandbox.sql import SANDBOX_CONFIG, user_query
    from attnbase.warehouse.sandbox.sqlproc import Limits, QueryPool

    db = str(args.db.resolve())
    if not (Path(db) / "catalog.duckdb").exists():
        raise SystemExit(f"error: no attnbase database at {db}; build one with "
                         "`python benchmarks/serve.py --db D --seconds 1`")
    snap = Path(tempfile.mkdtemp(prefix="attnbase-roundtrip-")) / "catalog.duckdb"
    shutil.copyfile(Path(db) / "catalog.duckdb", snap)
    rnd = random.Random(0)
    qs = [SQL.format(layer=rnd.randrange(L), head=rnd.randrange(H)) for _ in range(args.queries)]
    limits = Limits(time_s=5, memory_mb=512, max_bytes=64 << 20, max_rows=10000, threads=1)
    conf = dict(SANDBOX_CONFIG)
    n = len(qs)
    pool = QueryPool(1, db)
    database = Database(db)
    me = psutil.Process()
    try:
        user_query(database, qs[0], limits, file=str(snap), config=conf, pool=pool)
        child = psutil.Process(pool._idle[0].pid)
        req = {"db": db, "file": str(snap), "max_rows": 10000, "max_bytes": 64 << 20,
               "config": {**conf, "memory_limit": f"{limits.memory_mb * 3 // 4}MB",
                          "threads": 1, "max_temp_directory_size": "0B"}}
        held: dict = {}
        in_dir = contextlib.chdir(db)  # as the query process runs (its working directory is DIR)
        with in_dir:
            querychild._serve_one({**req, "sql": qs[0]}, held, io.BytesIO())
        for r in range(args.rounds):
            c0, q0, m0 = _cpu(me), _cpu(child), _minflt(child.pid)
            for q in qs:
                user_query(database, q, limits, file=str(snap), config=conf, pool=pool)
            caller, proc = (_cpu(me) - c0) / n * 1000, (_cpu(child) - q0) / n * 1000
            child_faults = (_minflt(child.pid) - m0) / n
            with in_dir:
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                c0 = _cpu(me)
                for q in qs:
                    querychild._serve_one({**req, "sql": q}, held, io.BytesIO())
                inproc = (_cpu(me) - c0) / n * 1000
                faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / n
            print(f"round {r + 1}: through a query process {caller:.2f} ms caller + {proc:.2f} ms "
                  f"query process = {caller + proc:.2f} ms CPU per question ({child_faults:.0f} "
                  f"page faults in the query process); in one process "
                  f"{inproc:.2f} ms ({faults:.0f} page faults per question)", flush=True)
        if held.get("con") is not None:
            held["con"].close()
    finally:
        pool.close()
        shutil.rmtree(snap.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
