"""Train a small GPT-2-shaped model on the bundled corpus (CPU, seeded) and save checkpoints.

A training trajectory we can run offline, for ``attnbase study entropy`` across consecutive
checkpoints (docs/metrics.md §4; "Attention Rows as Compositional Data" finds the entropy drop of
training is mostly the sink). Each checkpoint is a HF model directory (``save_pretrained``, with
the bundled tokenizer), so ``attnbase extract --model OUT/step-N`` reads it like any local model:

    python examples/train_trajectory.py --out traj --steps 400 --save 0,50,150,400
    for s in 0 50 150 400; do
      attnbase extract --db DB --model traj/step-$s --corpus default --seqs 32 --seq-len 64 --run traj-$s
    done
    attnbase study entropy --db DB --runs traj-0,traj-50      # and 50->150, 150->400

``--bos none`` trains on windows without a BOS (position 0 is a text token, as GPT-2 was trained
and as "All Routes Lead to Collapse" reads it); extract such checkpoints with ``--bos none``
too (docs/paper-conventions.md).

Same windows for every checkpoint: same corpus, seqs, seq-len, seed and tokenizer. Training uses
the windows the extraction does not pick only by chance; the point is the dynamics, not held-out
loss. With network access, hub checkpoints work the same way (docs/studies.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("trajectory"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--save", default="0,50,150,400", help="steps at which to save")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bos", choices=("auto", "none"), default="auto",
                    help="auto: windows start with BOS (the sink); none: position 0 is text")
    args = ap.parse_args(argv)

    from transformers import GPT2Config, GPT2LMHeadModel

    from attnbase.extract.corpus import default_corpus_text
    from attnbase.extract.models import tiny_tokenizer

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # small matrices: one thread beats two contending ones on a busy CPU
    tok = tiny_tokenizer()
    ids = np.asarray(tok(default_corpus_text(), add_special_tokens=False)["input_ids"], np.int64)
    # auto: position 0 is BOS, the sink, as in attnbase's windows; none: text only (GPT-2)
    width = args.seq_len - (1 if args.bos == "auto" else 0)
    n_win = len(ids) // width
    windows = ids[: n_win * width].reshape(n_win, width)
    if args.bos == "auto":
        windows = np.concatenate([np.full((n_win, 1), tok.bos_token_id), windows], axis=1)

    cfg = GPT2Config(vocab_size=len(tok), n_positions=max(128, args.seq_len), n_embd=args.d_model,
                     n_layer=args.layers, n_head=args.heads, bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=max(1, args.steps),
                                                pct_start=0.1)
    save_at = sorted({int(s) for s in args.save.split(",")})
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def save(step: int, loss: float | None) -> None:
        path = args.out / f"step-{step}"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        print(f"step {step:5d}  loss {'-' if loss is None else f'{loss:.3f}'}  "
              f"saved {path}  ({time.perf_counter() - t0:.0f} s)", flush=True)

    loss_v = None
    if 0 in save_at:
        save(0, None)
    model.train()
    for step in range(1, args.steps + 1):
        batch = torch.from_numpy(windows[rng.integers(0, n_win, size=args.batch)])
        out = model(input_ids=batch, labels=batch)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_v = float(out.loss.detach())
        if step in save_at:
            save(step, loss_v)


if __name__ == "__main__":
    main()
