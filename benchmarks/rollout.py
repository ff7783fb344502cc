"""Attention rollout on request (docs/metrics.md §6c): what one window costs the service, to
decide between computing it when a page asks and storing it at analysis time.

Two runs on ``images:sample``: the tiny seeded DINOv2 with registers (3 layers x 4 heads, 21
tokens) and a seeded random ViT-B/16 saved to a directory (12 layers x 12 heads, 197 tokens,
224 x 224 pixels; the shape of the ViTs of Darcet et al. and Abnar & Zuidema). Untimed: the
model directory and both extractions (default capture: queries and keys stored, logits formed
on read). Timed, ``--repeat`` rounds over the windows, medians, through the service's catalog:
the rollout itself, unmemoised (read one window's logits of every layer, softmax, the
product), then the PNG overlay (the rollout memoised by then), then ``rollout_data`` of the
same window again (memoised per window and store version).

Run::

    HF_HUB_OFFLINE=1 python benchmarks/rollout.py --repeat 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def vit_base_dir(root: Path) -> Path:
    """A seeded random ViT-B/16 classifier and its processor, saved under ``root``."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12,
                    num_attention_heads=12, intermediate_size=3072, num_labels=10)
    path = root / "vit-base-random"
    ViTForImageClassification(cfg).save_pretrained(path)
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--seqs", type=int, default=4)
    args = ap.parse_args()

    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.serve.catalog import Catalog
    from attnbase.serve.settings import Settings
    from attnbase.serve.vision import _cls_rollout, first_patch, rollout_data, rollout_image
    from attnbase.warehouse import Database

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        db = Database(tmp / "db")
        models = {"tiny-dinov2-reg": "tiny-dinov2-reg", "vit-b16-random": str(vit_base_dir(tmp))}
        for run, model in models.items():
            extract_run(db, run, ExtractConfig(model=model, corpus="images:sample",
                                               n_seqs=args.seqs, batch_size=args.seqs,
                                               device="cpu"), progress=False)
        cat = Catalog(Settings(db=db.path))
        print(f"load average before timing: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        for run in models:
            info = db.run_info(run)
            times, drawn, again = [], [], []
            for i in range(args.repeat):
                seq = i % args.seqs
                with cat.session():
                    t0 = time.perf_counter()
                    _cls_rollout(cat, run, seq, first_patch(cat.run_row(run)))  # no memo
                    times.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    rollout_image(cat, cat.run_row(run), seq)  # the rollout memoised by now
                    drawn.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    rollout_data(cat, run, seq)
                    again.append(time.perf_counter() - t0)
            ms = lambda v: f"{statistics.median(v) * 1e3:.1f} ms"  # noqa: E731
            print(f"{run}: {info['n_layers']} layers x {info['n_heads']} heads, "
                  f"{info['seq_len']} tokens: [CLS] rollout of one window {ms(times)}; "
                  f"PNG overlay drawn {ms(drawn)}; the same window again {ms(again)} "
                  f"(medians of {args.repeat})")


if __name__ == "__main__":
    main()
