"""Induction score against training step of a tiny GPT-2 (CPU, seeded), for benchmarks/RESULTS.md.

Trains the model of ``tests/stats/test_induction_trained.py`` (2 layers, 4 heads, a byte-level
tokenizer of 258 ids) and prints, every ``--every`` steps, the held-out loss of the first and
second half and each layer's best induction score (``attnbase.stats.taxonomy.induction`` on the
eager attention) on probe:repeat-random windows of 64 tokens (period 32) and of 48 (period 24):

    python benchmarks/induction_trajectory.py --train probe --steps 300
    python benchmarks/induction_trajectory.py --train shifted --steps 1500 --lr 1e-2

``--train probe``: the probe's own windows (BOS, ``r r`` cut to 63 tokens). ``--train shifted``:
BOS, a random-length run of random ids, then ``r r`` with ``r`` of 8 to 31 ids, so the repeat
sits at no fixed distance and only a head that reads the tokens can find it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def tokenizer():
    from transformers import PreTrainedTokenizerFast

    from attnbase.extract.make_tokenizer import BOS, EOS, train

    return PreTrainedTokenizerFast(tokenizer_object=train(258)._tokenizer, bos_token=BOS,
                                  eos_token=EOS)


def windows(ids, n: int, width: int, shifted: bool, rng) -> torch.Tensor:
    """``n`` windows: BOS (id 0) then ``width`` content ids."""
    from attnbase.extract.probes import probe_content

    if shifted:
        rows = []
        for _ in range(n):
            period = int(rng.integers(8, width // 2 + 1))
            lead = probe_content("random", ids, 1, width - 2 * period, rng)
            rows.append(np.concatenate(
                [lead, probe_content("repeat-random", ids, 1, 2 * period, rng)], axis=1))
        content = np.concatenate(rows)
    else:
        content = probe_content("repeat-random", ids, n, width, rng)
    return torch.from_numpy(np.concatenate([np.zeros((n, 1), np.int64), content], axis=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", choices=("probe", "shifted"), default="probe")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args(argv)

    from transformers import GPT2Config, GPT2LMHeadModel

    from attnbase.extract.probes import content_ids
    from attnbase.stats.taxonomy import induction

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tok = tokenizer()
    ids = content_ids(tok)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=args.d_model, n_layer=2,
                     n_head=4, bos_token_id=0, eos_token_id=1, attn_pdrop=0.0,
                     resid_pdrop=0.0, embd_pdrop=0.0)
    cfg._attn_implementation = "eager"  # the attention probabilities come back
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng = np.random.default_rng(1)
    held = {64: windows(ids, 16, 63, False, rng), 48: windows(ids, 16, 47, False, rng)}

    def report(step: int, seconds: float) -> None:
        model.eval()
        parts = []
        with torch.no_grad():
            for n, batch in held.items():
                out = model(input_ids=batch, output_attentions=True)
                scores = np.stack([induction(a.numpy().transpose(1, 0, 2, 3), batch.numpy())
                                   for a in out.attentions])
                parts.append(f"ind@{n} L0 {scores[0].max():.3f} L1 {scores[1].max():.3f}")
                if n == 64:
                    nll = -torch.log_softmax(out.logits[:, :-1], -1).gather(
                        -1, batch[:, 1:, None])[..., 0]
                    parts.insert(0, f"loss {float(nll[:, :32].mean()):.2f}/"
                                    f"{float(nll[:, 33:].mean()):.2f}")
        model.train()
        print(f"step {step:5d} {seconds:6.1f} s  " + "  ".join(parts), flush=True)

    t0 = time.perf_counter()
    report(0, 0.0)
    for step in range(1, args.steps + 1):
        batch = windows(ids, args.batch, 63, args.train == "shifted", rng)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.every == 0 or step == args.steps:
            report(step, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
