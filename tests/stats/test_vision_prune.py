"""``study prune`` on an image classifier: top-1 agreement with the unpruned model on held-out
images (never the run's), beside the random-ranking baseline (docs/metrics.md §5)."""

from __future__ import annotations

import numpy as np
import pytest

from attnbase.extract import vision


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    from attnbase import extract_run
    from attnbase.extract import ExtractConfig
    from attnbase.warehouse import Database

    db = Database(tmp_path_factory.mktemp("vdb") / "db")
    extract_run(db, "v", ExtractConfig(model="tiny-vit", corpus=vision.SAMPLE, n_seqs=4,
                                       batch_size=4, device="cpu"), progress=False)
    return db


@pytest.mark.slow
def test_top1_agreement_beside_the_random_baseline(vit_run):
    from attnbase.studies.prune import prune_study
    from attnbase.stats.studies import distances_study

    db = vit_run
    distances_study(db, "v", dissimilarities=("js", "aitchison_perp"), max_rows=32)
    sid, table, metric = prune_study(db, "v", "tiny-vit", fractions=(0.25, 0.5),
                                     rankings=("js", "aitchison_perp"), eval_seqs=8,
                                     random_seeds=5, device="cpu")
    assert metric == "top-1 agreement"
    with db.connect(read_only=True) as con:
        res = dict(con.execute("SELECT key, value FROM study_results WHERE study_id = ?",
                               [sid]).fetchall())
    assert res["top1/none"] == 1.0  # the unpruned model agrees with itself
    for f in ("0.25", "0.5"):
        for name in ("js", "aitchison_perp", "random"):
            assert 0.0 <= res[f"top1/{name}/{f}"] <= 1.0
        assert res[f"top1_sd/random/{f}"] >= 0.0  # sd over the 5 seeded rankings
    assert len(table["rows"]["random"]) == 2 and "+-" in table["rows"]["random"][0]


def test_held_out_images_never_ranked_the_heads(vit_run, tmp_path):
    from attnbase.studies.prune import held_out_images, run_sources
    from attnbase.extract import load_model

    db = vit_run
    lm = load_model("tiny-vit", device="cpu")
    used = run_sources(db, "v")
    assert len(used) == 4
    px, held = held_out_images(db, "v", lm, 12)
    assert len(held) == 12 and not set(held) & set(used)
    assert px.shape == (12, 3, 64, 64)
    # negative control: the same draw without excluding the run's windows meets them (the
    # held-out stream is seeded, so the exclusion is what keeps them apart)
    from PIL import Image

    d = tmp_path / "imgs"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(d / f"{i}.png")
    from attnbase.extract import corpus_windows

    win = corpus_windows(lm, str(d), n_seqs=3, seq_len=None, seed=0)
    _, rest = vision.held_out(lm, str(d), list(win.sources), 2)
    assert [s.file for s in rest] == ["3.png", "4.png"]
    _, all_ = vision.held_out(lm, str(d), [], 2)
    assert [s.file for s in all_] == ["0.png", "1.png"]  # without exclusion: the run's own


def test_masking_every_head_changes_predictions(vit_run):
    """The score can move (a constant classifier would make the study vacuous)."""
    from attnbase.studies.prune import held_out_images
    from attnbase.extract import load_model
    from attnbase.extract.surgery import head_mask, predictions

    lm = load_model("tiny-vit", device="cpu", attn_implementation="sdpa")
    px, _ = held_out_images(vit_run, "v", lm, 16)
    ref = predictions(lm, px)
    with head_mask(lm, [(l, h) for l in range(3) for h in range(4)]):
        masked = predictions(lm, px)
    assert len(set(ref.tolist())) > 1
    assert (masked != ref).any()
