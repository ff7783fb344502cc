"""Catalog questions at scale: >= 10^7 ``row_stats`` rows written through the real run writer.

Synthetic runs of the GPT-2-small shape (12 layers x 12 heads, 150 windows x 128 tokens =
2,764,800 attention rows each; ``--runs 4`` gives 11.1 M rows, plus as many ``col_stats`` rows)
are fed to :func:`attnbase.runner.ingest_batches` batch by batch (8 windows each), exactly as an
extraction writes them (per-batch Parquet files + ledger rows), with ``capture=()`` so that only
``tokens`` is stored in Zarr (the arrays play no part in these questions). ``head_metrics`` gets
one synthetic ``key_norm_cv`` per head for the join.

Timed (median of ``--repeat`` after one warm-up), each through ``attnbase.warehouse.read_sql``
(what ``attnbase sql`` runs: open the catalog read-only, check, query, return polars) and on an
already open DuckDB connection (the query alone):

1. top sink heads of a run (mean sink mass per head over rows with >= 8 keys, top 10);
2. per-layer aggregates of a run (mean entropy, sink mass, max prob, rows);
3. a join with ``head_metrics`` (heads ranked by key-norm CV with their mean sink mass);
4. one head's rows (every row of L3H5 of a run: 19,200 rows).

Run: ``python benchmarks/queries.py [--runs 4] [--db benchmarks/out/queries-db]`` (the database
is kept and reused when it already holds the runs).

``--compare-views``: also time each question on one open connection through two definitions
of the ``row_stats`` view side by side, interleaved round by round: the glob of every file in
the directory (before ``stat_files``) and the list of the files the catalog lists (now).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from pathlib import Path

import numpy as np

L, H, T, SEQS, BATCH = 12, 12, 128, 150, 8

QUERIES = {
    "top sink heads of a run": (
        "SELECT layer, head, avg(sink_mass) AS sink FROM row_stats "
        "WHERE run_id = $run AND n_keys >= 8 GROUP BY layer, head ORDER BY sink DESC LIMIT 10"),
    "per-layer aggregates of a run": (
        "SELECT layer, avg(entropy) AS entropy, avg(sink_mass) AS sink, avg(max_prob) AS max_prob, "
        "count(*) AS n FROM row_stats WHERE run_id = $run GROUP BY layer ORDER BY layer"),
    "join with head_metrics": (
        "SELECT h.layer, h.head, h.value AS key_norm_cv, r.sink FROM head_metrics h JOIN "
        "(SELECT layer, head, avg(sink_mass) AS sink FROM row_stats WHERE run_id = $run "
        "GROUP BY layer, head) r ON r.layer = h.layer AND r.head = h.head "
        "WHERE h.run_id = $run AND h.metric = 'key_norm_cv' ORDER BY h.value DESC LIMIT 10"),
    "one head's rows": (
        "SELECT * FROM row_stats WHERE run_id = $run AND layer = 3 AND head = 5"),
}


def synthetic_batches(run_seed: int, cfg):
    """``batches(start)`` of CapturedBatches with plausible row/col statistics (no model)."""
    from attnbase.contract import CapturedBatch

    def batches(start: int):
        for k in range(start, -(-cfg.n_seqs // cfg.batch_size)):
            rng = np.random.default_rng([run_seed, k])
            first = k * cfg.batch_size
            n = min(cfg.batch_size, cfg.n_seqs - first)
            shape = (L, H, n, T)
            idx = np.indices(shape, dtype=np.int32).reshape(4, -1)
            q = idx[3]
            sink = rng.beta(2, 5, idx.shape[1]) * (1 + (idx[0] > 2))  # later layers sink more
            sink = np.minimum(sink, 1.0)
            row = {"layer": idx[0], "head": idx[1], "seq": idx[2] + first, "query": q,
                   "n_keys": q + 1, "sink_mass": sink, "max_prob": np.maximum(sink, 1 / (q + 1)),
                   "argmax": np.zeros_like(q), "entropy": rng.gamma(2.0, 1.0, q.size),
                   "sink_balance": rng.normal(size=q.size), "content_entropy": rng.gamma(2, 1, q.size),
                   "content_dispersion": rng.gamma(3, 1, q.size)}
            col = {"layer": idx[0], "head": idx[1], "seq": idx[2] + first, "key": q,
                   "received": rng.gamma(1.0, 1.0, q.size)}
            tokens = rng.integers(0, 1000, (n, T), dtype=np.int32)
            yield CapturedBatch(batch=k, first_seq=first, n_seqs=n, arrays={"tokens": tokens},
                                row_stats=row, col_stats=col)

    return batches


def build(db_path: Path, runs: int) -> float:
    from attnbase.contract import ModelInfo
    from attnbase.extract.config import ExtractConfig
    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database

    db = Database(db_path)
    info = ModelInfo(model="synthetic-gpt2-small", model_revision="seed:0", family="gpt2",
                     n_layers=L, n_heads=H, n_kv_heads=H, d_head=64, d_model=768, rotary=False,
                     causal=True, sink_token="<|bos|>")
    cfg = ExtractConfig(model="synthetic-gpt2-small", n_seqs=SEQS, seq_len=T, batch_size=BATCH,
                        capture=(), device="cpu")
    t0 = time.perf_counter()
    for r in range(runs):
        run_id = f"q{r}"
        rec = ingest_batches(db, run_id, cfg, info=info, corpus="synthetic", corpus_hash=str(r),
                             batches=synthetic_batches(r, cfg), progress=False)
        if rec.batches_written:
            rng = np.random.default_rng(r)
            layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
            db.replace_rows("head_metrics", run_id, {
                "layer": layer.ravel().astype(np.int16), "head": head.ravel().astype(np.int16),
                "metric": np.array(["key_norm_cv"] * (L * H)), "value": rng.random(L * H)},
                where="metric = 'key_norm_cv'")
    return time.perf_counter() - t0


def timed(f, repeat: int) -> tuple[float, list[float]]:
    f()  # warm-up (file system cache, DuckDB's first parse)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), ts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--db", type=Path, default=Path(__file__).parent / "out" / "queries-db")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--compare-views", action="store_true",
                    help="time the glob view and the listed-files view side by side")
    ap.add_argument("--views-only", action="store_true",
                    help="only the side-by-side comparison of the views (a built database)")
    args = ap.parse_args()
    if args.views_only:
        return compare_views(args, f"q{args.runs // 2}")

    import duckdb

    from attnbase.warehouse import Database, read_sql

    build_s = build(args.db, args.runs)
    n_rows = read_sql(args.db, "SELECT count(*) AS n FROM row_stats")["n"][0]
    n_cols = read_sql(args.db, "SELECT count(*) AS n FROM col_stats")["n"][0]
    files = sum(1 for _ in (args.db / "row_stats").rglob("*.parquet"))
    mib = sum(p.stat().st_size for p in (args.db / "row_stats").rglob("*.parquet")) / 2**20
    run = f"q{args.runs // 2}"
    db = Database(args.db)
    print(f"\n{n_rows:,} row_stats rows ({files} Parquet files, {mib:.0f} MiB) and {n_cols:,} "
          f"col_stats rows in {args.runs} runs; written through the run writer in {build_s:.0f} s "
          f"(0 when reused); load average {os.getloadavg()[0]:.1f}; medians of {args.repeat}\n")
    full, outs = {}, {}
    for name, q in QUERIES.items():  # through read_sql (its own connection each time)
        outs[name] = read_sql(db, q.replace("$run", "$1"), [run]).height
        full[name] = timed(lambda: read_sql(db, q.replace("$run", "$1"), [run]), args.repeat)[0]
    # then the query alone, on one open connection (another configuration: opened after)
    con = duckdb.connect(str(db.catalog_path), read_only=True,
                         config={"file_search_path": str(args.db.resolve())})
    print("| question | rows out | `read_sql` (what `attnbase sql` runs) ms | query on an open "
          "connection ms |")
    print("|---|---|---|---|")
    for name, q in QUERIES.items():
        only, _ = timed(lambda: con.execute(q.replace("$run", "$1"), [run]).fetchall(), args.repeat)
        print(f"| {name} | {outs[name]:,} | {full[name] * 1000:.0f} | {only * 1000:.0f} |")
    con.close()
    if args.compare_views:
        compare_views(args, run)


def compare_views(args, run: str) -> None:
    """The questions through the glob view and through the listed-files view, on one open
    connection, alternating (one warm-up each, then ``--repeat`` rounds of both)."""
    import duckdb

    from attnbase.warehouse.runs.statschema import view_sql

    con = duckdb.connect(str(args.db / "catalog.duckdb"), read_only=True,
                         config={"file_search_path": str(args.db.resolve())})
    listed = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'row_stats'"
                         ).fetchone()[0]
    views = {"glob": view_sql("row_stats").replace("CREATE OR REPLACE VIEW row_stats",
                                                   "CREATE OR REPLACE TEMP VIEW row_stats"),
             "listed": listed.replace("CREATE VIEW row_stats", "CREATE OR REPLACE TEMP VIEW "
                                      "row_stats")}
    n_files = listed.count(".parquet")
    print(f"\nrow_stats through the glob vs the {n_files} listed files, one open connection, "
          f"medians of {args.repeat} interleaved rounds (load average {os.getloadavg()[0]:.1f})\n")
    print("| question | files read (glob, listed) | glob ms | listed ms | listed / glob | glob CPU "
          "ms | listed CPU ms | listed / glob (CPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, q in QUERIES.items():
        sql = q.replace("$run", "$1")
        wall, cpu, rows, files = {k: [] for k in views}, {k: [] for k in views}, {}, {}
        for i in range(args.repeat + 1):
            for k, v in views.items():
                con.execute(v)
                if not i:
                    plan = con.execute("EXPLAIN ANALYZE " + sql, [run]).fetchall()[0][1]
                    files[k] = ",".join(re.findall(r"Scanning Files: (\d+/\d+)", plan))
                t0, c0 = time.perf_counter(), time.process_time()  # CPU: every DuckDB thread
                rows[k] = con.execute(sql, [run]).fetchall()
                if i:
                    wall[k].append(time.perf_counter() - t0)
                    cpu[k].append(time.process_time() - c0)
        assert len(rows["glob"]) == len(rows["listed"])  # (float sums: parallel order varies)
        g, li = statistics.median(wall["glob"]), statistics.median(wall["listed"])
        gc, lc = statistics.median(cpu["glob"]), statistics.median(cpu["listed"])
        print(f"| {name} | {files['glob']}, {files['listed']} | {g * 1000:.0f} | {li * 1000:.0f} "
              f"| {li / g:.2f} | {gc * 1000:.0f} | {lc * 1000:.0f} | {lc / gc:.2f} |")
    con.close()

if __name__ == "__main__":
    main()
