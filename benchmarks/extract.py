"""Extraction cost side by side in one process: attnbase vs a bare forward vs TransformerLens.

For each model, over the same token windows and batches, interleaved (one round = every
variant once; medians over ``--repeat`` rounds, so machine load hits all variants alike):

* ``bare eager``: ``model(input_ids, output_attentions=True)`` with HF's eager attention under
  ``torch.inference_mode()``: the floor of any capture that sees attention scores;
* ``bare sdpa``: the same forward with ``sdpa`` attention and nothing returned (the fastest
  forward, which no capture of scores can match);
* ``attnbase default``: :func:`attnbase.runner.ingest_batches` with the default capture (keys,
  queries, hidden; ``attn_logits`` derived from queries and keys on read, none stored), row/col
  statistics, checksummed chunk writes (fsynced), per-batch statistics files and ledger rows;
  writes overlap the next forward;
* ``attnbase stored logits``: the same with ``--capture keys,queries,logits,hidden`` (the full
  capture that was the default before derived logits);
* ``attnbase keys+logits``: the same with ``--capture keys,logits``;
* ``TransformerLens``: (GPT-2 only) TransformerLens 4.x ``build_bridge_from_module`` around a
  deep copy of the same weights (``GPT2LMHeadModel``), ``run_with_cache`` with a names filter
  for keys, queries, attention scores and residual streams, then ``np.save`` of each cached
  array per batch (the "cache then save" script attnbase replaces), timed until the last
  ``np.save`` returns; ``TransformerLens 4 + sync`` is the same run timed until ``os.sync()``
  after it returns, i.e. until its files are on disk, as attnbase's are (it fsyncs each batch
  before counting it);
* ``nnsight 0.8``: (GPT-2 only) nnsight's ``TransformersModel`` around a deep copy of the same
  eager model, one ``trace`` per batch saving, per layer, what the TransformerLens route saves:
  the block's input (the residual stream), the queries and keys (``attn.c_attn``'s output
  split), and the attention probabilities (the attention module's second output under eager
  attention; TransformerLens saves the pre-softmax scores, the same shape and bytes), then
  ``np.save`` of each; ``nnsight 0.8 + sync`` is timed until ``os.sync()`` after it returns.
  Before the rounds, a tiny GPT-2 traced the same way must give exactly HF's own
  ``output_attentions``, ``output_hidden_states`` and ``c_attn`` split, or the run stops;
* ``bare eager + bytes``: the ``bare eager`` forwards, and after each one the files of one
  attnbase full-capture batch (as many, of the same sizes, as the warm-up run's one-batch store
  holds) written from a prepared buffer, then fsynced in a background thread while the next
  forward runs: attnbase's write pattern with no capture at all. Its ratio is what the bytes
  alone cost on this machine, the floor of any capture that stores them durably;
* ``attnbase extract process``: the whole ``attnbase extract`` command in a fresh process
  (imports, model load, tokenisation, capture, writes), wall time and peak RSS;
* ``bare eager process``: the plain script a whole-process time compares with: a fresh Python
  process that imports torch and transformers, loads the same directory with HF's eager
  attention (``from_pretrained``, the class attnbase loads) and runs the ``bare eager`` forwards
  over the same windows, read from an ``.npy`` file (no tokenizer: a floor, not a rival), and
  saves nothing. ``attnbase extract process`` is reported against it as well as against the
  in-process forward.

Every variant starts after an untimed ``os.sync()``, so none pays for the writeback of another's
files (on this VM disk writes take CPU time from whatever runs beside them).

Also: bytes on disk per stored value, and the peak RSS of the extract process at ``--seqs / 10``
(``--repeat`` processes) and at ``--seqs`` windows (the rounds' processes), medians (must be flat: the runner holds one batch in flight, not the run).

Run (GPT-2-small shape with random weights and the bundled tokenizer, and MiniLM)::

    HF_HUB_OFFLINE=1 python benchmarks/extract.py --models gpt2-small,minilm --seqs 150 \
        --seq-len 128 --batch-size 8 --repeat 3

Without ``attnbase.runner`` on the path (the code before issue 11) the attnbase variants use
``attnbase.warehouse.ingest.ingest_batches``, so the same script measures "before".
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "--threads" in sys.argv:  # before torch / numba read them; children inherit them
    _n = sys.argv[sys.argv.index("--threads") + 1]
    for _k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[_k] = _n

from extract_peers import NNS, TL, nnsight_check, nnsight_model, nnsight_run, tl_run  # noqa: E402


def gpt2_small_dir(root: Path) -> Path:
    """A GPT-2-small-shaped model (12 x 12 heads, d_model 768) with seeded random weights and the
    bundled BPE tokenizer, saved as a local HF directory (what ``--model DIR`` loads)."""
    import torch
    import transformers as tf

    from attnbase.extract.models import tiny_tokenizer

    d = root / "gpt2-small-random"
    if not (d / "config.json").exists():
        tok = tiny_tokenizer()
        cfg = tf.GPT2Config(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id)
        torch.manual_seed(0)
        tf.GPT2LMHeadModel(cfg).save_pretrained(d)
        tok.save_pretrained(d)
    return d


def model_arg(name: str, root: Path) -> str:
    return str(gpt2_small_dir(root)) if name == "gpt2-small" else name


def forward(model, tokens, batch_size: int, **kw) -> float:
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(tokens), batch_size):
            ids = torch.as_tensor(tokens[first:first + batch_size], dtype=torch.long)
            model(input_ids=ids, **kw)
    return time.perf_counter() - t0


def _ingest():
    try:
        from attnbase.runner import ingest_batches
    except ImportError:  # the code before issue 11
        from attnbase.warehouse.ingest import ingest_batches
    return ingest_batches


def attnbase_run(lm, win, cfg, root: Path, stage_ahead: bool = False) -> tuple[float, int, int]:
    """Seconds of one extraction into a fresh database, bytes on disk, stored values.
    ``stage_ahead``: the GPU box's writer loop (the writer pool beside the forward, two buffer
    sets), as ``ATTNBASE_STAGE_AHEAD=1`` makes ``attnbase extract`` use it."""
    from attnbase import extract as ex
    from attnbase.warehouse import Database

    shutil.rmtree(root, ignore_errors=True)
    db = Database(root)
    db.migrate()  # catalog creation is a one-off, not per-run cost

    import inspect

    # as attnbase.runner.extract_run does (the code before buffer reuse has no such option)
    reuse = ({"reuse_buffers": 2 if stage_ahead else True}
             if "reuse_buffers" in inspect.signature(ex.capture_batches).parameters else {})
    ahead = {"stage_ahead": True} if stage_ahead else {}

    def batches(start):
        return ex.capture_batches(lm, win.tokens, batch_size=cfg.batch_size, capture=cfg.capture,
                                  start_batch=start, **reuse)

    t0 = time.perf_counter()
    _ingest()(db, "bench", cfg, info=lm.info, corpus=win.corpus, corpus_hash=win.corpus_hash,
              batches=batches, progress=False, **ahead)
    wall = time.perf_counter() - t0
    disk = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    import zarr

    grp = zarr.open_group(str(db.store_path("bench")), mode="r")
    values = sum(a.size for _, a in grp.arrays())
    return wall, disk, values


def chunk_sizes(store: Path) -> list[int]:
    """Sizes of the chunk files of a one-batch store (its ``c/...`` files; no metadata)."""
    return sorted(p.stat().st_size for p in store.rglob("*")
                  if p.is_file() and "c" in p.relative_to(store).parts)


def bytes_run(model, tokens, batch_size: int, sizes: list[int], out: Path) -> float:
    """Seconds of the bare eager forwards with one batch's chunk files written after each
    forward and fsynced beside the next (see the module docstring, ``bare eager + bytes``)."""
    import threading

    import numpy as np
    import torch

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    buf = np.random.default_rng(0).integers(0, 255, max(sizes), dtype=np.uint8)
    pending: threading.Thread | None = None

    def sync(paths: list[Path]) -> None:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

    t0 = time.perf_counter()
    with torch.inference_mode():
        for b, first in enumerate(range(0, len(tokens), batch_size)):
            ids = torch.as_tensor(tokens[first:first + batch_size], dtype=torch.long)
            model(input_ids=ids, output_attentions=True)
            if pending is not None:
                pending.join()
            paths = []
            for i, n in enumerate(sizes):
                p = out / f"b{b}_{i}"
                with open(p, "wb") as f:
                    f.write(buf[:n])
                paths.append(p)
            pending = threading.Thread(target=sync, args=(paths,))
            pending.start()
    if pending is not None:
        pending.join()
    return time.perf_counter() - t0


_CHILD = (
    "import atexit, sys\n"
    "def _hwm():\n"
    "    for ln in open('/proc/self/status'):\n"
    "        if ln.startswith('VmHWM:'): print(ln.strip(), file=sys.stderr)\n"
    "atexit.register(_hwm)\n"
    "sys.argv = ['attnbase'] + sys.argv[1:]\n"
    "from attnbase.cli import main\n"
    "main()\n"
)


def process_run(model: str, seqs: int, args, root: Path, capture: str | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one ``attnbase extract`` process."""
    shutil.rmtree(root, ignore_errors=True)
    # peak RSS from the child's own /proc/self/status VmHWM at exit: ru_maxrss (wait4 or
    # RUSAGE_SELF) keeps the high-water mark of the forked parent (this 3 GB process) across exec
    cmd = [sys.executable, "-c", _CHILD, "extract", "--model", model, "--seqs", str(seqs),
           "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--run", "p",
           "--db", str(root), "--device", "cpu", "-q"]
    if capture:
        cmd += ["--capture", capture]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"attnbase extract failed: {p.stderr[-2000:]}")
    hwm = [ln for ln in p.stderr.splitlines() if ln.startswith("VmHWM:")][-1]
    return wall, int(hwm.split()[1]) * 1024


_BARE_CHILD = (
    "import sys\n"
    "import numpy as np, torch, transformers\n"
    "cls, path, npy, bs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])\n"
    "model = getattr(transformers, cls).from_pretrained(path, attn_implementation='eager').eval()\n"
    "tokens = np.load(npy)\n"
    "with torch.inference_mode():\n"
    "    for first in range(0, len(tokens), bs):\n"
    "        model(input_ids=torch.as_tensor(tokens[first:first + bs], dtype=torch.long),\n"
    "              output_attentions=True)\n"
)


def bare_process_run(cls: str, path: Path, tokens_npy: Path, batch_size: int) -> float:
    """Wall seconds of one plain-HF process: imports, ``from_pretrained``, the eager forwards."""
    cmd = [sys.executable, "-c", _BARE_CHILD, cls, str(path), str(tokens_npy), str(batch_size)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"the bare eager process failed: {p.stderr[-2000:]}")
    return wall


def bench_model(name: str, args, tmp: Path) -> dict:
    import numpy as np
    import torch

    from attnbase import extract as ex
    from attnbase.extract.config import ExtractConfig

    model = model_arg(name, tmp)
    lm = ex.load_model(model, dtype="float32", device="cpu")
    eager = ex.load_model(model, dtype="float32", device="cpu", attn_implementation="eager").model
    sdpa = ex.load_model(model, dtype="float32", device="cpu", attn_implementation="sdpa").model
    for m in (eager, sdpa):
        m.load_state_dict(lm.model.state_dict())
    win = ex.corpus_windows(lm, corpus="default", n_seqs=args.seqs, seq_len=args.seq_len, seed=0)
    default = ExtractConfig(model=model, n_seqs=args.seqs, seq_len=args.seq_len,
                            batch_size=args.batch_size, device="cpu")
    full = ExtractConfig(model=model, n_seqs=args.seqs, seq_len=args.seq_len,
                         batch_size=args.batch_size, device="cpu",
                         capture=("keys", "queries", "logits", "hidden"))
    kl = ExtractConfig(model=model, n_seqs=args.seqs, seq_len=args.seq_len,
                       batch_size=args.batch_size, device="cpu", capture=("keys", "logits"))
    bridge = nns = None
    wanted = {v.strip() for v in args.variants.split(",")} if args.variants else None
    if name == "gpt2-small" and not (args.no_tl and args.no_nnsight):
        import transformers as tf

        hf = tf.GPT2LMHeadModel.from_pretrained(model, attn_implementation="eager").eval()
        if not args.no_tl and (wanted is None or TL in wanted):
            from transformer_lens.model_bridge.sources import build_bridge_from_module

            bridge = build_bridge_from_module(copy.deepcopy(hf), "GPT2LMHeadModel",
                                              hf_config=hf.config)
        if not args.no_nnsight and (wanted is None or NNS in wanted):
            nnsight_check()
            nns = nnsight_model(copy.deepcopy(hf), lm.tokenizer)

    disk: dict[str, tuple[int, int]] = {}
    rss: dict[int, list[int]] = {}

    def store_run(label: str, cfg) -> float:
        wall, nbytes, values = attnbase_run(lm, win, cfg, tmp / label, args.stage_ahead)
        disk[label] = (nbytes, values)
        return wall

    def proc() -> float:
        wall, peak = process_run(model, args.seqs, args, tmp / "proc")
        rss.setdefault(args.seqs, []).append(peak)
        return wall

    variants = {
        "bare eager": lambda: forward(eager, win.tokens, args.batch_size, output_attentions=True),
        "bare sdpa": lambda: forward(sdpa, win.tokens, args.batch_size),
        "attnbase default": lambda: store_run("default", default),
        "attnbase stored logits": lambda: store_run("full", full),
        "attnbase keys+logits": lambda: store_run("kl", kl),
    }
    if bridge is not None:
        variants[TL] = lambda: tl_run(bridge, win.tokens, args.batch_size, tmp / "tl")
    if nns is not None:
        variants[NNS] = lambda: nnsight_run(nns, win.tokens, args.batch_size, tmp / "nnsight")
    if not args.no_process:
        from attnbase.extract.preflight import _model_dir

        tokens_npy = tmp / f"{name}-tokens.npy"
        np.save(tokens_npy, win.tokens)
        model_dir = _model_dir(model)
        variants["attnbase extract process"] = proc
        variants["bare eager process"] = lambda: bare_process_run(
            type(eager).__name__, model_dir, tokens_npy, args.batch_size)
    # warm-up: lazy imports, allocator, codec pools; the first CPU forwards are slower
    small = win.tokens[: 2 * args.batch_size]
    forward(eager, small, args.batch_size, output_attentions=True)
    forward(sdpa, small, args.batch_size)
    warm_win = ex.corpus_windows(lm, corpus="default", n_seqs=args.batch_size,
                                 seq_len=args.seq_len, seed=0)
    attnbase_run(lm, warm_win, ExtractConfig(model=model, n_seqs=args.batch_size,
                                             seq_len=args.seq_len, batch_size=args.batch_size,
                                             device="cpu"), tmp / "warm")
    if bridge is not None:
        tl_run(bridge, small, args.batch_size, tmp / "tl")
    if nns is not None:
        nnsight_run(nns, small, args.batch_size, tmp / "nnsight")
    from attnbase.warehouse import Database

    sizes = chunk_sizes(Database(tmp / "warm").store_path("bench"))
    variants["bare eager + bytes"] = lambda: bytes_run(eager, win.tokens, args.batch_size, sizes,
                                                       tmp / "bytes")
    print(f"  {name}: one batch's chunk files: {len(sizes)}, {sum(sizes) / 2**20:.0f} MiB",
          file=sys.stderr, flush=True)
    if args.variants:
        keep = {v.strip() for v in args.variants.split(",")} | {"bare eager"}
        variants = {k: v for k, v in variants.items() if k in keep}
    times: dict[str, list[float]] = {}
    for r in range(args.repeat):
        for k, f in variants.items():
            # untimed: no variant pays for another's writes. Without it the TransformerLens
            # route's unsynced .npy files (3.5 GB at 150 windows) are written back during the
            # next variants' timers: I/O on this VM takes CPU from the forward (steal and
            # system time; a forward with 150 MB written per 1.3 s beside it ran 1.31 -> 1.54 s)
            os.sync()
            got = f()
            for label, t in (got.items() if isinstance(got, dict) else [(k, got)]):
                times.setdefault(label, []).append(t)
                print(f"  {name} round {r + 1}: {label} {t:.2f} s", file=sys.stderr, flush=True)
    peer_bytes = lambda d: sum(p.stat().st_size for p in (tmp / d).rglob("*"))  # noqa: E731
    tl_bytes = peer_bytes("tl") if bridge is not None and TL in variants else 0
    nns_bytes = peer_bytes("nnsight") if nns is not None and NNS in variants else 0
    out = {"info": lm.info, "times": times, "disk": disk, "tl_disk": tl_bytes,
           "nns_disk": nns_bytes}
    if not args.no_process:
        small_n = max(args.batch_size, args.seqs // 10)
        os.sync()
        # as many small runs as large ones: the peak of one process differs from run to run by
        # ~5 % (what coincides with the first forward), so one run per size compares two draws
        for _ in range(args.repeat):
            os.sync()
            rss.setdefault(small_n, []).append(process_run(model, small_n, args, tmp / "rss")[1])
        out["rss"] = rss
    del bridge, nns, eager, sdpa
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2-small,minilm")
    ap.add_argument("--seqs", type=int, default=150)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="medians over N interleaved rounds")
    ap.add_argument("--no-tl", action="store_true", help="skip the TransformerLens variant")
    ap.add_argument("--no-nnsight", action="store_true", help="skip the nnsight variant")
    ap.add_argument("--tmpdir", default=None,
                    help="where the stores and .npy files go (default: the system temp dir); "
                         "/dev/shm separates the capture's CPU cost from the disk's")
    ap.add_argument("--no-process", action="store_true", help="skip the subprocess variants")
    ap.add_argument("--variants", default="",
                    help="comma-separated subset of the in-process variants (bare eager always "
                         "runs), e.g. 'attnbase default,attnbase stored logits,TransformerLens 4'")
    ap.add_argument("--stage-ahead", action="store_true",
                    help="the attnbase variants use the GPU box's writer loop (the writer pool "
                         "beside the forward), as ATTNBASE_STAGE_AHEAD=1 does")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch/numba threads for every variant (0: their defaults); 1 keeps "
                         "ratios meaningful on a machine shared with other jobs")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="attnbase-bench-", dir=args.tmpdir))
    results = {}
    load0 = os.getloadavg()
    try:
        for name in args.models.split(","):
            results[name] = bench_model(name, args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.seqs} seqs x {args.seq_len} tokens, batch "
          f"{args.batch_size}, medians of {args.repeat} interleaved rounds; load average "
          f"{load0[0]:.1f} at start, {load1[0]:.1f} at end (1-min)\n")
    for name, r in results.items():
        base = statistics.median(r["times"]["bare eager"])
        info = r["info"]
        print(f"### {name} ({info.n_layers} layers x {info.n_heads} heads, d_head {info.d_head})\n")
        print("| variant | median s | runs s | x bare eager (medians) | x bare eager (median of "
              "per-round ratios) |")
        print("|---|---|---|---|---|")
        for k, ts in r["times"].items():
            med = statistics.median(ts)
            per_round = statistics.median(t / b for t, b in zip(ts, r["times"]["bare eager"]))
            print(f"| {k} | {med:.2f} | {', '.join(f'{t:.2f}' for t in ts)} | {med / base:.2f} | "
                  f"**{per_round:.2f}** |")
        if "bare eager process" in r["times"]:
            ts, bs = r["times"]["attnbase extract process"], r["times"]["bare eager process"]
            print(f"\nwhole processes: `attnbase extract` / the bare eager process (imports, load, "
                  f"the same forwards, nothing saved): **{statistics.median(t / b for t, b in zip(ts, bs)):.2f}x** "
                  f"(median of per-round ratios; medians {statistics.median(ts):.2f} s / "
                  f"{statistics.median(bs):.2f} s)")
        names = {"default": "default (derived logits)", "full": "stored logits",
                 "kl": "keys+logits"}
        parts = [f"{names[k]} {n / 2**20:.0f} MiB ({n / v:.2f} B per stored value)"
                 for k, (n, v) in r["disk"].items()]
        if r["tl_disk"]:
            parts.append(f"TransformerLens .npy files {r['tl_disk'] / 2**20:.0f} MiB")
        if r["nns_disk"]:
            parts.append(f"nnsight .npy files {r['nns_disk'] / 2**20:.0f} MiB")
        print("\nbytes on disk: " + "; ".join(parts))
        if "default" in r["disk"]:
            d = r["disk"]["default"][0]
            ratios = [f"stored logits / default {r['disk']['full'][0] / d:.2f}x"] if "full" in r["disk"] else []
            for peer, n in (("TransformerLens", r["tl_disk"]), ("nnsight", r["nns_disk"])):
                if n:
                    ratios.append(f"default / {peer} {d / n:.3f}x ({peer} / default {n / d:.2f}x)")
            if ratios:
                print("\nbytes ratios: " + "; ".join(ratios))
        mib = lambda v: ", ".join(f"{x / 2**20:.0f}" for x in v)  # noqa: E731
        if "rss" in r and len(r["rss"]) == 1:  # --seqs too small for a second size
            [(n0, xs)] = r["rss"].items()
            print(f"\npeak RSS of `attnbase extract` (median of {len(xs)} processes): "
                  f"{statistics.median(xs) / 2**20:.0f} MiB at {n0} windows ({mib(xs)})")
        elif "rss" in r:
            (n0, xs), (n1, ys) = sorted(r["rss"].items())
            a, b = statistics.median(xs), statistics.median(ys)
            print(f"\npeak RSS of `attnbase extract` (median of {len(xs)} / {len(ys)} processes): "
                  f"{a / 2**20:.0f} MiB at {n0} windows ({mib(xs)}), {b / 2**20:.0f} MiB at {n1} "
                  f"windows ({mib(ys)}): {(b / a - 1) * 100:+.1f} %; highest over lowest "
                  f"{(max(ys) / min(xs) - 1) * 100:+.1f} %")
        print()


if __name__ == "__main__":
    main()
