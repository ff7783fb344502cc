"""Extraction overhead: full capture + compressed Zarr write + catalog vs a bare eager forward.

For each model, over the same token windows and batches:

* ``bare``: ``model(input_ids)`` under ``torch.inference_mode()`` with HF's eager attention and
  nothing captured (the floor any extraction has to pay);
* ``extract``: :func:`attnbase.warehouse.ingest.ingest_batches` with full capture (keys,
  queries, logits, hidden), row/col stats, zstd+crc32c chunk writes (fsynced) and one catalog
  transaction per batch; writes overlap the next batch's forward in a background thread;
* ``extract (no overlap)``: the same with the writes in the main thread.

Model loading and corpus tokenisation are excluded from both sides (reported separately).
Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/extract.py [--seqs 64 --seq-len 128
--batch-size 8 --repeat 2]``; results are appended as a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def bare_forward(lm_eager, tokens, batch_size: int) -> float:
    import torch

    model = lm_eager.model
    t0 = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(tokens), batch_size):
            ids = torch.as_tensor(tokens[first:first + batch_size], dtype=torch.long,
                                  device=lm_eager.device)
            model(input_ids=ids)
    return time.perf_counter() - t0


def extract(lm, win, cfg, root: Path, background: bool) -> tuple[float, int, int]:
    from attnbase import extract as ex
    from attnbase.warehouse import Database
    from attnbase.warehouse.ingest import ingest_batches

    shutil.rmtree(root, ignore_errors=True)
    db = Database(root)
    db.migrate()  # catalog creation is a one-off, not per-batch cost

    def batches(start):
        return ex.capture_batches(lm, win.tokens, batch_size=cfg.batch_size, capture=cfg.capture,
                                  start_batch=start)

    t0 = time.perf_counter()
    rec = ingest_batches(db, "bench", cfg, info=lm.info, corpus=win.corpus,
                         corpus_hash=win.corpus_hash, batches=batches, progress=False,
                         background_write=background)
    wall = time.perf_counter() - t0
    disk = sum(p.stat().st_size for p in rec.store_path.rglob("*") if p.is_file())
    from attnbase.warehouse.store import RunStore

    store = RunStore(rec.store_path, "bench")
    values = sum(store.array(n).size for n in store.names())
    return wall, disk, values


def breakdown(lm, lm_eager, win, cfg, root: Path, repeat: int) -> dict[str, float]:
    """Each part of one extraction alone, serially, best of ``repeat`` (seconds)."""
    from attnbase import extract as ex
    from attnbase.warehouse import Database
    from attnbase.warehouse.catalog import insert_rows, to_arrow
    from attnbase.warehouse.store import RunStore, array_specs

    def best(f):
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    out = {"bare forward": best(lambda: bare_forward(lm_eager, win.tokens, cfg.batch_size))}
    cbs = list(ex.capture_batches(lm, win.tokens, batch_size=cfg.batch_size, capture=cfg.capture))
    out["capture, full"] = best(lambda: list(ex.capture_batches(
        lm, win.tokens, batch_size=cfg.batch_size, capture=cfg.capture)))
    out["capture, stats only"] = best(lambda: list(ex.capture_batches(
        lm, win.tokens, batch_size=cfg.batch_size, capture=())))
    shutil.rmtree(root, ignore_errors=True)
    db = Database(root)
    db.migrate()
    specs = array_specs(lm.info, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
                        dtype=cfg.dtype, capture=cfg.capture)
    store = RunStore(db.store_path("b"), "b")
    store.create(specs)
    out["zarr write (zstd+crc32c)"] = best(lambda: [store.write_batch(cb, specs, fsync=False)
                                                    for cb in cbs])
    out["zarr write + fsync"] = best(lambda: [store.write_batch(cb, specs, fsync=True)
                                              for cb in cbs])

    def catalog():
        for cb in cbs:
            lo, hi = cb.first_seq, cb.first_seq + cb.n_seqs
            with db.transaction() as con:
                for table, cols in (("row_stats", cb.row_stats), ("col_stats", cb.col_stats)):
                    insert_rows(con, table, "b", to_arrow(cols), where="seq >= ? AND seq < ?",
                                params=(lo, hi))

    out["catalog (row/col stats, 1 txn/batch)"] = best(catalog)
    out["raw MiB captured"] = sum(v.nbytes for cb in cbs for v in cb.arrays.values()) / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny-gpt2,minilm")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="best of N for every timing")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    import torch

    from attnbase import extract as ex
    from attnbase.extract.config import ExtractConfig

    rows, parts = [], {}
    tmp = Path(tempfile.mkdtemp(prefix="attnbase-bench-"))
    try:
        for name in args.models.split(","):
            t0 = time.perf_counter()
            lm = ex.load_model(name, dtype="float32", device=args.device)
            load_s = time.perf_counter() - t0
            lm_eager = ex.load_model(name, dtype="float32", device=args.device,
                                     attn_implementation="eager")
            lm_eager.model.load_state_dict(lm.model.state_dict())
            cfg = ExtractConfig(model=name, n_seqs=args.seqs, seq_len=args.seq_len,
                                batch_size=args.batch_size, device=args.device)
            win = ex.corpus_windows(lm, corpus="default", n_seqs=cfg.n_seqs, seq_len=cfg.seq_len,
                                    seed=0)
            # warm-up both paths (lazy imports, allocator, codec pools) outside the timings
            for _ in range(3):  # the first forwards on CPU are several times slower
                bare_forward(lm_eager, win.tokens[: 2 * args.batch_size], args.batch_size)
            warm = ExtractConfig(model=name, n_seqs=args.batch_size, seq_len=args.seq_len,
                                 batch_size=args.batch_size, device=args.device)
            extract(lm, ex.corpus_windows(lm, corpus="default", n_seqs=args.batch_size,
                                          seq_len=args.seq_len, seed=0), warm, tmp / "warm", True)
            # interleaved, best of N: the machine may be shared
            bares, runs, serials = [], [], []
            for _ in range(args.repeat):
                bares.append(bare_forward(lm_eager, win.tokens, args.batch_size))
                runs.append(extract(lm, win, cfg, tmp / name, background=True))
                serials.append(extract(lm, win, cfg, tmp / name, background=False)[0])
            bare, (wall, disk, values), serial = min(bares), min(runs), min(serials)
            rows.append((name, lm.info, load_s, bare, wall, serial, disk, values))
            parts[name] = breakdown(lm, lm_eager, win, cfg, tmp / f"{name}-parts", args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, device {args.device}; {args.seqs} seqs x "
          f"{args.seq_len} tokens, batch {args.batch_size}, best of {args.repeat}\n")
    print("| model | L x H | load s | bare eager forward s | extract s | ratio | "
          "extract, no write overlap s | ratio | MiB on disk | bytes / value |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, info, load_s, bare, wall, serial, disk, values in rows:
        print(f"| {name} | {info.n_layers} x {info.n_heads} | {load_s:.1f} | {bare:.2f} | "
              f"{wall:.2f} | **{wall / bare:.2f}** | {serial:.2f} | {serial / bare:.2f} | "
              f"{disk / 2**20:.1f} | {disk / values:.2f} |")
    names = list(parts)
    print("\nWhere the time goes (each part alone, serial, seconds):\n")
    print("| part | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for key in parts[names[0]]:
        print(f"| {key} | " + " | ".join(f"{parts[n][key]:.2f}" for n in names) + " |")


if __name__ == "__main__":
    main()
