"""How much disk writes beside a forward slow the forward down, on this machine.

A bare eager GPT-2-small forward (8 x 128, ``output_attentions=True``, the extract benchmark's
baseline) is timed alone and with a thread beside it that writes what one attnbase batch writes
(``--mib`` MiB as 50 files) every ``--every`` seconds: once fsyncing the files, once leaving them
to the kernel's writeback, and once written with ``O_DIRECT`` (from page-aligned memory, no copy
into the page cache) and fsynced: whether the cost is the guest's copy or the device's I/O (the
mode is left out where the file system refuses ``O_DIRECT``). ``--dir /dev/shm`` puts the files
on tmpfs: a copy into memory, no device. Rounds interleave the modes, and each mode starts after
an untimed ``os.sync()``. The CPU columns are jiffies (1/100 s, all CPUs) from ``/proc/stat``
during the mode: ``steal`` is time the hypervisor ran something else on our vCPUs.

This separates what a capture costs from what writing its bytes costs: on a VM where I/O takes
CPU from the guest, no capture that writes its arrays can match a forward that writes nothing.

Run::

    python benchmarks/io_interference.py --rounds 3
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))


def _stat() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


DIRECT = "O_DIRECT write + fsync"


def _direct_ok(out: Path) -> bool:
    """Whether ``out``'s file system takes ``O_DIRECT`` (older kernels' tmpfs does not)."""
    try:
        fd = os.open(out / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    (out / "probe").unlink()
    return True


def _writer(out: Path, mode: str, mib: int, every: float, stop: threading.Event) -> None:
    import numpy as np

    # written straight from the array, as the store writes chunks (no per-file bytes copy)
    n = mib * 2**20 // 50 // 4096 * 4096  # a multiple of the block size, for O_DIRECT
    buf = np.frombuffer(mmap.mmap(-1, n), dtype=np.uint8)  # page-aligned
    buf[:] = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    k = 0
    while not stop.is_set():
        paths = []
        for i in range(50):
            p = out / f"f{k % 2}_{i}"
            if mode == DIRECT:
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
                try:
                    os.write(fd, buf)
                finally:
                    os.close(fd)
            else:
                with open(p, "wb") as f:
                    f.write(buf)
            paths.append(p)
        if mode in ("write + fsync", DIRECT):
            for p in paths:
                fd = os.open(p, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
        k += 1
        stop.wait(every)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--forwards", type=int, default=5, help="forwards timed per mode and round")
    ap.add_argument("--mib", type=int, default=150, help="MiB written per cycle (one GPT-2 batch)")
    ap.add_argument("--every", type=float, default=0.8, help="seconds between write cycles")
    ap.add_argument("--dir", default=None, help="where the files go (default: the temp dir)")
    args = ap.parse_args()

    import torch
    import transformers as tf
    from extract import gpt2_small_dir

    tmp = Path(tempfile.mkdtemp(prefix="attnbase-io-", dir=args.dir))
    try:
        model = tf.AutoModel.from_pretrained(gpt2_small_dir(tmp), attn_implementation="eager").eval()
        ids = torch.randint(0, model.config.vocab_size, (8, 128), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            model(input_ids=ids, output_attentions=True)  # warm-up
        modes = ("no writes", "write + fsync", "write, no fsync") + ((DIRECT,) if _direct_ok(tmp) else ())
        rows: dict[str, list[tuple[float, list[int]]]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in modes:
                os.sync()
                stop = threading.Event()
                th = None
                if mode != "no writes":
                    th = threading.Thread(target=_writer, args=(tmp, mode, args.mib, args.every, stop))
                    th.start()
                s0, t0 = _stat(), time.perf_counter()
                with torch.inference_mode():
                    for _ in range(args.forwards):
                        model(input_ids=ids, output_attentions=True)
                wall = (time.perf_counter() - t0) / args.forwards
                s1 = _stat()
                stop.set()
                if th is not None:
                    th.join()
                rows[mode].append((wall, [b - a for a, b in zip(s0, s1)]))
                print(f"  round {r + 1}: {mode}: {wall:.3f} s per forward", file=sys.stderr, flush=True)
        print(f"\nfiles in {tmp} ({'O_DIRECT' if DIRECT in modes else 'no O_DIRECT'}); "
              f"{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs; {args.mib} MiB "
              f"written every {args.every} s beside the forward; medians of {args.rounds} rounds "
              f"of {args.forwards} forwards\n")
        print("| beside the forward | s per forward | x alone | user | system | steal |")
        print("|---|---|---|---|---|---|")
        alone = statistics.median(w for w, _ in rows["no writes"])
        for mode, rs in rows.items():
            w = statistics.median(x for x, _ in rs)
            med = [statistics.median(d[i] for _, d in rs) for i in (0, 2, 7)]
            print(f"| {mode} | {w:.3f} | {w / alone:.2f} | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.0f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
