"""Benchmark of ``attnbase serve`` (not a test): 16 concurrent loopback clients for 20 s.

    python benchmarks/serve.py [--db DIR] [--clients 16] [--seconds 20] [--big-seqs 544]
                               [--workers 1] [--decoded-cache-mb N] [--runaways]

Builds (once, in DIR; default a temporary directory) a database with
- ``minilm-bench``: MiniLM on the bundled corpus (16 x 32 tokens), analysed: head pages, patterns;
- ``big``: a synthetic run of 12 x 12 heads x ``--big-seqs`` sequences x 128 queries of
  ``row_stats`` (544 seqs: 10,027,008 rows, the issue's >= 10^7), ingested through the real
  writer with keys only (no logits: its attention rows are random softmaxes); run-scoped SQL;
merges the statistics files of both (finished runs, as ``attnbase compact`` does; a copy of
``big``'s per-batch files is kept outside the views for the side-by-side bare figure) and
deletes an earlier call's writer runs, then starts ``attnbase serve``, measures each kind of request alone (one client: the server's
CPU per request) and the run-scoped question on a bare DuckDB connection, and, while
``attnbase extract`` writes a third run into the same database, runs the clients for
``--seconds`` (each request bounded by a 30 s timeout), mixing head pages, patterns (both
conventions) and run-scoped SQL over ``big``. Prints throughput, p50/p95/p99 per kind, errors,
the cores the server, the writer and the clients used, the server's RSS before and after, and
the closed-loop floor: N clients with no think time and a CPU demand of D per request on K free
cores cannot see a mean response time below N * D / K (the interactive response-time law).
Loopback only.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ATTNBASE = Path(sys.executable).parent / "attnbase"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false"}
L, H, T = 12, 12, 128
#: where ``build`` keeps a copy of ``big``'s per-batch row_stats files (outside the views' glob)
BATCH_FILES = "bench-batchfiles"


def _big_batches(n_seqs: int, batch: int):
    from attnbase.contract import CapturedBatch

    def batches(start: int):
        rng = np.random.default_rng(0)
        for k in range(start, -(-n_seqs // batch)):
            first = k * batch
            n = min(batch, n_seqs - first)
            layer, head, seq, query = np.meshgrid(np.arange(L), np.arange(H),
                                                  np.arange(first, first + n), np.arange(T),
                                                  indexing="ij")
            size = layer.size
            sink = rng.uniform(0.05, 0.9, size)
            row = {"layer": layer.ravel(), "head": head.ravel(), "seq": seq.ravel(),
                   "query": query.ravel(), "n_keys": (query + 1).ravel(), "sink_mass": sink,
                   "max_prob": np.maximum(sink, 0.1), "argmax": np.zeros(size, np.int64),
                   "entropy": rng.uniform(0.1, 4.0, size), "sink_balance": np.full(size, np.nan),
                   "content_entropy": np.full(size, np.nan),
                   "content_dispersion": np.full(size, np.nan)}
            col = {"layer": layer.ravel(), "head": head.ravel(), "seq": seq.ravel(),
                   "key": query.ravel(), "received": rng.uniform(0, 1, size)}
            arrays = {"tokens": rng.integers(0, 1000, (n, T), dtype=np.int32),
                      "keys": rng.standard_normal((L, H, n, T, 2)).astype(np.float16)}
            yield CapturedBatch(batch=k, first_seq=first, n_seqs=n, arrays=arrays,
                                row_stats=row, col_stats=col)

    return batches


def build(db_dir: Path, big_seqs: int) -> None:
    from attnbase.contract import ModelInfo
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run, ingest_batches
    from attnbase.stats import studies
    from attnbase.stats.analyze import analyze_run
    from attnbase.warehouse import Database
    from attnbase.warehouse.runs.statcompact import compact_stats

    db = Database(db_dir)
    if "minilm-bench" not in db.run_ids():
        t0 = time.perf_counter()
        cfg = ExtractConfig(model="minilm", corpus="default", n_seqs=16, seq_len=32,
                            batch_size=8, device="cpu")
        extract_run(db, "minilm-bench", cfg, progress=False)
        analyze_run(db, "minilm-bench")
        studies.distances_study(db, "minilm-bench", max_rows=400)
        print(f"built minilm-bench in {time.perf_counter() - t0:.0f} s", flush=True)
    if "big" not in db.run_ids():
        t0 = time.perf_counter()
        info = ModelInfo(model="synthetic", model_revision="bench", family="gpt2", n_layers=L,
                         n_heads=H, n_kv_heads=H, d_head=2, d_model=2 * H, rotary=False,
                         causal=True, sink_token="<|bos|>")
        cfg = ExtractConfig(model="synthetic", corpus="default", n_seqs=big_seqs, seq_len=T,
                            batch_size=16, dtype="float16", capture=("keys",))
        ingest_batches(db, "big", cfg, info=info, corpus="synthetic", corpus_hash="bench",
                       batches=_big_batches(big_seqs, 16), progress=False)
        print(f"built big ({L * H * big_seqs * T:,} row_stats rows) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    copy = db_dir / BATCH_FILES / "row_stats" / "run_id=big"
    if not copy.exists():  # the writer's layout, kept outside the views for the bare figure
        shutil.copytree(db_dir / "row_stats" / "run_id=big", copy)
    for run in ("minilm-bench", "big"):  # finished runs, merged as `attnbase compact` does
        res = compact_stats(db, run)
        if res.files_after < res.files_before:
            print(f"merged the statistics files of {run}: {res.files_before} -> "
                  f"{res.files_after} in {res.seconds:.1f} s", flush=True)
    for run in db.run_ids():  # an earlier call's writer runs: every call starts alike
        if run.startswith("writer-"):
            db.delete_run(run)


KINDS = ("head page", "pattern", "run-scoped SQL")
#: ``--runaways``: one query DuckDB cannot interrupt (a 30-million-element list, built inside
#: one function call) and a self cross join of ``big``'s 10^7 row_stats rows.
RUNAWAYS = ("select range(30000000) as r",
            "select count(*) as n from row_stats a, row_stats b where a.entropy > b.entropy")
#: The server's time limit of a query (attnbase serve's default).
LIMIT_S = 5.0
#: The run-scoped question the clients ask (one head of ``big``, a mean per sequence).
SQL = ("select seq, avg(sink_mass) m, avg(entropy) e from row_stats where run_id = 'big' and "
       "layer = {layer} and head = {head} group by seq order by seq")


def request(c, kind: str, rnd: random.Random):
    """One request of ``kind`` on a random head (and sequence) through client ``c``."""
    layer, head = rnd.randrange(6), rnd.randrange(12)
    if kind == "head page":
        return c.get(f"/runs/minilm-bench/heads/{layer}/{head}", params={"seq": rnd.randrange(16)})
    if kind == "pattern":
        return c.get(f"/api/runs/minilm-bench/heads/{layer}/{head}/pattern",
                     params={"seq": rnd.randrange(16),
                             "convention": rnd.choice(("with_sink", "drop_sink"))})
    return c.post("/api/sql", json={"sql": SQL.format(layer=rnd.randrange(L),
                                                      head=rnd.randrange(H))})


def mix_client(url: str, end: float, seed: int, lat: dict, errors: list, lock,
               send=request, kinds=None) -> None:
    """One client of the mix until ``end`` (``time.monotonic()``): requests of random kinds
    (``kinds``: the keys of ``lat``) sent by ``send(client, kind, rnd)``, each latency appended
    to ``lat[kind]``, each failure (not 200, or no answer) to ``errors``, under ``lock``."""
    import httpx

    rnd = random.Random(seed)
    kinds = tuple(lat) if kinds is None else kinds
    with httpx.Client(base_url=url, timeout=30) as c:
        while time.monotonic() < end:
            kind = rnd.choice(kinds)
            t0 = time.monotonic()
            try:
                r = send(c, kind, rnd)
                ok = r.status_code == 200
                why = f"{kind}: {r.status_code} {r.text[:120]}"
            except httpx.HTTPError as err:
                ok, why = False, f"{kind}: {type(err).__name__}"
            took = time.monotonic() - t0
            with lock:
                lat[kind].append(took)
                if not ok:
                    errors.append(why)


def _tree_sum(pid: int, measure) -> float:
    """``measure(process)`` summed over a process and its children (``--workers``), those
    gone meanwhile counted as 0."""
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += measure(p)
        except psutil.NoSuchProcess:
            pass
    return total


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children so far."""
    return _tree_sum(pid, lambda p: sum(p.cpu_times()[:2]))


def solo(url: str, server_pid: int, n: int = 40) -> dict[str, tuple[float, float]]:
    """Each kind alone, one client, ``n`` requests in a row: ``{kind: (server CPU ms per
    request, wall p50 ms)}``: what one request costs the server when nothing waits."""
    import httpx

    out = {}
    with httpx.Client(base_url=url, timeout=30) as c:
        for kind in KINDS:
            rnd = random.Random(99)
            for _ in range(5):
                request(c, kind, rnd)
            c0, walls = cpu_s(server_pid), []
            for _ in range(n):
                t0 = time.perf_counter()
                r = request(c, kind, rnd)
                walls.append(time.perf_counter() - t0)
                r.raise_for_status()
            out[kind] = ((cpu_s(server_pid) - c0) / n * 1000, float(np.median(walls)) * 1000)
    return out


def bare_query_cpu_ms(db: Path, n: int = 30) -> dict[str, float]:
    """The run-scoped question on an open DuckDB connection in this process, no HTTP, no
    service (the floor of that kind), CPU ms per query: through the view (``big`` merged, as
    served) and over ``big``'s per-batch files as the writer left them (the copy ``build``
    keeps), each with its glob."""
    import duckdb

    con = duckdb.connect(str(db / "catalog.duckdb"), read_only=True, config={"threads": 2})
    batch_src = (f"read_parquet('{BATCH_FILES}/row_stats/run_id=*/*.parquet', "
                 "hive_partitioning = true, hive_types = {{'run_id': VARCHAR}})")
    out = {}
    try:
        con.execute(f"SET file_search_path = '{db.resolve()}'")
        con.execute("SET parquet_metadata_cache = true")
        for name, source in (("merged", "row_stats"), ("batch files", batch_src)):
            sql = SQL.replace("from row_stats", f"from {source}")
            rnd = random.Random(7)
            con.sql(sql.format(layer=0, head=0)).arrow()
            t0 = time.process_time()
            for _ in range(n):
                con.sql(sql.format(layer=rnd.randrange(L), head=rnd.randrange(H))).arrow()
            out[name] = (time.process_time() - t0) / n * 1000
        return out
    finally:
        con.close()


def rss_kb(pid: int) -> int:
    """Resident kB of a process and its children (``--workers``, query processes): pages
    shared between them (libraries, a forked parent's) counted once per process."""
    return int(_tree_sum(pid, lambda p: p.memory_info().rss // 1024))


def pss_kb(pid: int) -> int:
    """Proportional kB of a process and its children: each shared page divided between the
    processes that map it (what the machine pays for the tree)."""
    return int(_tree_sum(pid, lambda p: p.memory_full_info().pss // 1024))


def query_pids(pid: int) -> set[int]:
    """The query processes (``attnbase.warehouse.sandbox.querychild``, or forked by
    ``attnbase.warehouse.sandbox.zygote``) under the server now."""
    import psutil

    out = set()
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for p in kids:  # a new interpreter's, or a child of the zygote (not the zygote itself)
        try:
            cmd = " ".join(p.cmdline())
            # the zygote itself, or one of its children
            if "attnbase.warehouse.sandbox.zygote" in cmd:
                if "attnbase.warehouse.sandbox.zygote" in " ".join(p.parent().cmdline()):
                    out.add(p.pid)
            elif "attnbase.warehouse.sandbox.querychild" in cmd:
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--big-seqs", type=int, default=544)
    ap.add_argument("--no-writer", action="store_true", help="no extraction meanwhile")
    ap.add_argument("--workers", type=int, default=1, help="attnbase serve --workers")
    ap.add_argument("--runaways", action="store_true",
                    help="two more clients sending runaway queries meanwhile (RUNAWAYS, each "
                         "again as soon as it is answered): each must be stopped at the "
                         "server's limit + 1 s, the server's RSS must stay under its base + "
                         "1 GB")
    ap.add_argument("--decoded-cache-mb", type=int, default=None,
                    help="attnbase serve --decoded-cache-mb (0: every page decodes its chunks "
                         "and row groups afresh)")
    args = ap.parse_args(argv)
    import httpx

    db = args.db or Path(tempfile.mkdtemp(prefix="attnbase-bench-")) / "db"
    build(db, args.big_seqs)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cache = [] if args.decoded_cache_mb is None else ["--decoded-cache-mb",
                                                       str(args.decoded_cache_mb)]
    server = subprocess.Popen([str(ATTNBASE), "serve", "--db", str(db), "--port", str(port),
                               "--workers", str(args.workers), *cache],
                              stdout=subprocess.PIPE, text=True, env=ENV)
    print(server.stdout.readline().strip(), flush=True)
    writer = None
    try:
        for _ in range(4 * args.workers):  # fresh connections: every worker gets some
            with httpx.Client(base_url=url, timeout=30) as warm:
                for path in ("/runs/minilm-bench/heads/0/0",
                             "/api/runs/minilm-bench/heads/0/0/pattern?seq=0"):
                    warm.get(path)
        alone = solo(url, server.pid)
        bare_ms = bare_query_cpu_ms(db)
        rss_before, pss_before = rss_kb(server.pid), pss_kb(server.pid)
        qpids_before = query_pids(server.pid)
        if not args.no_writer:
            writer = subprocess.Popen(
                [str(ATTNBASE), "extract", "--db", str(db), "--model", "tiny-gpt2", "--corpus",
                 "default", "--seqs", "3000", "--seq-len", "32", "--batch-size", "8", "--run",
                 f"writer-{int(time.time())}"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=ENV)
            time.sleep(3)  # the writer is past its start-up and writing batches
        lat: dict[str, list[float]] = {k: [] for k in KINDS}
        errors: list[str] = []
        lock = threading.Lock()
        end = time.monotonic() + args.seconds

        def client(i: int) -> None:
            mix_client(url, end, i, lat, errors, lock)

        rss_series: list[int] = []
        rss_peak, pss_peak = [0], [0]
        qpids_seen: set[int] = set(qpids_before)
        stops: list[tuple[str, int, float, str]] = []  # runaway, status, seconds, detail

        def sample_rss() -> None:  # every 5 s: flat, or still growing? (peak: every 0.2 s)
            k = 0
            while time.monotonic() < end:
                time.sleep(0.2)
                rss = rss_kb(server.pid)
                rss_peak[0] = max(rss_peak[0], rss)
                qpids_seen.update(query_pids(server.pid))
                k += 1
                if k % 5 == 0:  # PSS reads every mapping: once a second
                    pss_peak[0] = max(pss_peak[0], pss_kb(server.pid))
                if k % 25 == 0:
                    rss_series.append(rss // 1024)

        def runaway(sql: str) -> None:
            with httpx.Client(base_url=url, timeout=60) as c:
                while time.monotonic() < end:
                    t0 = time.monotonic()
                    try:
                        r = c.post("/api/sql", json={"sql": sql})
                        code, detail = r.status_code, r.text[:160]
                    except httpx.HTTPError as err:
                        code, detail = 0, type(err).__name__
                    with lock:
                        stops.append((sql, code, time.monotonic() - t0, detail))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        threads.append(threading.Thread(target=sample_rss))
        if args.runaways:
            threads += [threading.Thread(target=runaway, args=(q,)) for q in RUNAWAYS]
        cpu0 = {"server": cpu_s(server.pid), "writer": cpu_s(writer.pid) if writer else 0.0,
                "clients": time.process_time()}
        t_start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.seconds + 60)
        wall = time.monotonic() - t_start
        cores = {"server": (cpu_s(server.pid) - cpu0["server"]) / wall,
                 "writer": (cpu_s(writer.pid) - cpu0["writer"]) / wall if writer else 0.0,
                 "clients": (time.process_time() - cpu0["clients"]) / wall}
        rss_after, pss_after = rss_kb(server.pid), pss_kb(server.pid)
        qpids_seen.update(query_pids(server.pid))
        total = sum(map(len, lat.values()))
        print(f"load average (1, 5, 15 min) at the end: "
              f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"{args.clients} clients{' + 2 runaways' if args.runaways else ''} x "
              f"{args.seconds:.0f} s, "
              f"{'with' if writer else 'without'} an extraction writing: {total} requests, "
              f"{total / args.seconds:.1f}/s, {len(errors)} errors")
        for kind, xs in lat.items():
            if xs:
                q = np.quantile(np.array(xs) * 1000, [0.5, 0.95, 0.99])
                print(f"  {kind:15s} n={len(xs):5d}  p50 {q[0]:7.1f} ms  p95 {q[1]:7.1f} ms  "
                      f"p99 {q[2]:7.1f} ms  max {max(xs) * 1000:7.1f} ms")
        n_cpu = len(os.sched_getaffinity(0))
        print(f"  cores busy meanwhile: server {cores['server']:.2f}, writer {cores['writer']:.2f}, "
              f"the clients (this process) {cores['clients']:.2f} of {n_cpu}; server CPU per request {cores['server'] * wall / max(total, 1) * 1000:.1f}"
              " ms")
        print("  alone (one client, nothing else; server CPU per request, wall p50):")
        for kind, (cpu_ms, wall_ms) in alone.items():
            print(f"    {kind:15s} {cpu_ms:6.1f} ms CPU  {wall_ms:6.1f} ms")
        print(f"    bare DuckDB     {bare_ms['merged']:6.1f} ms CPU for the run-scoped question on "
              f"an open connection (no HTTP, no service); {bare_ms['batch files']:.1f} ms over "
              "the same run's per-batch files")
        # the interactive response-time law (closed loop, no think time): X <= K / D, so the
        # mean response time R = N / X >= N * D / K
        demand = float(np.mean([a[0] for a in alone.values()])) / 1000
        free = max(n_cpu - cores["writer"] - cores["clients"], 0.1)
        print(f"  floor: {args.clients} clients x {demand * 1000:.1f} ms CPU per request (the mix, "
              f"alone) / {free:.2f} cores left by the writer and the clients = mean response "
              "time >= "
              f"{args.clients * demand / free * 1000:.0f} ms; measured mean "
              f"{np.mean([x for xs in lat.values() for x in xs]) * 1000:.0f} ms")
        print(f"  server RSS {rss_before / 1024:.0f} MB before, {rss_after / 1024:.0f} MB after "
              f"(every 5 s: {', '.join(map(str, rss_series))} MB; peak "
              f"{rss_peak[0] / 1024:.0f} MB, +{(rss_peak[0] - rss_before) / 1024:.0f} MB; its "
              "query processes included)")
        print(f"  server PSS {pss_before / 1024:.0f} MB before, {pss_after / 1024:.0f} MB after "
              f"(peak {pss_peak[0] / 1024:.0f} MB, +{(pss_peak[0] - pss_before) / 1024:.0f} MB, "
              "sampled once a second); query processes: "
              f"{len(qpids_before)} before, {len(qpids_seen - qpids_before)} started meanwhile "
              "(seen by a 0.2 s sampling)")
        bad_stops = 0
        for sql in RUNAWAYS if args.runaways else ():
            mine = [x for x in stops if x[0] == sql]
            took = [x[2] for x in mine]
            codes = sorted({x[1] for x in mine})
            late = sum(t > LIMIT_S + 1.0 for t in took)
            bad_stops += late + sum(x[1] != 400 for x in mine)
            ran = [int(m.group(1)) / 1000 for x in mine if (m := re.search(r"ran (\d+) ms", x[3]))]
            print(f"  runaway {sql[:48]!r}: {len(mine)} sent, answers {codes}, stopped after "
                  f"{min(took, default=0):.2f}-{max(took, default=0):.2f} s by this client's clock "
                  f"(limit {LIMIT_S:.0f} s; {late} past limit + 1 s); ran "
                  f"{min(ran, default=0):.2f}-{max(ran, default=0):.2f} s by the server's (from "
                  f"its process's start, without the queue); e.g. {mine[0][3] if mine else ''}")
        if args.runaways and rss_peak[0] - rss_before > 1 << 20:
            print("  RSS passed base + 1 GB")
            bad_stops += 1
        for e in sorted(set(errors))[:5]:
            print("  error:", e)
        if writer is not None:
            print(f"  writer still running: {writer.poll() is None} (exit {writer.poll()})")
        return 0 if not errors and not bad_stops else 1
    finally:
        stop(writer, server)


def stop(*procs) -> None:
    """SIGINT each process still running (None: skipped); SIGKILL one not gone in 15 s."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


if __name__ == "__main__":
    sys.exit(main())
