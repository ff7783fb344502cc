"""Per-batch commit latency of a team database (DuckLake on PostgreSQL) beside a directory
database, with 1 and 8 writer processes, measured side by side in one run.

Each writer process writes a run of synthetic batches (tests/warehouse/fakes.py: the real
writer, tiny arrays) and times every ledger transaction that marks a batch complete
(``RunWriter._mark_complete``: the batch's rows become visible to readers at its commit), one
per batch (a streamed extraction groups the marks of ``runner.LEDGER_EVERY_S``).
PostgreSQL is started here on loopback (tests/team/pgserver.py) and stopped by PID.

    python benchmarks/team.py --writers 1,8 --batches 30
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "team"), str(ROOT / "tests" / "warehouse")]


def _writer(db: str, run: str, batches: int, out: mp.Queue) -> None:
    from fakes import fake_batches, fake_config, fake_info

    from attnbase.runner import ingest_batches
    from attnbase.warehouse.runs.writer import RunWriter

    times: list[float] = []
    mark = RunWriter._mark_complete

    def timed(self, *a, **k):
        t = time.perf_counter()
        mark(self, *a, **k)
        times.append(time.perf_counter() - t)

    RunWriter._mark_complete = timed
    import attnbase.runner as runner
    from attnbase.warehouse import Database

    runner.LEDGER_EVERY_S = 0.0  # every batch's mark its own transaction (a stream defers them)

    info, cfg = fake_info(), fake_config(n_seqs=batches, batch_size=1)
    try:  # 8 writers of one directory wait for its file lock longer than the default 5 s
        ingest_batches(Database(db, lock_timeout=120), run, cfg, info=info, corpus="default",
                       corpus_hash="c0", batches=fake_batches(info, cfg), progress=False)
    except Exception as err:  # noqa: BLE001  reported by the parent
        out.put(f"{type(err).__name__}: {err}")
        raise
    out.put(times)


def measure(db: str, writers: int, batches: int, tag: str) -> list[float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(db, f"{tag}-{i}", batches, q))
             for i in range(writers)]
    for p in procs:
        p.start()
    got = [q.get(timeout=900) for _ in procs]
    bad = [g for g in got if isinstance(g, str)]
    if bad:
        raise SystemExit(f"a writer failed: {bad[0]}")
    times = [t for g in got for t in g]
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    return times


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", default="1,8")
    ap.add_argument("--batches", type=int, default=30, help="batches per writer")
    args = ap.parse_args()
    from pgserver import PgServer

    from attnbase.warehouse import Database

    server = PgServer().start()
    os.environ["PGPASSWORD"] = server.password
    tmp = Path(tempfile.mkdtemp(prefix="attnbase-team-bench-"))
    try:
        url = server.createdb("bench")
        Database(url).catalog.create(str(tmp / "data"))
        print(f"{'writers':>7} {'database':>9} {'p50 ms':>8} {'p95 ms':>8} {'commits':>8}",
              flush=True)
        rows = {}
        for w in (int(x) for x in args.writers.split(",")):
            for name, db in (("directory", str(tmp / f"local-{w}")), ("team", url)):
                times = measure(db, w, args.batches, f"{name}-{w}")
                rows[(w, name)] = (pct(times, 0.5) * 1e3, pct(times, 0.95) * 1e3)
                print(f"{w:>7} {name:>9} {rows[(w, name)][0]:>8.1f} {rows[(w, name)][1]:>8.1f} "
                      f"{len(times):>8}", flush=True)
        for w in sorted({w for w, _ in rows}):
            (t50, t95), (d50, d95) = rows[(w, "team")], rows[(w, "directory")]
            print(f"{w} writer(s): team/directory p50 {t50 / d50:.2f}x, p95 {t95 / d95:.2f}x")
    finally:
        server.remove()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
