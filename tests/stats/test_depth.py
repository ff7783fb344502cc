"""Rank collapse across depth (docs/metrics.md §6): reference values, invariants, analyze_run rows."""

import numpy as np
import pytest
from synth import batches_from_arrays, make_info, make_run_arrays

from attnbase.errors import StatsError
from attnbase.extract.config import ExtractConfig
from attnbase.stats import depth
from attnbase.stats.analyze import analyze_run


def test_reference_values_metrics_md():
    x = np.arange(12.0).reshape(4, 3)
    assert depth.l1_norm(x) == 26.0
    assert depth.linf_norm(x) == 30.0
    assert depth.composite_norm(x) == pytest.approx(27.928480, abs=1e-6)
    assert depth.residual_ratio(x) == pytest.approx(0.455733, abs=1e-6)
    # by hand: res rows are (-4.5, -1.5, 1.5, 4.5) * 1; ||res||_1 = 12, ||res||_inf = 13.5
    assert depth.composite_norm(depth.token_residual(x)) == pytest.approx(np.sqrt(12 * 13.5))


def test_rank1_residual_of_rank1_is_zero(rng):
    p = np.outer(rng.random(7), rng.random(7))
    assert np.abs(depth.rank1_residual(p)).max() < 1e-12
    assert depth.path_residual_ratio(p) < 1e-12
    # a stochastic matrix with identical rows (the collapse limit) is rank 1
    a = np.tile(rng.dirichlet(np.ones(5)), (5, 1))
    assert depth.path_residual_ratio(a) < 1e-12
    # the identity is far from rank 1: removing one of n unit singular directions
    n = 6
    r = depth.rank1_residual(np.eye(n))
    assert np.linalg.matrix_rank(r) == n - 1


def test_collapsed_hidden_has_zero_ratio_and_batches(rng):
    h = np.tile(rng.standard_normal(8), (5, 1))  # every token the same vector
    assert depth.residual_ratio(h) == pytest.approx(0.0, abs=1e-12)
    x = rng.standard_normal((3, 4, 5, 8))
    batched = depth.residual_ratio(x)
    assert batched.shape == (3, 4)
    np.testing.assert_allclose(batched[2, 1], depth.residual_ratio(x[2, 1]))
    assert np.isnan(depth.residual_ratio(np.zeros((4, 3))))
    # scale invariant; invariant to permuting tokens
    np.testing.assert_allclose(depth.residual_ratio(3.7 * x), batched)
    np.testing.assert_allclose(depth.residual_ratio(x[..., ::-1, :]), batched)


def test_effective_rank_closed_forms():
    assert depth.effective_rank([5.0, 0.0, 0.0]) == pytest.approx(1.0)
    assert depth.effective_rank([2.0, 2.0, 2.0]) == pytest.approx(3.0)
    assert depth.effective_rank([1.0, 1.0], kind="participation") == pytest.approx(2.0)
    p = np.array([0.5, 0.3, 0.2])
    assert depth.effective_rank(p) == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    assert depth.effective_rank([3.0, 1.0], kind="participation") == pytest.approx(100 / 82)
    assert np.isnan(depth.effective_rank([0.0, 0.0]))
    with pytest.raises(StatsError, match="unknown effective-rank kind"):
        depth.effective_rank([1.0], kind="entropy")


def test_residual_erank_of_planted_rank(rng):
    # res of tokens spanning two orthogonal equal-energy directions -> erank 2
    t = np.array([[1.0, 0], [-1, 0], [0, 1], [0, -1]])
    h = t @ np.eye(2, 6) + rng.standard_normal(6)  # plus a shared offset, removed by res
    assert depth.residual_erank(h) == pytest.approx(2.0)
    assert depth.residual_erank(h, kind="participation") == pytest.approx(2.0)


def _ingest_with_hidden(db, run_id, info, keys, logits, hidden, cfg):
    """A synthetic run whose batches also carry ``hidden`` (layer, seq, pos, d_model)."""
    from attnbase.runner import ingest_batches

    base = batches_from_arrays(info, cfg, keys, logits)

    def batches(start):
        for cb in base(start):
            cb.arrays["hidden"] = hidden[:, cb.first_seq:cb.first_seq + cb.n_seqs]
            yield cb

    ingest_batches(db, run_id, cfg, info=info, corpus="synthetic", corpus_hash="0",
                   batches=batches, progress=False)


def test_analyze_writes_depth_layer_metrics(db):
    info = make_info(n_layers=3, n_heads=2, d_head=4, causal=False)
    n_seqs, T = 5, 6
    keys, logits = make_run_arrays(info, n_seqs, T)
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((4, n_seqs, T, info.d_model)).astype(np.float32)
    hidden[3] = hidden[3, :, :1]  # last layer fully collapsed
    cfg = ExtractConfig(model="synthetic", n_seqs=n_seqs, seq_len=T, batch_size=2,
                        capture=("keys", "logits", "hidden"))
    _ingest_with_hidden(db, "d", info, keys, logits, hidden, cfg)
    analyze_run(db, "d", draws=2, gauss_draws=4, n_boot=50)
    with db.connect(read_only=True) as con:
        got = con.sql("SELECT layer, metric, value FROM layer_metrics WHERE run_id='d' AND metric "
                      "IN ('rank_collapse', 'rank_collapse_sd', 'residual_erank') "
                      "ORDER BY metric, layer").pl()
    rc = got.filter(got["metric"] == "rank_collapse")["value"].to_numpy()
    sd = got.filter(got["metric"] == "rank_collapse_sd")["value"].to_numpy()
    er = got.filter(got["metric"] == "residual_erank")["value"].to_numpy()
    per_seq = depth.residual_ratio(hidden.astype(np.float64))  # (layer, seq)
    np.testing.assert_allclose(rc, per_seq.mean(1), rtol=1e-6)
    np.testing.assert_allclose(sd[:3], per_seq[:3].std(1, ddof=1), rtol=1e-6)
    assert rc[3] == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(er[:3], depth.residual_erank(hidden[:3].astype(np.float64)).mean(1),
                               rtol=1e-6)
    with db.connect(read_only=True) as con:
        ex = con.execute("SELECT value FROM layer_metrics WHERE run_id='d' AND "
                         "metric='rank_collapse_excl_sink' ORDER BY layer").fetchall()
    np.testing.assert_allclose([v for (v,) in ex],
                               depth.residual_ratio(hidden[:, :, 1:].astype(np.float64)).mean(1),
                               rtol=1e-6)
    # re-running replaces, never duplicates
    analyze_run(db, "d", draws=2, gauss_draws=4, n_boot=50)
    with db.connect(read_only=True) as con:
        n = con.execute("SELECT count(*) FROM layer_metrics WHERE run_id='d' "
                        "AND metric='rank_collapse'").fetchone()[0]
    assert n == 4


def test_docstring_examples():
    import doctest

    assert doctest.testmod(depth, raise_on_error=True).attempted >= 4


def test_sample_paths_distinct_ascending(rng):
    layers, heads = depth.sample_paths(rng, 6, 4, 4, 500)
    assert layers.shape == heads.shape == (500, 4)
    assert np.all(np.diff(layers, axis=1) > 0)
    assert set(np.unique(layers)) == set(range(6)) and set(np.unique(heads)) == set(range(4))
    with pytest.raises(StatsError, match="path length"):
        depth.sample_paths(rng, 6, 4, 7, 1)


def test_path_products_orders(rng):
    attn = rng.dirichlet(np.ones(5), size=(3, 2, 1, 5))  # (layer, head, seq, query, key)
    layers, heads = np.array([[0, 2]]), np.array([[1, 0]])
    a0, a2 = attn[0, 1, 0], attn[2, 0, 0]
    fwd = depth.path_products(attn, layers, heads)[0, 0]
    asc = depth.path_products(attn, layers, heads, order="ascending")[0, 0]
    np.testing.assert_allclose(fwd, a2 @ a0)  # layer 0 acts first
    np.testing.assert_allclose(asc, a0 @ a2)
    np.testing.assert_allclose(fwd.sum(-1), 1.0)  # products stay row-stochastic
    with pytest.raises(StatsError, match="unknown path order"):
        depth.path_products(attn, layers, heads, order="backward")


def test_path_ratio_draws_rank1_heads_give_zero(rng):
    # heads whose every row is the same distribution: every product is rank 1, ratio 0
    rows = rng.dirichlet(np.ones(6), size=(4, 3, 2))
    attn = np.repeat(rows[:, :, :, None, :], 6, axis=3)
    out = depth.path_ratio_draws(attn, draws=7, seed=1)
    assert sorted(out) == [1, 2, 3, 4] and out[2].shape == (2, 7)
    assert max(np.abs(v).max() for v in out.values()) < 1e-10
    # identity heads never collapse: ratio of I minus a rank-1 part stays away from 0
    eye = np.broadcast_to(np.eye(6), (4, 3, 2, 6, 6))
    assert min(v.min() for v in depth.path_ratio_draws(eye, draws=3).values()) > 0.5
    # seeded
    again = depth.path_ratio_draws(attn + 0, draws=7, seed=1)
    np.testing.assert_array_equal(out[3], again[3])


def test_erank_undefined_at_rounding_level(rng):
    v = rng.standard_normal(16).astype(np.float32)
    collapsed = np.tile(v, (1, 8, 1)) * (1 + 1e-8 * rng.standard_normal((1, 8, 16))).astype(np.float32)
    live = rng.standard_normal((1, 8, 16)).astype(np.float32)
    prof = depth.hidden_layer_profile(np.concatenate([collapsed, live]))
    assert prof["rank_collapse"][0] < 1e-6 and np.isnan(prof["residual_erank"][0])
    assert np.isfinite(prof["residual_erank"][1]) and np.isfinite(prof["residual_erank_pr"][1])


def test_analyze_depth_only_run(db):
    info = make_info(n_layers=2, n_heads=2, d_head=4, causal=True)
    keys, logits = make_run_arrays(info, 3, 6)
    hidden = np.random.default_rng(2).standard_normal((3, 3, 6, info.d_model)).astype(np.float32)
    cfg = ExtractConfig(model="synthetic", n_seqs=3, seq_len=6, batch_size=2,
                        capture=("logits", "hidden"))
    _ingest_with_hidden(db, "h", info, keys, logits, hidden, cfg)
    assert analyze_run(db, "h") == {}
    with db.connect(read_only=True) as con:
        got = con.execute("SELECT value FROM layer_metrics WHERE run_id='h' AND "
                          "metric='rank_collapse' ORDER BY layer").fetchall()
    np.testing.assert_allclose([v for (v,) in got],
                               depth.residual_ratio(hidden.astype(np.float64)).mean(1), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_profile_kernel_matches_the_reference_functions(rng, dtype):
    # 37 sequences: pieces of depth._PROFILE_SEQS and a partial one; token 0 made massive
    x = rng.standard_normal((37, 9, 12)).astype(dtype)
    x[:, 0] *= 50
    x[3] = x[3, :1]  # a collapsed sequence
    ref = x.astype(np.float64)
    from concurrent.futures import ThreadPoolExecutor

    serial = depth.hidden_layer_profile(x)
    with ThreadPoolExecutor(2) as pool:
        pooled = depth.hidden_layer_profile(x, pool)
    for name in serial:
        np.testing.assert_array_equal(serial[name], pooled[name])
    np.testing.assert_allclose(serial["rank_collapse"], depth.residual_ratio(ref), rtol=1e-12,
                               atol=1e-15)
    np.testing.assert_allclose(serial["rank_collapse_excl_sink"], depth.residual_ratio(ref[:, 1:]),
                               rtol=1e-12, atol=1e-15)
    live = np.arange(37) != 3
    np.testing.assert_allclose(serial["residual_erank"][live], depth.residual_erank(ref)[live],
                               rtol=1e-10)
    np.testing.assert_allclose(serial["residual_erank_pr"][live],
                               depth.residual_erank(ref, "participation")[live], rtol=1e-10)
    assert np.isnan(serial["residual_erank"][3])


def test_profile_of_single_token_sequences():
    prof = depth.hidden_layer_profile(np.ones((2, 1, 4), dtype=np.float32))
    assert np.isnan(prof["rank_collapse_excl_sink"]).all()
    assert (prof["rank_collapse"] == 0).all()
