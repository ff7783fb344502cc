"""The induction score (docs/metrics.md §3b) finds a real induction head: SmolLM2-135M on
``probe:repeat-random`` (random ids, the first half repeated). Negative controls: the same head
of the same architecture with seeded random weights (``--init random``) on the same windows, and
the trained model's median head."""

from __future__ import annotations

import numpy as np
import pytest

MODEL = "smollm2-135m"


def _induction_scores(db_dir, run: str, init: str) -> tuple[np.ndarray, np.ndarray]:
    """``(layer, head)`` induction scores of ``MODEL`` (``init``) on 8 windows of 64 tokens of
    probe:repeat-random, from the run's (derived) logits and tokens; and the tokens."""
    from attnbase import extract_run
    from attnbase.extract.config import ExtractConfig
    from attnbase.logits import softmax
    from attnbase.stats.taxonomy import induction
    from attnbase.warehouse import Database

    cfg = ExtractConfig(model=MODEL, corpus="probe:repeat-random", n_seqs=8, seq_len=64,
                        batch_size=8, device="cpu", capture=("keys", "queries"), init=init)
    extract_run(db_dir, run, cfg, progress=False)
    db = Database(db_dir)
    tokens = db.run(run).store().read("tokens")
    scores = [induction(softmax(logits), tokens) for _, logits in
              db.read_layers(run, "attn_logits")]
    return np.stack(scores), tokens


@pytest.mark.slow  # two extractions of a 135M model on CPU (~1-2 min)
def test_a_pretrained_lm_has_an_induction_head_that_the_score_finds(tmp_path):
    trained, tokens = _induction_scores(tmp_path / "db", "trained", "pretrained")
    untrained, same = _induction_scores(tmp_path / "db", "untrained", "random")
    assert np.array_equal(tokens, same)  # the same windows: the probe is seeded
    content = tokens[:, 1:]  # BOS, then r and r again (cut to the window)
    width = content.shape[1]
    half = (width + 1) // 2
    assert np.array_equal(content[:, half:], content[:, :width - half])

    layer, head = np.unravel_index(np.argmax(trained), trained.shape)
    top = float(trained[layer, head])
    median = float(np.median(trained))
    print(f"\n{MODEL} induction on probe:repeat-random, 8 x 64: top L{layer}H{head} "
          f"{top:.3f}; top 5 " + ", ".join(
              f"L{l}H{h} {trained[l, h]:.3f}" for l, h in zip(*np.unravel_index(
                  np.argsort(trained, axis=None)[::-1][:5], trained.shape)))
          + f"; median head {median:.3f}; the same head at random init "
          f"{untrained[layer, head]:.3f} (max over heads {untrained.max():.3f})")
    assert top > 0.3
    assert median < 0.1 and top > 5 * median  # most heads are no induction heads
    # the trained weights make it: the same head of the random-init model does not attend there
    assert untrained[layer, head] < 0.1 and untrained.max() < 0.3
