"""The r-conventions study (docs/metrics.md §1, §3, §3a): every combination, its parity with analyze's
r_cv_share, the GQA kv-head pairing, and negative controls that must come out null."""

import numpy as np
import pytest
from synth import ingest_synthetic, make_info, make_run_arrays, softmax

from attnbase.errors import StatsError
from attnbase.stats import concentration, norms
from attnbase.stats.analyze import analyze_run
from attnbase.stats.r_conventions import (
    CV_VARIANTS, RESULT_STATS, SHARE_VARIANTS, correlate, head_values, r_conventions_study,
    r_table, share_variants, split_key,
)


@pytest.fixture
def gqa_run(db):
    info = make_info(n_layers=4, n_heads=4, n_kv_heads=2, d_head=16, causal=True)
    keys, logits = make_run_arrays(info, n_seqs=6, T=24, sink_layers=(2, 3), sink_logit=5.0,
                                   seed=7)
    ingest_synthetic(db, "g", info, keys, logits)
    return db, keys, logits


def test_every_combination_stored_and_default_matches_analyze(gqa_run):
    db, keys, logits = gqa_run
    out = analyze_run(db, "g", draws=5, gauss_draws=20, seed=0, n_boot=200)
    sid, table = r_conventions_study(db, "g", n_boot=200, seed=0)
    assert len(table) == len(CV_VARIANTS) * len(SHARE_VARIANTS) * 2  # GQA: both pairings
    assert table[("key_norm_cv", "max_share", "query_head")]["r"] == pytest.approx(
        out["r_cv_share"], abs=1e-9)  # logits path == analyze's col_stats SQL path
    with db.connect(read_only=True) as con:
        rows = con.execute("SELECT key, value FROM study_results WHERE study_id = ?",
                           [sid]).fetchall()
        kind = con.execute("SELECT kind FROM studies WHERE study_id = ?", [sid]).fetchone()[0]
    assert kind == "r_conventions" and len(rows) == len(table) * len(RESULT_STATS)
    assert {split_key(k)[3] for k, _ in rows} == set(RESULT_STATS)
    # the kv-head pairing: each kv head's CV against the mean share of its two query heads
    cv, share, kv = head_values(db, "g")
    np.testing.assert_allclose(cv["key_norm_cv"], norms.key_norm_cv(keys), rtol=1e-6)
    attn = softmax(logits.astype(np.float64))
    np.testing.assert_allclose(share["max_share_excl_sink_q4"],
                               concentration.max_share_excl_sink_q4(attn), rtol=1e-9)
    grouped = share["max_share"].reshape(4, 2, 2).mean(-1)
    r_kv = np.corrcoef(cv["key_norm_cv"].ravel(), grouped.ravel())[0, 1]
    assert table[("key_norm_cv", "max_share", "kv_head")]["r"] == pytest.approx(r_kv, abs=1e-9)
    assert table[("key_norm_cv", "max_share", "kv_head")]["n"] == 8
    # a rerun replaces the study's rows
    assert r_conventions_study(db, "g", n_boot=200, seed=0)[0] == sid
    with db.connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM study_results WHERE study_id = ?",
                           [sid]).fetchone()[0] == len(rows)


def test_negative_control_iid_keys_and_attention_give_null_r(db):
    """i.i.d. Gaussian keys and i.i.d. logits (no sink, no structure), through the warehouse:
    every combination's r is within chance of 0; over 40 independent such runs (numpy, same
    r_table) each combination's 95% CI covers 0 in about 95% of them."""
    info = make_info(n_layers=6, n_heads=4, n_kv_heads=4, d_head=16, causal=True)
    keys, logits = make_run_arrays(info, n_seqs=4, T=16, seed=11)
    ingest_synthetic(db, "iid", info, keys, logits)
    _, table = r_conventions_study(db, "iid", n_boot=300, seed=1)
    assert len(table) == len(CV_VARIANTS) * len(SHARE_VARIANTS)  # no GQA: query heads only
    for combo, s in table.items():
        assert s["n"] == 24 and abs(s["r"]) < 0.6, (combo, s)  # 3 sd of r at n = 24
    covered = {combo: 0 for combo in table}
    for seed in range(40):
        k, z = make_run_arrays(info, n_seqs=4, T=16, seed=100 + seed)
        cv = {"key_norm_cv": norms.key_norm_cv(k), "key_norm_cv_excl_sink":
              norms.key_norm_cv_excl_sink(k)}
        share = share_variants(softmax(z.astype(np.float64)))
        for combo, s in r_table(cv, share, np.arange(4), n_boot=200, seed=seed).items():
            covered[combo] += s["ci_low"] <= 0 <= s["ci_high"]
    assert all(c >= 34 for c in covered.values()), covered  # >= 85% of 40


def test_correlate_coverage_on_independent_draws():
    """Independent x, y: the 95% CI covers 0 in about 95% of draws and p is about uniform."""
    rng = np.random.default_rng(0)
    res = [correlate(rng.standard_normal(72), rng.standard_normal(72), n_boot=200, seed=i)
           for i in range(60)]
    coverage = np.mean([r["ci_low"] <= 0 <= r["ci_high"] for r in res])
    assert 0.85 <= coverage <= 1.0
    assert np.mean([r["p"] < 0.05 for r in res]) <= 0.15
    assert abs(np.mean([r["r"] for r in res])) < 0.05


def test_run_without_keys_says_how_to_fix(db):
    info = make_info(n_layers=2, n_heads=2, d_head=8)
    keys, logits = make_run_arrays(info, n_seqs=2, T=8)
    ingest_synthetic(db, "nokeys", info, keys, logits, capture=("logits",))
    with pytest.raises(StatsError, match="--capture keys,logits"):
        r_conventions_study(db, "nokeys")
