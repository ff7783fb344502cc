"""The decoded-chunk cache on the head page's read path, two versions side by side (not a test).

    python benchmarks/decoded_ab.py --db D --other <tree>/src/attnbase/warehouse/runs/decoded.py
                                    [--run minilm-bench] [--rounds 30] [--reads 200] [--threads 8]

``D`` is a database that ``benchmarks/serve.py --db D`` built (its ``minilm-bench`` run); the
other ``decoded.py`` is another tree's module (e.g. ``git archive <commit> src | tar -x -C
<base>``). Each version gets its own :class:`Decoded` (64 MiB) and run store; in alternating
rounds, each reads one head's derived logits of one sequence (the head page's read) at random:
first on one thread (CPU per read, ``time.process_time``), then on ``--threads`` threads sharing
the cache (reads per second). Prints the medians from round 3 on, the per-round ratio and the
caches' hits and misses.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE_SRC = Path(__file__).resolve().parent.parent / "src"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _reads(store, seed: int, n: int, shape: tuple[int, int, int]) -> None:
    rnd = random.Random(seed)
    for _ in range(n):
        store.read("attn_logits", tuple(rnd.randrange(k) for k in shape))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--other", type=Path, required=True, help="another tree's decoded.py")
    ap.add_argument("--run", default="minilm-bench")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE_SRC))
    import torch

    torch.set_num_threads(1)  # as the service: one torch thread per request
    import attnbase.warehouse.runs.decoded as here
    from attnbase.warehouse import Database
    from attnbase.warehouse.runs.store import RunStore

    db = Database(args.db)
    info = db.run_info(args.run)
    shape = (int(info["n_layers"]), int(info["n_heads"]), int(info["n_seqs"]))
    versions = {"other": _module(args.other, "other_decoded"), "this": here}
    caches = {k: m.Decoded(64 << 20) for k, m in versions.items()}
    stores = {k: RunStore(db.store_path(args.run), args.run, keep_open=True, decoded=caches[k])
              for k in versions}
    cpu = {k: [] for k in versions}
    rate = {k: [] for k in versions}
    for rnd in range(args.rounds):
        for k in (list(versions) if rnd % 2 == 0 else list(versions)[::-1]):
            t0 = time.process_time()
            _reads(stores[k], rnd, args.reads, shape)
            cpu[k].append((time.process_time() - t0) / args.reads * 1e3)
            ts = [threading.Thread(target=_reads, args=(stores[k], rnd * 1000 + i, args.reads,
                                                        shape)) for i in range(args.threads)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            rate[k].append(args.threads * args.reads / (time.perf_counter() - t0))
    for k in versions:
        print(f"{k:5s}: {np.median(cpu[k][2:]):.3f} ms CPU per read (one thread), "
              f"{np.median(rate[k][2:]):.0f} reads/s ({args.threads} threads); "
              f"hits {caches[k].hits}, misses {caches[k].misses}")
    for name, d in (("CPU per read", cpu), ("reads/s", rate)):
        r = np.array(d["this"][2:]) / np.array(d["other"][2:])
        print(f"this / other, {name}: median of rounds {np.median(r):.3f} "
              f"(geometric mean {np.exp(np.log(r).mean()):.3f}, {r.min():.2f}-{r.max():.2f})")


if __name__ == "__main__":
    main()
