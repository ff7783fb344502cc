"""A tiny GPT-2 trained on ``probe:repeat-random`` windows grows a head the induction score
(docs/metrics.md §3b) finds, read from ``head_metrics`` after ``extract`` and ``analyze``.

The model (2 layers, 4 heads, d_model 64, a byte-level tokenizer of 258 ids, seeded) trains with
AdamW on exactly the probe's windows: BOS, then ``r r`` with ``r`` 32 distinct random ids cut to
63 tokens, so the token after the query's first occurrence always sits 31 positions back. A
head that attends 31 positions back copies the next token without reading the tokens at all;
that head scores as induction on the probe's own width and not on another width (another
period). The test measures both: the score finds the head the training made, and the
other-period control shows what kind of head it is.

Controls: the untrained checkpoint (step 0) on the same windows; the loss on the first half
(fresh random tokens, nothing to copy) stays at chance while the second half's falls.
"""

from __future__ import annotations

import numpy as np
import pytest

STEPS = 300
SEQ_LEN = 64  # BOS + 63 content tokens, as the extraction's probe windows
OTHER_SEQ_LEN = 48  # BOS + 47: period 24 instead of 32


def _tokenizer():
    """A byte-level BPE tokenizer with no merges (256 byte ids + BOS/EOS), built like the
    bundled one (:mod:`attnbase.extract.make_tokenizer`): a small vocabulary trains fast."""
    from transformers import PreTrainedTokenizerFast

    from attnbase.extract.make_tokenizer import BOS, EOS, train

    return PreTrainedTokenizerFast(tokenizer_object=train(258)._tokenizer, bos_token=BOS,
                                  eos_token=EOS)


def _windows(tok, n: int, rng: np.random.Generator) -> "torch.Tensor":
    """``n`` probe:repeat-random windows of ``SEQ_LEN`` tokens (BOS, then the probe content)."""
    import torch

    from attnbase.extract.probes import content_ids, probe_content

    content = probe_content("repeat-random", content_ids(tok), n, SEQ_LEN - 1, rng)
    bos = np.full((n, 1), tok.bos_token_id, dtype=np.int64)
    return torch.from_numpy(np.concatenate([bos, content], axis=1))


def _half_losses(model, batch) -> tuple[float, float]:
    """Mean next-token loss of the first half's targets (fresh random tokens) and the second
    half's (each the repeat of a token 32 positions earlier)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=batch).logits[:, :-1]
    nll = -torch.log_softmax(logits, -1).gather(-1, batch[:, 1:, None])[..., 0]
    half = (SEQ_LEN - 1 + 1) // 2  # targets 1..32 are the first r, 33..63 repeat it
    return float(nll[:, :half].mean()), float(nll[:, half + 1:].mean())


def _train(out, steps: int) -> dict:
    """Save the untrained (``out/step-0``) and trained (``out/step-N``) checkpoints; return the
    held-out half losses of both and the training time."""
    import time

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tok = _tokenizer()
    cfg = GPT2Config(vocab_size=len(tok), n_positions=SEQ_LEN, n_embd=64, n_layer=2, n_head=4,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(1)  # not the extraction's seed: held-out windows
    held_out = _windows(tok, 16, rng)
    model.eval()
    before = _half_losses(model, held_out)
    model.save_pretrained(out / "step-0")
    tok.save_pretrained(out / "step-0")
    model.train()
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = _windows(tok, 32, rng)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - t0
    model.eval()
    after = _half_losses(model, held_out)
    model.save_pretrained(out / f"step-{steps}")
    tok.save_pretrained(out / f"step-{steps}")
    return {"before": before, "after": after, "seconds": seconds}


def _head_scores(db, run: str, model_dir, seq_len: int) -> dict[str, np.ndarray]:
    """Extract ``model_dir`` on 8 probe:repeat-random windows of ``seq_len``, analyze the run and
    read the ``(layer, head)`` taxonomy scores from ``head_metrics``."""
    from attnbase import extract_run
    from attnbase.extract.config import ExtractConfig
    from attnbase.metrics import N
    from attnbase.stats.analyze import analyze_run

    cfg = ExtractConfig(model=str(model_dir), corpus="probe:repeat-random", n_seqs=8,
                        seq_len=seq_len, batch_size=8, device="cpu", capture=("keys", "queries"))
    extract_run(db.path, run, cfg, progress=False)
    analyze_run(db, run, draws=5, gauss_draws=20, seed=1, n_boot=50)
    out = {}
    with db.connect(read_only=True) as con:
        for name in (N.induction, N.prev_token):
            rows = con.execute("SELECT layer, head, value FROM head_metrics WHERE run_id = ? "
                               "AND metric = ? ORDER BY layer, head", [run, name]).fetchall()
            n_layers, n_heads = rows[-1][0] + 1, rows[-1][1] + 1
            out[name] = np.array([v for _, _, v in rows]).reshape(n_layers, n_heads)
    return out


def _top(scores: np.ndarray, k: int = 3) -> str:
    flat = np.argsort(scores, axis=None)[::-1][:k]
    return ", ".join(f"L{l}H{h} {scores[l, h]:.3f}"
                     for l, h in zip(*np.unravel_index(flat, scores.shape)))


@pytest.mark.slow  # trains 300 steps, extracts and analyzes three runs on CPU (~30-50 s)
def test_a_tiny_model_trained_on_repeat_random_grows_a_head_the_induction_score_finds(db,
                                                                                      tmp_path):
    fit = _train(tmp_path / "ckpt", STEPS)
    untrained = _head_scores(db, "step-0", tmp_path / "ckpt" / "step-0", SEQ_LEN)
    trained = _head_scores(db, "trained", tmp_path / "ckpt" / f"step-{STEPS}", SEQ_LEN)
    other = _head_scores(db, "trained-p24", tmp_path / "ckpt" / f"step-{STEPS}", OTHER_SEQ_LEN)
    ind0, ind, ind_other = untrained["induction"], trained["induction"], other["induction"]
    layer, head = np.unravel_index(np.argmax(ind), ind.shape)
    print(f"\n{STEPS} steps in {fit['seconds']:.1f} s; held-out loss first/second half "
          f"{fit['before'][0]:.2f}/{fit['before'][1]:.2f} -> "
          f"{fit['after'][0]:.2f}/{fit['after'][1]:.2f}\n"
          f"induction, probe:repeat-random {SEQ_LEN}: step 0 top {_top(ind0)}; "
          f"step {STEPS} top {_top(ind)}\n"
          f"step {STEPS} on seq-len {OTHER_SEQ_LEN} (period 24): top {_top(ind_other)}; "
          f"L{layer}H{head} {ind_other[layer, head]:.3f}\n"
          f"prev_token step {STEPS}: top {_top(trained['prev_token'])}")

    # the score finds the head the training made; at step 0 no head attends there
    assert ind.max() > 0.5
    assert ind0.max() < 0.1
    # in layer 0, where a key holds only its own token and position: a key's score there cannot
    # come from the token before it, so the head matches by position
    assert layer == 0 and ind[1].max() < 0.1
    # it learned to copy: the second half's loss falls, the first half's stays at chance
    chance = np.log(256)
    assert fit["after"][1] < 1.0 < fit["before"][1]
    assert abs(fit["after"][0] - chance) < 0.3 and abs(fit["before"][0] - chance) < 0.3
    # the head attends a fixed offset back: on another period it no longer finds the token
    assert ind_other[layer, head] < 0.3 * ind[layer, head]
