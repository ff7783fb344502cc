"""Per-batch commit latency of a team database (DuckLake on PostgreSQL) beside a directory
database, with 1 and 8 writer processes, measured side by side in one run.

Each writer process writes a run of synthetic batches (tests/warehouse/fakes.py: the real
writer, tiny arrays) and times every ledger transaction that marks a batch complete
(``RunWriter._mark_complete``: the batch's rows become visible to readers at its commit), one
per batch (a streamed extraction groups the marks of ``runner.LEDGER_EVERY_S``).
PostgreSQL is started here on loopback (tests/team/pgserver.py) and stopped by PID.

    python benchmarks/team.py --writers 1,8 --batches 30

The same run then measures the floor beside them: as many processes, each committing
``--batches`` bare DuckLake transactions on the same PostgreSQL, one row into a batches-like
table and one into a stat_files-like table (INSERT only: DuckLake retries concurrent inserts
itself), with no lock of ours (``floor``: DuckLake's retry settings; ``floor-5ms``: a 5 ms
first wait), taking turns on the write lock (``locked``), and the same mark in plain
PostgreSQL tables through psycopg, no DuckLake (``plain-pg``: an UPDATE of the batch's row and an
INSERT of its file's row, one kept connection each); then one writer's mark taken
apart (each of its ledger operations' median). ``--floor``: only
these.

``--serve``: instead, the service's plain mix (head pages, patterns, run-scoped SQL; no writer,
no runaway) over the same run in a directory database and in a team database (moved there by
``attnbase catalog copy``), two ``attnbase serve`` processes, the clients sent to each in turn
for ``--rounds`` interleaved rounds; prints p50/p95 per kind and server, and the team/directory
ratio of the head page's p95.

    python benchmarks/team.py --serve --clients 4 --seconds 10 --rounds 3
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


FLOOR_TABLES = ("floor_batches", "floor_stat_files")
#: (name, settings) of the floors measured: DuckLake's own retry of a commit that lost the race
#: for the next snapshot (10 tries, the first after 100 ms, x1.5 each), and a tighter one
FLOORS = (("floor", ()),
          ("floor-5ms", ("SET ducklake_retry_wait_ms = 5", "SET ducklake_retry_backoff = 1.5",
                         "SET ducklake_max_retry_count = 100")),
          ("locked", ("lock",)),  # the same transactions taking turns on the write lock
          ("plain-pg", ("plain-pg",)))  # the same mark in plain PostgreSQL tables, no DuckLake
PG_FLOOR_DDL = ("CREATE TABLE IF NOT EXISTS pg_floor_batches (run_id text, batch int, "
                "status text, written_at timestamp, PRIMARY KEY (run_id, batch))",
                "CREATE TABLE IF NOT EXISTS pg_floor_stat_files (run_id text, table_name text, "
                "batch int, path text, crc32c bigint, size bigint, written_at timestamp)")


def _pg_floor_writer(url: str, tag: str, n: int, ready, out) -> None:
    """A batch mark in plain PostgreSQL tables (``UPDATE`` the batch's pending row, ``INSERT``
    its file's row, COMMIT), ``n`` times on one kept connection: what a ledger kept outside
    DuckLake would cost."""
    import psycopg

    with psycopg.connect(url) as pg:
        with pg.transaction():
            pg.cursor().executemany("INSERT INTO pg_floor_batches VALUES (%s, %s, 'pending', "
                                    "NULL)", [(tag, i) for i in range(n)])
        ready.wait()
        times = []
        for i in range(n):
            t = time.perf_counter()
            with pg.transaction():
                pg.execute("UPDATE pg_floor_batches SET status = 'complete', written_at = now() "
                           "WHERE run_id = %s AND batch = %s", [tag, i])
                pg.execute("INSERT INTO pg_floor_stat_files VALUES (%s, 'row_stats', %s, %s, 1, "
                           "2, now())", [tag, i, f"row_stats/run_id={tag}/b{i:06d}.parquet"])
            times.append(time.perf_counter() - t)
    out.put(times)


def _floor_writer(url: str, tag: str, n: int, settings: list[str], ready, out) -> None:
    """``n`` bare INSERT-only transactions of one process, timed from its cursor (or the
    write lock, where ``settings`` says "lock") to COMMIT."""
    from contextlib import nullcontext

    from attnbase.warehouse import Database

    cat = Database(url).catalog
    locked = "lock" in settings
    con = cat._cursor()  # the instance made (extensions loaded, lake attached) before timing
    for sql in settings if not locked else ():
        con.execute(sql)
    con.close()
    ready.wait()  # every writer's too
    times = []
    try:
        for i in range(n):
            t = time.perf_counter()
            with cat.write_lock() if locked else nullcontext():
                con = cat._cursor()
                try:
                    con.execute("BEGIN TRANSACTION")
                    con.execute(f"INSERT INTO {FLOOR_TABLES[0]} VALUES (?, ?, ?, 1, 'complete', "
                                "now()::TIMESTAMP)", [tag, i, i])
                    con.execute(f"INSERT INTO {FLOOR_TABLES[1]} VALUES (?, 'row_stats', ?, ?, 1, "
                                "2, now()::TIMESTAMP)",
                                [tag, i, f"row_stats/run_id={tag}/b{i:06d}.parquet"])
                    con.execute("COMMIT")
                finally:
                    con.close()
            times.append(time.perf_counter() - t)
    except Exception as err:  # noqa: BLE001  reported by the parent
        out.put(f"after {len(times)} commits: {type(err).__name__}: {str(err).splitlines()[0]}")
        return
    out.put(times)


def measure_floor(url: str, writers: int, n: int, settings: tuple[str, ...] = ()):
    """The commit times of ``writers`` processes' bare transactions, and the first error (or
    None) where one of them failed."""
    from attnbase.warehouse import Database

    con = Database(url).catalog._cursor()
    try:
        for name, like in zip(FLOOR_TABLES, ("batches", "stat_files")):
            con.execute(f"CREATE TABLE IF NOT EXISTS {name} AS SELECT * FROM {like} LIMIT 0")
    finally:
        con.close()
    ctx = mp.get_context("spawn")
    q, ready = ctx.Queue(), ctx.Barrier(writers)
    if "plain-pg" in settings:
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            for ddl in PG_FLOOR_DDL:
                pg.execute(ddl)
        procs = [ctx.Process(target=_pg_floor_writer,
                             args=(url, f"p{writers}-{i}-{time.monotonic_ns()}", n, ready, q))
                 for i in range(writers)]
    else:
        procs = [ctx.Process(target=_floor_writer,
                             args=(url, f"f{writers}-{i}-{time.monotonic_ns()}", n,
                                   list(settings), ready, q))
                 for i in range(writers)]
    for p in procs:
        p.start()
    got = [q.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    bad = [g for g in got if isinstance(g, str)]
    return [t for g in got if not isinstance(g, str) for t in g], (bad[0] if bad else None)


def profile_mark(url: str, batches: int) -> None:
    """One writer's marks taken apart: the median of each step and of the whole mark, in ms."""
    from contextlib import contextmanager

    from fakes import fake_batches, fake_config, fake_info

    import attnbase.runner as runner
    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database
    from attnbase.warehouse.catalog.ducklake import DuckLakeBackend
    from attnbase.warehouse.runs.writer import RunWriter

    steps: dict[str, list[float]] = {}
    inside = [False]  # only the steps of a mark count

    def note(label, t):
        if inside[0]:
            steps.setdefault(label, []).append(time.perf_counter() - t)

    class Timed:
        """The mark's ledger, each of its operations timed by name."""

        def __init__(self, con):
            self.con = con

        def __getattr__(self, name):
            inner = getattr(self.con, name)
            if name.startswith("_") or not callable(inner):
                return inner

            def timed(*a, **k):
                t = time.perf_counter()
                try:
                    return inner(*a, **k)
                finally:
                    note(f"ledger.{name}", t)

            return timed

    def timed_cm(name, label):
        inner = getattr(DuckLakeBackend, name)

        @contextmanager
        def wrapped(*a, **k):
            t = time.perf_counter()
            with inner(*a, **k) as x:
                note(label, t)
                yield Timed(x)
                t = time.perf_counter()
            note(label.replace("open", "close"), t)

        setattr(DuckLakeBackend, name, wrapped)

    info = fake_info()
    runner.LEDGER_EVERY_S = 0.0
    warm = fake_config(n_seqs=3, batch_size=1)
    ingest_batches(Database(url), "profile-warm", warm, info=info, corpus="default",
                   corpus_hash="c0", batches=fake_batches(info, warm), progress=False)
    timed_cm("ledger", "ledger transaction (open)")
    mark = RunWriter._mark_complete
    marks: list[float] = []

    def timed_mark(self, *a, **k):
        inside[0] = True
        t = time.perf_counter()
        try:
            mark(self, *a, **k)
        finally:
            marks.append(time.perf_counter() - t)
            inside[0] = False

    cfg = fake_config(n_seqs=batches, batch_size=1)
    RunWriter._mark_complete = timed_mark
    try:
        ingest_batches(Database(url), "profile", cfg, info=info, corpus="default",
                       corpus_hash="c0", batches=fake_batches(info, cfg), progress=False)
    finally:
        RunWriter._mark_complete = mark
    print(f"one writer's mark: p50 {pct(marks, 0.5) * 1e3:.1f} ms ({len(marks)} marks); the "
          "median of each step (a step inside another counts in both):")
    for label, xs in steps.items():
        print(f"  {label:>34} {pct(xs, 0.5) * 1e3:7.1f} ms  (n={len(xs)})")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


SERVE_RUN = "tiny-bench"
KINDS = ("head page", "pattern", "run-scoped SQL")
SQL = ("select seq, avg(sink_mass) m, avg(entropy) e from row_stats where run_id = '{run}' and "
       "layer = {layer} and head = {head} group by seq order by seq")


def _build_local(db_dir: Path) -> tuple[int, int, int]:
    """A directory database with one analysed ``tiny-gpt2`` run; its (layers, heads, seqs)."""
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.stats.analyze import analyze_run
    from attnbase.warehouse import Database

    db = Database(db_dir)
    cfg = ExtractConfig(model="tiny-gpt2", corpus="default", n_seqs=32, seq_len=32,
                        batch_size=8, device="cpu")
    extract_run(db, SERVE_RUN, cfg, progress=False)
    analyze_run(db, SERVE_RUN, draws=5, gauss_draws=20, seed=3, n_boot=200)
    from attnbase.warehouse.sandbox.sql import read_sql

    shape = read_sql(db, "SELECT max(layer) + 1 AS l, max(head) + 1 AS h, max(seq) + 1 AS s "
                         "FROM row_stats WHERE run_id = ?", [SERVE_RUN]).row(0)
    return tuple(int(x) for x in shape)


def _request(c, kind: str, rnd, shape):
    layers, heads, seqs = shape
    layer, head, seq = rnd.randrange(layers), rnd.randrange(heads), rnd.randrange(seqs)
    if kind == "head page":
        return c.get(f"/runs/{SERVE_RUN}/heads/{layer}/{head}", params={"seq": seq})
    if kind == "pattern":
        return c.get(f"/api/runs/{SERVE_RUN}/heads/{layer}/{head}/pattern",
                     params={"seq": seq, "convention": rnd.choice(("with_sink", "drop_sink"))})
    return c.post("/api/sql", json={"sql": SQL.format(run=SERVE_RUN, layer=layer, head=head)})


def _start_server(db: str):
    import socket
    import subprocess

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "attnbase.cli", "serve", "--db", db,
                             "--port", str(port)], stdout=subprocess.PIPE, text=True)
    print(proc.stdout.readline().strip(), flush=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    return proc, url


def _mix(url: str, clients: int, seconds: float, shape, seed: int) -> dict[str, list[float]]:
    import threading

    from serve import mix_client

    lat: dict[str, list[float]] = {k: [] for k in KINDS}
    errors: list[str] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client(i: int) -> None:
        mix_client(url, end, seed * 100 + i, lat, errors, lock,
                   send=lambda c, kind, rnd: _request(c, kind, rnd, shape))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{len(errors)} failed requests, first: {errors[0]}")
    return lat


def _visible_after(url: str, base: str, n: int = 5) -> list[float]:
    """Seconds from a writer's commit (one ``run_metrics`` row) to the first answer of the
    server carrying a new ETag, ``n`` times."""
    import httpx

    from attnbase.warehouse import Database

    out = []
    db = Database(url)
    with httpx.Client(base_url=base, timeout=30) as c:
        for i in range(n):
            before = c.get("/api/runs").headers["etag"]
            with db.transaction() as con:
                con.execute("INSERT INTO run_metrics (run_id, metric, value) VALUES (?, ?, ?)",
                            [SERVE_RUN, f"bench-{i}", float(i)])
            t0 = time.perf_counter()
            while c.get("/api/runs").headers["etag"] == before:
                time.sleep(0.01)
            out.append(time.perf_counter() - t0)
    return out


def serve_side_by_side(url: str, tmp: Path, clients: int, seconds: float, rounds: int) -> None:
    import signal
    import subprocess

    import httpx

    local = tmp / "local"
    t0 = time.perf_counter()
    shape = _build_local(local)
    subprocess.run([sys.executable, "-m", "attnbase.cli", "catalog", "copy", "--from",
                    str(local), "--to", url], check=True, stdout=subprocess.DEVNULL)
    print(f"built {SERVE_RUN} {shape} (layers, heads, seqs) and copied it into the team "
          f"database in {time.perf_counter() - t0:.0f} s", flush=True)
    servers = {name: _start_server(db) for name, db in (("directory", str(local)),
                                                       ("team", url))}
    try:
        for name, (_, base) in servers.items():  # every head's page and patterns once
            with httpx.Client(base_url=base, timeout=60) as c:
                for layer in range(shape[0]):
                    for head in range(shape[1]):
                        c.get(f"/runs/{SERVE_RUN}/heads/{layer}/{head}")
                        c.get(f"/api/runs/{SERVE_RUN}/heads/{layer}/{head}/pattern?seq=0")
        lat = {name: {k: [] for k in KINDS} for name in servers}
        for r in range(rounds):
            for name, (_, base) in (servers.items() if r % 2 == 0 else
                                    reversed(servers.items())):
                for k, xs in _mix(base, clients, seconds, shape, r).items():
                    lat[name][k] += xs
        print(f"{clients} clients, {rounds} interleaved rounds of {seconds:.0f} s per server")
        print(f"{'database':>9} {'kind':>15} {'n':>6} {'p50 ms':>8} {'p95 ms':>8}")
        for name in servers:
            for k in KINDS:
                xs = lat[name][k]
                print(f"{name:>9} {k:>15} {len(xs):>6} {pct(xs, 0.5) * 1e3:>8.1f} "
                      f"{pct(xs, 0.95) * 1e3:>8.1f}")
        for k in KINDS:
            ratio = pct(lat["team"][k], 0.95) / pct(lat["directory"][k], 0.95)
            print(f"{k}: team/directory p95 {ratio:.2f}x")
        print(f"a commit seen by the team server (new ETag) after: "
              f"{', '.join(f'{x * 1e3:.0f} ms' for x in _visible_after(url, servers['team'][1]))}")
    finally:
        for proc, _ in servers.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGINT)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", default="1,8")
    ap.add_argument("--batches", type=int, default=30, help="batches per writer")
    ap.add_argument("--serve", action="store_true", help="the service's plain mix instead")
    ap.add_argument("--floor", action="store_true",
                    help="only the floor and one writer's mark taken apart")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0, help="per round and server")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from pgserver import PgServer

    from attnbase.warehouse import Database

    server = PgServer().start()
    os.environ["PGPASSWORD"] = server.password
    tmp = Path(tempfile.mkdtemp(prefix="attnbase-team-bench-"))
    try:
        url = server.createdb("bench")
        Database(url).catalog.create(str(tmp / "data"))
        if args.serve:
            serve_side_by_side(url, tmp, args.clients, args.seconds, args.rounds)
            return
        print(f"{'writers':>7} {'database':>9} {'p50 ms':>8} {'p95 ms':>8} {'commits':>8}",
              flush=True)
        rows = {}
        counts = [int(x) for x in args.writers.split(",")]
        for w in counts if not args.floor else ():
            for name, db in (("directory", str(tmp / f"local-{w}")), ("team", url)):
                times = measure(db, w, args.batches, f"{name}-{w}")
                rows[(w, name)] = (pct(times, 0.5) * 1e3, pct(times, 0.95) * 1e3)
                print(f"{w:>7} {name:>9} {rows[(w, name)][0]:>8.1f} {rows[(w, name)][1]:>8.1f} "
                      f"{len(times):>8}", flush=True)
        for w in sorted({w for w, _ in rows}):
            (t50, t95), (d50, d95) = rows[(w, "team")], rows[(w, "directory")]
            print(f"{w} writer(s): team/directory p50 {t50 / d50:.2f}x, p95 {t95 / d95:.2f}x")
        print("the floor: bare INSERT-only DuckLake transactions (a batches-like row and a "
              "stat_files-like row), no lock of ours, same PostgreSQL", flush=True)
        for w in counts:
            for name, settings in FLOORS:
                times, err = measure_floor(url, w, args.batches, settings)
                print(f"{w:>7} {name:>9} {pct(times, 0.5) * 1e3 if times else 0:>8.1f} "
                      f"{pct(times, 0.95) * 1e3 if times else 0:>8.1f} {len(times):>8}"
                      + (f"  a writer failed {err}" if err else ""), flush=True)
        profile_mark(url, args.batches)
    finally:
        server.remove()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
