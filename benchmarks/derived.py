"""Reading derived logits against reading stored ones, side by side in one process.

Two runs of one model on the same windows: ``stored`` (``--capture keys,queries,logits,hidden``)
and ``derived`` (the default capture: queries and keys stored, ``attn_logits`` formed on read).
Untimed: both extractions (their bytes are reported). Timed, interleaved over ``--repeat``
rounds (medians, so machine load hits both alike): ``study distances`` (streams every row of
every head's logits), a full read of ``attn_logits`` layer by layer (``Database.read_layers``),
and ``verify``. The derived values are checked equal to the stored ones before timing.

Run::

    HF_HUB_OFFLINE=1 python benchmarks/derived.py --model minilm --seqs 64 --seq-len 128
    HF_HUB_OFFLINE=1 python benchmarks/derived.py --model gpt2-small --seqs 32 --seq-len 128
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmpdir", default=None)
    args = ap.parse_args()

    import numpy as np

    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.stats.studies import distances_study
    from attnbase.warehouse import Database
    from attnbase.warehouse.runs.store import RunStore
    from attnbase.warehouse.runs.verify import verify

    tmp = Path(tempfile.mkdtemp(prefix="attnbase-derived-", dir=args.tmpdir))
    try:
        model = args.model
        if model == "gpt2-small":
            from extract import gpt2_small_dir

            model = str(gpt2_small_dir(tmp))
        db = Database(tmp / "db")
        for run, capture in (("stored", ("keys", "queries", "logits", "hidden")), ("derived", None)):
            kw = {} if capture is None else {"capture": capture}
            cfg = ExtractConfig(model=model, n_seqs=args.seqs, seq_len=args.seq_len,
                                batch_size=args.batch_size, device="cpu", **kw)
            t0 = time.perf_counter()
            extract_run(db, run, cfg, progress=False)
            print(f"  extract {run}: {time.perf_counter() - t0:.1f} s, "
                  f"{_size(db.store_path(run)) / 2**20:.0f} MiB store", file=sys.stderr, flush=True)
        a = RunStore(db.store_path("stored"), "stored").read_layer("attn_logits", 0)
        b = RunStore(db.store_path("derived"), "derived").read_layer("attn_logits", 0)
        assert np.array_equal(a, b), "derived logits differ from the stored ones"

        def read_all(run: str) -> float:
            t0 = time.perf_counter()
            for _, block in db.read_layers(run, "attn_logits"):
                del block
            return time.perf_counter() - t0

        def study(run: str) -> float:
            t0 = time.perf_counter()
            distances_study(db, run)
            return time.perf_counter() - t0

        def check(run: str) -> float:
            t0 = time.perf_counter()
            assert verify(db, run).ok
            return time.perf_counter() - t0

        tasks = {"study distances": study, "read attn_logits": read_all, "verify": check}
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.repeat):
            for name, f in tasks.items():
                for run in ("stored", "derived"):
                    os.sync()
                    t = f(run)
                    times.setdefault((name, run), []).append(t)
                    print(f"  round {r + 1}: {name} {run} {t:.2f} s", file=sys.stderr, flush=True)
        sizes = {run: _size(db.store_path(run)) for run in ("stored", "derived")}
        print(f"\n{args.model}, {args.seqs} x {args.seq_len}, batch {args.batch_size}; medians "
              f"of {args.repeat} interleaved rounds\n")
        print(f"store bytes: stored logits {sizes['stored'] / 2**20:.0f} MiB, derived "
              f"{sizes['derived'] / 2**20:.0f} MiB ({sizes['stored'] / sizes['derived']:.2f}x "
              "fewer)\n")
        print("| task | stored logits s | derived s | derived / stored (median of per-round "
              "ratios) |")
        print("|---|---|---|---|")
        for name in tasks:
            s, d = times[(name, "stored")], times[(name, "derived")]
            ratio = statistics.median(y / x for x, y in zip(s, d))
            print(f"| {name} | {statistics.median(s):.2f} | {statistics.median(d):.2f} | "
                  f"**{ratio:.2f}** |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
