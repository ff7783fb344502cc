"""Stored arrays bit-identical to another version's, row statistics within 1e-6 relative.

Extracts the same runs with two source trees, each in its own ``attnbase extract`` process:
``--base-src`` (e.g. main's code: ``git archive main src | tar -x -C /tmp/base``) and this
checkout's ``src``; then compares every stored array bit for bit (the raw bytes, so NaN/-inf
patterns and signed zeros count) and every ``row_stats`` / ``col_stats`` value (max relative
difference, NaN where and only where the other has NaN).

Run: ``python benchmarks/identical.py --base-src /tmp/base/src [--models tiny-gpt2,tiny-llama,minilm]
[--stage-ahead]``. Arrays this checkout derives (``attn_logits`` of the default capture) are read
through its reader and compared with the base's stored ones.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE_SRC = Path(__file__).resolve().parent.parent / "src"


def extract(src: Path, db: Path, model: str, args) -> None:
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    if args.stage_ahead and src == HERE_SRC:  # the GPU box's writer loop, forced on the CPU
        env["ATTNBASE_STAGE_AHEAD"] = "1"
    cmd = [sys.executable, "-m", "attnbase.cli", "extract", "--model", model, "--seqs",
           str(args.seqs), "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
           "--run", "r", "--db", str(db), "--device", "cpu", "-q"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"extract with {src} failed: {p.stderr[-2000:]}")


def read_stats(db: Path, table: str) -> dict[str, np.ndarray]:
    import duckdb

    key = "query" if table == "row_stats" else "key"
    con = duckdb.connect(str(db / "catalog.duckdb"), read_only=True,
                         config={"file_search_path": str(db.resolve())})
    try:
        tbl = con.sql(f"SELECT * FROM {table} ORDER BY layer, head, seq, {key}").to_arrow_table()
    finally:
        con.close()
    return {c: tbl[c].to_numpy(zero_copy_only=False) for c in tbl.column_names}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-src", type=Path, required=True)
    ap.add_argument("--models", default="tiny-gpt2,tiny-llama,minilm")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--stage-ahead", action="store_true",
                    help="this checkout's run stages batches in a writer thread ahead of the "
                         "next capture (ATTNBASE_STAGE_AHEAD=1, the GPU path's loop)")
    args = ap.parse_args()
    if not (args.base_src / "attnbase" / "__init__.py").is_file():
        # without it the child would import this checkout's attnbase (an editable install)
        raise SystemExit(f"--base-src {args.base_src} holds no attnbase package; make one with "
                         "`git archive REV src | tar -x -C DIR` and pass DIR/src")
    import zarr

    tmp = Path(tempfile.mkdtemp(prefix="attnbase-identical-"))
    ok = True
    try:
        for model in args.models.split(","):
            a, b = tmp / f"{model}-base", tmp / f"{model}-new"
            extract(args.base_src, a, model, args)
            extract(HERE_SRC, b, model, args)
            from attnbase.warehouse.runs.store import RunStore

            ga = zarr.open_group(str(a / "runs" / "r" / "store.zarr"), mode="r")
            gb = zarr.open_group(str(b / "runs" / "r" / "store.zarr"), mode="r")
            # this checkout's reader: an array the base stores and this one derives (attn_logits
            # of the default capture) is formed from its queries and keys and compared too
            rb = RunStore(b / "runs" / "r" / "store.zarr", "r")
            names = sorted(k for k, _ in ga.arrays())
            assert set(names) <= set(rb.names()), (names, rb.names())
            same = []
            for name in names:
                derived = name in rb.derived()
                x = np.asarray(ga[name][...])
                y = rb.read(name) if derived else np.asarray(gb[name][...])
                eq = x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
                same.append(f"{name}{' (derived here)' if derived else ''} "
                            f"{'bit-identical' if eq else 'DIFFERENT'}")
                ok &= eq
            worst = {}
            for table in ("row_stats", "col_stats"):
                sa, sb = read_stats(a, table), read_stats(b, table)
                for col, va in sa.items():
                    if col == "run_id":
                        continue
                    vb = sb[col]
                    va, vb = np.asarray(va, dtype=np.float64), np.asarray(vb, dtype=np.float64)
                    nan_ok = np.array_equal(np.isnan(va), np.isnan(vb))
                    m = ~np.isnan(va)
                    rel = np.abs(va[m] - vb[m]) / np.maximum(np.abs(va[m]), 1e-300)
                    worst[f"{table}.{col}"] = (float(rel.max()) if rel.size else 0.0, nan_ok)
                    ok &= nan_ok and (rel.size == 0 or rel.max() <= 1e-6)
            print(f"{model}: " + "; ".join(same))
            print("  max relative difference of statistics: " + ", ".join(
                f"{k} {v:.1e}" + ("" if n else " (NaN pattern differs)") for k, (v, n) in worst.items()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ALL IDENTICAL / WITHIN 1e-6" if ok else "DIFFERENCES FOUND")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
