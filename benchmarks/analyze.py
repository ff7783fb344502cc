"""Benchmark ``analyze_run`` on a MiniLM run of 256 sequences x 128 tokens.

Measures (1) the time to merely read the arrays analyze reads (``keys``, one layer at a time, as
``analyze_run`` streams them) from Zarr, (2) the wall time of ``analyze_run`` with the default
nulls (docs/metrics.md §8: per-sequence shuffle draws and a Gauss pool, combined by the CLT; 200
draws of each head's statistic for the empirical p-values), split into its key-statistics part
(first with the Gauss pool computed, cold, then cached) and the rest (SQL aggregates, inserts,
correlation, bootstrap), (3) peak memory: tracemalloc's peak of a second, traced analyze_run,
and the process's peak RSS (``resource.getrusage``), (4) how many heads beat each null, and (5)
the floor: only the BLAS/LAPACK calls ``analyze_run`` cannot do without (:func:`lapack_floor`).

    .venv/bin/python benchmarks/analyze.py [--db benchmarks/out/analyze-db] [--seqs 256]
        [--seq-len 128] [--draws 200] [--seq-draws N]

The run is extracted first (``attnbase extract``) unless the database already holds it.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def lapack_floor(info: dict, d_model: int | None, seq_draws: int | None, repeat: int = 3
                 ) -> tuple[float, float, int, int]:
    """Median wall and CPU seconds of the dense linear algebra ``analyze_run`` does, and nothing
    else, on random matrices of its shapes and counts: one float32 Gram matrix ``(d_head, d_head)``
    and one float64 ``eigvalsh`` per sequence of every (layer, kv head) and per shuffled copy
    (``shuffle_plan``); with ``hidden``, one float64 Gram ``(pos, pos)`` of the ``(pos, d_model)``
    residual and one ``eigvalsh`` per sequence of every hidden layer. Split over the CPU count in
    threads with one BLAS thread each, as ``analyze_run`` runs them. Returns ``(wall, cpu,
    n_key_matrices, n_hidden_matrices)``: a lower bound on ``analyze_run`` on this machine."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from attnbase.stats import geometry
    from attnbase.stats.analyze import shuffle_plan

    n_seqs, T, dh = int(info["n_seqs"]), int(info["seq_len"]), int(info["d_head"])
    m, D = shuffle_plan(n_seqs, None, seq_draws)
    n_keys = int(info["n_layers"]) * int(info["n_kv_heads"]) * (n_seqs + m * D)
    n_hidden = (int(info["n_layers"]) + 1) * n_seqs if d_model else 0
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((256, dh, T), dtype=np.float32)  # reused: content-blind cost
    hid = rng.standard_normal((16, T, d_model or 1))

    def key_part(n: int) -> None:
        for a in range(0, n, keys.shape[0]):
            x = keys[: min(keys.shape[0], n - a)]
            np.linalg.eigvalsh((x @ x.transpose(0, 2, 1)).astype(np.float64))

    def hidden_part(n: int) -> None:
        for a in range(0, n, hid.shape[0]):
            x = hid[: min(hid.shape[0], n - a)]
            np.linalg.eigvalsh(x @ x.transpose(0, 2, 1))

    workers = os.cpu_count() or 1
    parts = [(key_part, n_keys // workers + (i < n_keys % workers)) for i in range(workers)]
    parts += [(hidden_part, n_hidden // workers + (i < n_hidden % workers)) for i in range(workers)]
    runs = []
    with geometry._one_blas_thread(), ThreadPoolExecutor(workers) as pool:
        for _ in range(repeat):
            w, c = time.perf_counter(), time.process_time()
            list(pool.map(lambda fn_n: fn_n[0](fn_n[1]), parts))
            runs.append((time.perf_counter() - w, time.process_time() - c))
    wall, cpu = (statistics.median(x) for x in zip(*runs))
    return wall, cpu, n_keys, n_hidden


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="benchmarks/out/analyze-db")
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--gauss-draws", type=int, default=200)
    ap.add_argument("--seq-draws", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    run = f"minilm-{args.seqs}x{args.seq_len}"

    from attnbase.stats import geometry
    from attnbase.stats.analyze import analyze_run, gauss_cache_dir, key_statistics
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

    def read_all() -> int:
        nbytes = 0
        for layer in range(L):
            block = db.read_layer(run, "keys", layer)
            nbytes += block.nbytes
            del block
        return nbytes

    has_hidden = "hidden" in {r["name"] for r in db.array_rows(run)}

    def read_everything() -> int:
        """keys and, when captured, hidden: every array analyze_run reads."""
        nbytes = read_all()
        if has_hidden:
            for layer in range(L + 1):
                nbytes += db.read_layer(run, "hidden", layer).nbytes
        return nbytes

    def timed(fn):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        return out, time.perf_counter() - w, time.process_time() - c

    # the read of the keys, first as found (page cache as the extraction left it), then warm
    nbytes, t_read_first, c_read_first = timed(read_all)
    block_mb = nbytes / L / 2**20

    # cold: no Gauss pool cached in the process or on disk
    geometry._GAUSS_POOLS.clear()
    for f in gauss_cache_dir(db).glob("*.npy") if gauss_cache_dir(db).exists() else ():
        f.unlink()
    (_, nulls), t_keys_cold, c_keys_cold = timed(
        lambda: key_statistics(db, run, info, seed=0, seq_draws=args.seq_draws))

    # interleaved, so that both see the same load: read, analyze, read, analyze, read
    kw = dict(draws=args.draws, gauss_draws=args.gauss_draws, seed=0, seq_draws=args.seq_draws)
    reads, analyses = [], []
    for rep in range(args.repeat):
        reads.append(timed(read_all)[1:])
        out, w, c = timed(lambda: analyze_run(db, run, **kw))
        analyses.append((w, c))
    reads.append(timed(read_all)[1:])
    t_read, c_read = (statistics.median(x) for x in zip(*reads))
    t_read_all = statistics.median(timed(read_everything)[1] for _ in range(3))
    t_analyze, c_analyze = (statistics.median(x) for x in zip(*analyses))
    d_model = int(db.read_layer(run, "hidden", 0).shape[-1]) if has_hidden else None
    f_wall, f_cpu, f_keys, f_hidden = lapack_floor(info, d_model, args.seq_draws)
    load = os.getloadavg()

    tracemalloc.start()
    analyze_run(db, run, **kw)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    with db.connect(read_only=True) as con:
        n_rows = con.execute("SELECT count(*) FROM row_stats WHERE run_id = ?", [run]).fetchone()[0]
        beat = con.execute(
            "SELECT null_model, count(*) FILTER (WHERE q_value < 0.05), count(*), "
            "count(*) FILTER (WHERE p_value < 0.05), count(*) FILTER (WHERE p_at_floor), "
            "min(z), median(z), max(z), min(p_empirical) "
            "FROM null_tests WHERE run_id = ? AND metric = 've_at_8' GROUP BY null_model "
            "ORDER BY null_model", [run]).fetchall()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}")
    print(f"run {run}: {L} layers x {info['n_kv_heads']} kv heads, d_head {info['d_head']}; "
          f"keys {nbytes / 2**20:.0f} MiB in all, {block_mb:.0f} MiB per layer; "
          f"row_stats {n_rows:,} rows")
    print(f"load average during the runs (1/5/15 min): {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    print(f"read keys from Zarr (all layers), first read: {t_read_first:6.2f} s wall "
          f"({c_read_first:5.2f} s CPU)")
    print(f"read keys, median of {len(reads)} (interleaved): {t_read:6.2f} s wall "
          f"({c_read:5.2f} s CPU)")
    print(f"key statistics + nulls, Gauss pool computed (cold): {t_keys_cold:6.2f} s wall "
          f"({c_keys_cold:5.2f} s CPU); {nulls['seq_draws']} shuffled copies per sequence, "
          f"Gauss pool {nulls['gauss_pool'].size}")
    print(f"analyze_run, median of {len(analyses)} (pool cached): {t_analyze:6.2f} s wall "
          f"({c_analyze:5.2f} s CPU) = {t_analyze / t_read:.1f}x the read wall, "
          f"{c_analyze / c_read:.1f}x its CPU")
    if has_hidden:
        print(f"read keys + hidden (all analyze_run reads; it also computes the depth statistics "
              f"of hidden), median of 3: {t_read_all:6.2f} s wall; analyze_run = "
              f"{t_analyze / t_read_all:.1f}x it")
    print(f"floor, the Gram products and eigvalsh alone ({f_keys:,} of {info['d_head']} x "
          f"{info['d_head']} for the keys, {f_hidden:,} of {info['seq_len']} x {info['seq_len']} for "
          f"hidden; {os.cpu_count()} threads, median of 3): {f_wall:6.2f} s wall ({f_cpu:5.2f} s "
          f"CPU) = {f_wall / t_read:.1f}x the keys read; analyze_run = {t_analyze / f_wall:.2f}x it")
    print("  all runs (wall s, CPU s): reads", [(round(w, 2), round(c, 2)) for w, c in reads],
          "analyses", [(round(w, 2), round(c, 2)) for w, c in analyses])
    print(f"analyze_run peak traced memory:       {peak / 2**20:6.0f} MiB")
    print(f"process peak RSS:                     {maxrss_mb:6.0f} MiB")
    for name, n_beat, n, n_p, n_floor, zmin, zmed, zmax, pe in beat:
        print(f"VE@8 vs {name}: {n_beat} of {n} heads with BH q < 0.05 ({n_p} with p < 0.05), "
              f"z min/median/max {zmin:.1f} / {zmed:.1f} / {zmax:.1f}; empirical p at its floor "
              f"{pe:.4f} for {n_floor} heads ({args.draws if name == 'shuffle' else args.gauss_draws}"
              f" draws)")
    print("table1 row:", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()
                          if k in ("key_norm_cv", "key_norm_cv_baseline", "ve_at_8", "ve_gauss",
                                   "ve_shuffle", "onset_layer", "onset_depth", "r_cv_share",
                                   "r_cv_share_p")})


if __name__ == "__main__":
    main()
