"""Capture time of one model against its bare eager forward, in one process: run it once per
code version (PYTHONPATH=<old checkout>/src, then this one), alternating, for a before/after.

    PYTHONPATH=/tmp/before/src HF_HUB_OFFLINE=1 python benchmarks/capture_ab.py minilm
    HF_HUB_OFFLINE=1 python benchmarks/capture_ab.py minilm

48 windows of 128 tokens, batches of 8, default capture, one torch thread.
"""
import sys, time, os, warnings; warnings.filterwarnings("ignore")
import torch; torch.set_num_threads(1)
from attnbase.extract import load_model, capture_batches, corpus_windows
name = sys.argv[1]
lm = load_model(name, device="cpu")
win = corpus_windows(lm, "default", n_seqs=48, seq_len=128, seed=0)
list(capture_batches(lm, win.tokens[:8], 8, ("keys", "queries", "hidden")))
t = time.perf_counter()
for cb in capture_batches(lm, win.tokens, 8, ("keys", "queries", "hidden"), reuse_buffers=True):
    pass
t1 = time.perf_counter() - t
ids = torch.as_tensor(win.tokens.astype("int64"))
ref = load_model(name, device="cpu", attn_implementation="eager")
t = time.perf_counter()
with torch.inference_mode():
    for i in range(0, 48, 8):
        ref.model(input_ids=ids[i:i+8], output_attentions=True, use_cache=False)
t2 = time.perf_counter() - t
print(f"{name} capture {t1:.2f} s eager {t2:.2f} s ratio {t1/t2:.3f}")
