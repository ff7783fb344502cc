"""Sink sets (docs/metrics.md "Sink sets"): every sink statistic reads a family's declared set S
([CLS]; [CLS] + distillation; [CLS] + registers) as the sink, and S = {0} is the old key 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnbase.contract import content_keys, sink_keys, sink_set
from attnbase.extract.rowstats import row_col_stats, row_col_stats_set
from attnbase.stats import compositional as comp
from attnbase.stats import concentration, norms
from attnbase.stats.head_distances import (DISSIMILARITIES, HeadDistanceAccumulator,
                                           row_dissimilarity)

#: a DINOv2-like row: [CLS], two registers, then three patches
P = np.array([0.30, 0.10, 0.10, 0.20, 0.20, 0.10])
S = (0, 1, 2)


def test_closed_form_row_with_cls_and_registers():
    z = np.log(P)
    # sink mass: 0.3 + 0.1 + 0.1
    assert comp.sink_mass_from_logits(z, S) == pytest.approx(0.5, abs=1e-15)
    assert concentration.sink_mass(P[None], S)[0] == pytest.approx(0.5, abs=1e-15)
    # balance of the groups: sqrt(3 * 3 / 6) * (mean ln(.3,.1,.1) - mean ln(.2,.2,.1))
    b = math.sqrt(1.5) * ((math.log(.3) + 2 * math.log(.1)) / 3
                          - (2 * math.log(.2) + math.log(.1)) / 3)
    assert comp.sink_balance(z, S) == pytest.approx(b, rel=1e-13)
    # content composition pi = (.4, .4, .2)
    h_pi = -(2 * .4 * math.log(.4) + .2 * math.log(.2))
    assert comp.content_entropy(z, S) == pytest.approx(h_pi, rel=1e-13)
    clr = np.log([.4, .4, .2]) - np.log([.4, .4, .2]).mean()
    assert comp.content_dispersion(z, S) == pytest.approx(np.linalg.norm(clr), rel=1e-13)
    # the capture's path gives the same row
    r, recv = row_col_stats_set(torch.tensor(z)[None], S)
    assert float(r["sink_mass"][0]) == pytest.approx(0.5, abs=1e-15)
    assert float(r["sink_balance"][0]) == pytest.approx(b, rel=1e-13)
    assert float(r["content_entropy"][0]) == pytest.approx(h_pi, rel=1e-13)
    assert float(r["content_dispersion"][0]) == pytest.approx(np.linalg.norm(clr), rel=1e-13)
    assert float(r["entropy"][0]) == pytest.approx(-(P * np.log(P)).sum(), rel=1e-13)
    assert recv.numpy() == pytest.approx(P, abs=1e-15)
    # negative control: key 0 alone is a different (smaller) sink
    assert comp.sink_mass_from_logits(z) == pytest.approx(0.3)
    assert comp.sink_balance(z) != pytest.approx(b, rel=1e-3)


def test_group_balance_is_an_exact_orthogonal_part():
    """||clr p||^2 = b^2 + ||clr p_S||^2 + ||clr p_C||^2: the weight sqrt(|S||C|/(|S|+|C|)) is
    the one that makes the balance an isometric coordinate (a wrong weight fails this)."""
    rng = np.random.default_rng(0)
    for sink in [(0,), (0, 1), (0, 1, 2, 3, 4), (0, 3)]:
        z = rng.normal(size=(20, 9)) * 2
        clr = z - z.mean(-1, keepdims=True)
        si, ci = sink_keys(sink, 9), content_keys(sink, 9)
        within = [z[:, ix] - z[:, ix].mean(-1, keepdims=True) for ix in (si, ci)]
        total = (clr ** 2).sum(-1)
        parts = comp.sink_balance(z, sink) ** 2 + sum((w ** 2).sum(-1) for w in within)
        np.testing.assert_allclose(parts, total, rtol=1e-12)


def test_default_sink_is_the_one_position_case():
    rng = np.random.default_rng(1)
    z = torch.tensor(rng.normal(size=(3, 7, 7)) * 3)
    z[..., 1, 2:] = -math.inf  # a causal-looking row
    a, ra = row_col_stats(z)
    b, rb = row_col_stats_set(z, (0,))
    for k in a:
        np.testing.assert_allclose(b[k].numpy(), a[k].numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rb.numpy(), ra.numpy(), rtol=1e-12)
    assert sink_set(None) == (0,) and content_keys(None, 7) == slice(1, None)


def test_drop_sink_removes_the_whole_set():
    rng = np.random.default_rng(2)
    za, zb = rng.normal(size=(2, 10, 21))  # 10 rows of a DINOv2-sized window (21 keys)
    reg = (0, 1, 2, 3, 4)
    for name in DISSIMILARITIES:
        d = row_dissimilarity(name, za, zb, "drop_sink", sink=reg)
        # the same rows with only the content keys: a set dropped is a set never there
        ref = row_dissimilarity(name, za[..., 5:], zb[..., 5:], "with_sink", sink=reg)
        if name in ("aitchison", "aitchison_perp"):  # d_A of the 16 content keys
            ref = comp.aitchison_distance(za[..., 5:], zb[..., 5:])
        np.testing.assert_allclose(d, ref, rtol=1e-12, err_msg=name)
        # no sink logit moves it: shift one register of one side
        zb2 = zb.copy()
        zb2[:, 3] += 4.0
        np.testing.assert_allclose(row_dissimilarity(name, za, zb2, "drop_sink", sink=reg), d,
                                   rtol=1e-12, err_msg=name)
        # negative control: with key 0 alone the register is content, and the distance moves
        moved = row_dissimilarity(name, za, zb2, "drop_sink")
        assert not np.allclose(moved, row_dissimilarity(name, za, zb, "drop_sink")), name


def test_accumulator_drops_the_set_like_the_reference():
    rng = np.random.default_rng(3)
    n_heads, rows, keys = 4, 6, 9
    z = rng.normal(size=(n_heads, rows, keys)) * 1.5
    sink = (0, 1)
    acc = HeadDistanceAccumulator(n_heads, sink=sink)
    acc.add(z)
    acc.end_unit()
    got = acc.result()
    for (name, conv), m in got.items():
        ref = np.zeros((n_heads, n_heads))
        for a in range(n_heads):
            for b in range(n_heads):
                if a != b:
                    ref[a, b] = row_dissimilarity(name, z[a], z[b], conv, sink=sink).mean()
        tol = 1e-6 if name == "js" else 1e-10  # JS mixes in float32 (test_head_distances)
        np.testing.assert_allclose(m, ref, atol=tol, err_msg=f"{name} {conv}")
    # negative control: the default sink gives other drop_sink matrices
    acc0 = HeadDistanceAccumulator(n_heads)
    acc0.add(z)
    assert not np.allclose(acc0.result()[("js", "drop_sink")], got[("js", "drop_sink")])


def test_key_norm_cv_excl_sink_leaves_the_set_out():
    k = np.array([[[9.0, 0.0], [0.0, 7.0], [0.0, 1.0], [-1.0, 0.0], [0.0, 1.0]]])
    assert float(norms.key_norm_cv_excl_sink(k, sink=(0, 1))) == 0.0
    assert float(norms.key_norm_cv_excl_sink(k)) > 0.5  # key 1 (a register) still in


def test_sink_set_is_validated():
    assert sink_set([4, 0, 1, 1]) == (0, 1, 4)
    with pytest.raises(ValueError, match="sink positions"):
        sink_set([-1, 0])


def test_capture_computes_row_statistics_over_the_declared_set():
    """A model whose info declares S = {0, 1}: the captured row statistics are the set's, from
    the very logits the softmax saw (and differ from key 0's: a negative control)."""
    from dataclasses import replace

    from attnbase.extract import capture_batches, corpus_windows, load_model

    lm = load_model("tiny-gpt2", dtype="float32", device="cpu")
    lm2 = replace(lm, info=replace(lm.info, sink_positions=(0, 1)))
    win = corpus_windows(lm, "default", n_seqs=2, seq_len=12, seed=0)
    (cb,) = list(capture_batches(lm2, win.tokens, 2, ("logits",)))
    (cb0,) = list(capture_batches(lm, win.tokens, 2, ("logits",)))
    z = torch.as_tensor(cb.arrays["attn_logits"])  # (layer, head, seq, query, key)
    ref, _ = row_col_stats_set(z, (0, 1))
    for k in ("sink_mass", "sink_balance", "content_entropy", "content_dispersion"):
        np.testing.assert_allclose(cb.row_stats[k], ref[k].reshape(-1).numpy(), rtol=1e-6,
                                   atol=1e-7, err_msg=k)
    assert (cb.row_stats["sink_mass"] >= cb0.row_stats["sink_mass"] - 1e-9).all()
    assert not np.allclose(cb.row_stats["sink_mass"], cb0.row_stats["sink_mass"])


def test_entropy_split_stays_exact_with_a_sink_set(tmp_path):
    """H(p) = H_b(s) + s H(sigma) + (1 - s) H(pi): the spread inside [CLS] + [DIST] joins the
    sink part, so sink part + content part is the stored entropy change (DeiT, layers 0 -> 2)."""
    from attnbase import extract_run
    from attnbase.extract import ExtractConfig
    from attnbase.stats.entropy_study import entropy_study
    from attnbase.warehouse import Database

    db = Database(tmp_path / "db")
    extract_run(db, "d", ExtractConfig(model="tiny-deit", corpus="images:sample", n_seqs=2,
                                       batch_size=2, device="cpu"), progress=False)
    sid, summary = entropy_study(db, run="d", layers=(0, 2))
    with db.connect(read_only=True) as con:
        resid = con.execute("SELECT value FROM study_results WHERE study_id = ? AND "
                            "key = 'split_max_residual'", [sid]).fetchone()[0]
        params = con.execute("SELECT params FROM studies WHERE study_id = ?", [sid]).fetchone()[0]
    assert resid < 1e-12
    assert '"sink_positions": [[0, 1]]' in params
    s = summary["all"]
    assert s["sink_part"] + s["content_part"] == pytest.approx(s["d_entropy"], abs=1e-12)
