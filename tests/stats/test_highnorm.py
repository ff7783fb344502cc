"""High-norm patch tokens and [CLS] attention on them (docs/metrics.md §6c; Darcet et al. 2024):
planted high-norm tokens found exactly, the threshold scale-free, the Gaussian negative control
at zero, the [CLS] mass against its uniform expectation, and the rows an analysis writes for an
image run (none for a text run)."""

from __future__ import annotations

import numpy as np
import pytest

from attnbase.metrics import HIGH_NORM_RATIO, N
from attnbase.stats import highnorm
from attnbase.stats.highnorm import (HIGH_NORM_LAYER_METRICS, high_norm_mask, high_norm_share,
                                     high_norm_stats, patch_norms)

FIRST = 5  # [CLS] and four registers, then 16 patches


def _block(n_seq=6, n_patch=16, d=64, seed=0):
    x = np.random.default_rng(seed).standard_normal((n_seq, FIRST + n_patch, d))
    x[:, :FIRST] *= 40.0  # [CLS] and registers far above the patches: never counted
    return x


PLANTED = [(0, FIRST + 3), (2, FIRST + 0), (2, FIRST + 15), (5, FIRST + 7)]


def _planted(scale=10.0):
    x = _block()
    for s, p in PLANTED:
        x[s, p] *= scale
    return x


def test_planted_high_norm_patches_are_found_exactly():
    x = _planted()
    mask, rel = high_norm_mask(patch_norms(x, FIRST))
    want = np.zeros_like(mask)
    for s, p in PLANTED:
        want[s, p - FIRST] = True
    assert (mask == want).all()
    m = high_norm_stats(x, FIRST)
    assert m[N.high_norm_frac] == len(PLANTED) / (6 * 16)
    assert m[N.high_norm_max_ratio] == pytest.approx(rel.max()) and rel.max() > 8.0
    # a planted token just below the threshold is not one
    y = _block()
    y[1, FIRST + 2] *= 0.99 * HIGH_NORM_RATIO * np.median(patch_norms(y, FIRST)[1]) / \
        np.linalg.norm(y[1, FIRST + 2])
    assert high_norm_stats(y, FIRST)[N.high_norm_frac] == 0.0


@pytest.mark.parametrize("c", [1e-3, 0.5, 7.0, 1e4])
def test_the_threshold_is_scale_free(c):
    x = _planted(scale=3.2)  # close to r = 3 on purpose: scaling must not move any token across
    cls = np.random.default_rng(1).dirichlet(np.ones(21), size=(4, 6))
    a = high_norm_stats(x, FIRST, lambda s0, s1: cls[:, s0:s1])
    b = high_norm_stats(c * x, FIRST, lambda s0, s1: cls[:, s0:s1])
    assert a[N.high_norm_frac] == b[N.high_norm_frac]
    assert a[N.high_norm_cls_attn] == pytest.approx(b[N.high_norm_cls_attn], rel=1e-12)
    assert a[N.high_norm_max_ratio] == pytest.approx(b[N.high_norm_max_ratio], rel=1e-12)


def test_gaussian_patches_have_no_high_norm_token():
    """Negative control: i.i.d. N(0, 1) patches of d = 64; a norm is about 8 +- 0.7, so the
    largest of 8,192 is about 1.4 x the median, far below r = 3."""
    x = np.random.default_rng(2).standard_normal((32, 1 + 256, 64))
    m = high_norm_stats(x, 1)
    assert m[N.high_norm_frac] == 0.0
    assert 1.1 < m[N.high_norm_max_ratio] < 1.6
    assert (high_norm_share(x) == 0.0).all()


def test_cls_attention_on_high_norm_patches_against_uniform():
    x = _planted()
    H, T = 3, x.shape[1]
    p = np.full((H, 6, T), 1.0 / T)  # uniform [CLS] rows: the mass is the uniform expectation
    m = high_norm_stats(x, FIRST, lambda s0, s1: p[:, s0:s1])
    uniform = np.mean([sum(s == i for s, _ in PLANTED) for i in range(6)]) / T
    assert m[N.high_norm_cls_uniform] == pytest.approx(uniform, rel=1e-12)
    assert m[N.high_norm_cls_attn] == pytest.approx(uniform, rel=1e-12)
    # every head of every image puts half its [CLS] mass on that image's high-norm patches
    q = np.zeros((H, 6, T))
    q[..., 0] = 1.0
    for s in range(6):
        hits = [pos for i, pos in PLANTED if i == s]
        if hits:
            q[:, s, 0] = 0.5
            q[:, s, hits] = 0.5 / len(hits)
    m = high_norm_stats(x, FIRST, lambda s0, s1: q[:, s0:s1])
    assert m[N.high_norm_cls_attn] == pytest.approx(0.5 * 3 / 6, rel=1e-12)  # 3 of 6 images
    # a head attending to a register instead: no mass on high-norm patches
    r = np.zeros((H, 6, T))
    r[..., 1] = 1.0
    assert high_norm_stats(x, FIRST, lambda s0, s1: r[:, s0:s1])[N.high_norm_cls_attn] == 0.0


@pytest.mark.parametrize("chunk", [1, 4])
def test_chunking_and_unwritten_images_change_nothing(monkeypatch, chunk):
    x = _planted()
    p = np.random.default_rng(3).dirichlet(np.ones(21), size=(2, 6))
    want = high_norm_stats(x, FIRST, lambda s0, s1: p[:, s0:s1])
    monkeypatch.setattr(highnorm, "SEQ_CHUNK", chunk)
    assert high_norm_stats(x, FIRST, lambda s0, s1: p[:, s0:s1]) == pytest.approx(want)
    y = np.concatenate([x, np.full((3,) + x.shape[1:], np.nan)])  # images not written yet
    q = np.concatenate([p, np.full((2, 3, 21), np.nan)], axis=1)
    assert high_norm_stats(y, FIRST, lambda s0, s1: q[:, s0:s1]) == pytest.approx(want)
    assert set(want) == set(HIGH_NORM_LAYER_METRICS)
    assert set(high_norm_stats(x, FIRST)) == {N.high_norm_frac, N.high_norm_max_ratio}


def test_bad_first_patch_is_one_clear_error():
    with pytest.raises(ValueError, match="first_patch must be in 1..20"):
        high_norm_stats(_block(), 0)


@pytest.mark.slow  # two extractions and analyses: ~20 s
def test_analysis_writes_high_norm_rows_of_an_image_run_only(tmp_path):
    """A tiny ViT: one row per hidden state of the two norm metrics, one per attention layer of
    the two [CLS] metrics, equal to the function on open_run's arrays; a text run: none."""
    from attnbase.extract import ExtractConfig
    from attnbase.logits import softmax
    from attnbase.runner import extract_run
    from attnbase.stats.analyze import analyze_run
    from attnbase.warehouse import Database, open_run, read_sql

    db = Database(tmp_path / "db")
    extract_run(db, "v", ExtractConfig(model="tiny-vit", corpus="images:sample", n_seqs=3,
                                       batch_size=3, device="cpu"), progress=False)
    extract_run(db, "t", ExtractConfig(model="tiny-gpt2", corpus="default", n_seqs=2,
                                       seq_len=8, batch_size=2, device="cpu"), progress=False)
    for run in ("v", "t"):
        analyze_run(db, run, draws=5, gauss_draws=5, seed=0, n_boot=50)
    rows = read_sql(db.path, "SELECT run_id, layer, metric, value FROM layer_metrics WHERE "
                             "starts_with(metric, 'high_norm_') ORDER BY layer, metric")
    assert set(rows["run_id"]) == {"v"}  # the text run has no rows
    ds = open_run(db.path, "v")
    L = ds.sizes["layer"]
    assert rows.height == (L + 1) * 2 + L * 2
    for layer in range(L + 1):
        cls = None
        if layer < L:
            p = softmax(ds["attn_logits"].values[layer][:, :, 0])  # (head, seq, key)
            cls = lambda s0, s1, p=p: p[:, s0:s1]  # noqa: E731
        want = high_norm_stats(ds["hidden"].values[layer], 1, cls)
        got = {m: v for _, lay, m, v in rows.iter_rows() if lay == layer}
        assert got == pytest.approx(want, rel=1e-9)
