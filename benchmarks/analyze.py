"""Benchmark ``analyze_run`` on a MiniLM run of 256 sequences x 128 tokens.

Measures (1) the time to merely read the arrays analyze reads (``keys``, one layer at a time, as
``analyze_run`` streams them) from Zarr, (2) the wall time of ``analyze_run`` with the default
nulls (20 shuffle draws per head, 200 Gauss draws), split into its key-statistics part and the
rest (SQL aggregates, inserts, correlation, bootstrap), and (3) peak memory: tracemalloc's peak
of a second, traced analyze_run, and the process's peak RSS (``resource.getrusage``).

    .venv/bin/python benchmarks/analyze.py [--db benchmarks/out/analyze-db] [--seqs 256]
        [--seq-len 128] [--draws 20]

The run is extracted first (``attnbase extract``) unless the database already holds it.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="benchmarks/out/analyze-db")
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--gauss-draws", type=int, default=200)
    args = ap.parse_args()
    run = f"minilm-{args.seqs}x{args.seq_len}"

    from attnbase.stats.analyze import analyze_run, key_statistics
    from attnbase.warehouse import Database

    db = Database(args.db)
    info = db.find_run(run)
    if info is None or info["status"] != "complete":
        t0 = time.perf_counter()
        subprocess.run([str(Path(sys.executable).parent / "attnbase"), "extract", "--db", args.db,
                        "--model", "minilm", "--corpus", "default", "--seqs", str(args.seqs),
                        "--seq-len", str(args.seq_len), "--run", run, "--batch-size", "32",
                        "--device", "cpu"], check=True)
        print(f"extract: {time.perf_counter() - t0:.1f} s")
        info = db.run_info(run)
    L = int(info["n_layers"])

    t0 = time.perf_counter()
    nbytes = 0
    for layer in range(L):
        block = db.read_layer(run, "keys", layer)
        nbytes += block.nbytes
        block_mb = block.nbytes / 2**20
        del block
    t_read = time.perf_counter() - t0

    t0 = time.perf_counter()
    key_statistics(db, run, info, draws=args.draws, gauss_draws=args.gauss_draws, seed=0)
    t_keys = time.perf_counter() - t0

    t0 = time.perf_counter()
    out = analyze_run(db, run, draws=args.draws, gauss_draws=args.gauss_draws, seed=0)
    t_analyze = time.perf_counter() - t0

    tracemalloc.start()
    analyze_run(db, run, draws=args.draws, gauss_draws=args.gauss_draws, seed=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    with db.connect(read_only=True) as con:
        n_rows = con.execute("SELECT count(*) FROM row_stats WHERE run_id = ?", [run]).fetchone()[0]

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}")
    print(f"run {run}: {L} layers x {info['n_kv_heads']} kv heads, d_head {info['d_head']}; "
          f"keys {nbytes / 2**20:.0f} MiB in all, {block_mb:.0f} MiB per layer; "
          f"row_stats {n_rows:,} rows")
    print(f"read keys from Zarr (all layers):     {t_read:6.2f} s")
    print(f"key statistics + nulls ({args.draws} shuffle, {args.gauss_draws} Gauss draws): "
          f"{t_keys:6.2f} s")
    print(f"analyze_run total:                    {t_analyze:6.2f} s  "
          f"({t_analyze / t_read:.0f}x the read)")
    print(f"analyze_run peak traced memory:       {peak / 2**20:6.0f} MiB")
    print(f"process peak RSS:                     {maxrss_mb:6.0f} MiB")
    print("table1 row:", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()
                          if k in ("key_norm_cv", "key_norm_cv_baseline", "ve_at_8", "ve_gauss",
                                   "ve_shuffle", "onset_layer", "onset_depth", "r_cv_share",
                                   "r_cv_share_p")})


if __name__ == "__main__":
    main()
