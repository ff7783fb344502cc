"""analyze_run end to end on synthetic runs ingested through the real warehouse (no model)."""

import numpy as np
import pytest
from synth import ingest_synthetic, make_info, make_run_arrays, softmax

from attnbase.errors import RunNotFoundError, StatsError
from attnbase.stats import concentration, geometry, norms
from attnbase.stats.analyze import analyze_run
from attnbase.stats.registry import STATISTICS
from attnbase.stats.views import HEAD_SUMMARY_METRICS, TABLE1_METRICS

FAST = dict(draws=5, gauss_draws=20, seed=3, n_boot=200)


@pytest.fixture
def gqa_run(db):
    """Causal, GQA (4 query heads on 2 kv heads); sink from layer 2; rank-2 keys in layer 1."""
    info = make_info(n_layers=4, n_heads=4, n_kv_heads=2, d_head=16, causal=True)
    keys, logits = make_run_arrays(info, n_seqs=6, T=24, sink_layers=(2, 3), sink_logit=5.0,
                                   rank_layers=(1,), rank=2)
    ingest_synthetic(db, "g", info, keys, logits)
    return db, info, keys, logits


def table(db, sql, params=()):
    with db.connect(read_only=True) as con:
        return con.sql(sql, params=list(params)).pl()


def head_values(db, run, metric):
    df = table(db, "SELECT layer, head, value FROM head_metrics WHERE run_id=? AND metric=? "
                   "ORDER BY layer, head", [run, metric])
    L, H = df["layer"].max() + 1, df["head"].max() + 1
    return df["value"].to_numpy().reshape(L, H)


def test_gqa_run_end_to_end(gqa_run):
    db, info, keys, logits = gqa_run
    L, H = info.n_layers, info.n_heads
    out = analyze_run(db, "g", **FAST)

    # every metric stored is in the metric registry at the level it is stored at
    from attnbase.metrics import METRICS, TABLES

    for level, tbl in TABLES.items():
        for name in table(db, f"SELECT DISTINCT metric FROM {tbl}")["metric"]:
            assert name in METRICS and level in METRICS[name].levels, (tbl, name)

    # every registered head metric, once per (layer, query head)
    counts = table(db, "SELECT metric, count(*) AS n FROM head_metrics WHERE run_id='g' "
                       "GROUP BY metric")
    n = dict(zip(counts["metric"], counts["n"]))
    for name, stat in STATISTICS.items():
        if stat.head_metric:
            assert n.get(name) == L * H, name
    assert n["ve_gauss"] == n["ve_shuffle"] == L * H

    # key statistics: per kv head, copied to the group's query heads (h // 2)
    kv = np.arange(H) // 2
    cv = head_values(db, "g", "key_norm_cv")
    np.testing.assert_allclose(cv, norms.key_norm_cv(keys)[:, kv], rtol=1e-6)
    ve = head_values(db, "g", "ve_at_8")
    np.testing.assert_allclose(ve, geometry.ve_at_k(keys, 8).mean(-1)[:, kv], rtol=1e-6)
    np.testing.assert_allclose(ve[1], 1.0, atol=1e-6)  # planted rank-2 keys

    # attention statistics (SQL) match the numpy definitions on the same logits
    a = softmax(logits.astype(np.float64))
    for name, fn in [("max_share", concentration.max_share),
                     ("row_max_share", concentration.row_max_share),
                     ("mean_sink_mass", concentration.mean_sink_mass)]:
        np.testing.assert_allclose(head_values(db, "g", name), fn(a), rtol=1e-9, err_msg=name)

    # onset where the sink was planted, and the Table-1 row
    assert out["onset_layer"] == concentration.onset_layer(concentration.max_share(a)) == 2
    assert out["onset_depth"] == pytest.approx(0.5)
    assert out["key_norm_cv_baseline"] == pytest.approx(1 / np.sqrt(32))
    assert out["key_norm_cv"] == pytest.approx(norms.key_norm_cv(keys).mean(), rel=1e-6)
    t1 = table(db, "SELECT * FROM table1")
    assert t1.height == 1 and t1["run_id"][0] == "g" and t1["model"][0] == "synthetic"
    assert list(t1.columns[:4 + len(TABLE1_METRICS)]) == ["run_id", "model", "n_layers", "d_head",
                                                          *TABLE1_METRICS]
    assert t1["onset_layer"][0] == 2
    assert t1["r_cv_share"][0] == pytest.approx(out["r_cv_share"])

    hs = table(db, "SELECT * FROM head_summary WHERE run_id='g' ORDER BY layer, head")
    assert hs.height == L * H
    assert set(HEAD_SUMMARY_METRICS) <= set(hs.columns)
    np.testing.assert_allclose(hs["max_share"].to_numpy().reshape(L, H),
                               head_values(db, "g", "max_share"))

    # layer profile = head means; run figure = mean over layers of the head means
    lm = table(db, "SELECT layer, value FROM layer_metrics WHERE run_id='g' AND metric='max_share' "
                   "ORDER BY layer")
    np.testing.assert_allclose(lm["value"], concentration.max_share(a).mean(1))


def test_null_tests_rows(gqa_run):
    from scipy.stats import norm

    from attnbase.stats.inference import adjust_p_values

    db, info, keys, _ = gqa_run
    out = analyze_run(db, "g", **FAST)
    nt = table(db, "SELECT * FROM null_tests WHERE run_id='g' ORDER BY null_model, layer, head")
    L, H = info.n_layers, info.n_heads
    assert nt.height == 2 * L * H
    assert set(nt["null_model"]) == {"gauss", "shuffle"} and set(nt["metric"]) == {"ve_at_8"}
    assert set(nt["p_method"]) == {"clt_normal"} and set(nt["seed"]) == {3}
    sh = nt.filter(nt["null_model"] == "shuffle")
    assert set(sh["draws"]) == {5}
    assert set(nt.filter(nt["null_model"] == "gauss")["draws"]) == {20}
    # z and p as docs/metrics.md §8 defines them
    z = (nt["statistic"] - nt["null_mean"]) / nt["null_sd"]
    np.testing.assert_allclose(nt["z"], z, rtol=1e-12)
    np.testing.assert_allclose(nt["p_value"], norm.sf(z), rtol=1e-9, atol=1e-300)
    # the rank-2 layer beats the shuffle null: its empirical p sits at the floor 1/6 (flagged),
    # the CLT p-value is not bounded by the draws
    r2 = sh.filter(sh["layer"] == 1)
    np.testing.assert_allclose(r2["p_empirical"], 1 / 6)
    assert r2["p_at_floor"].all() and (r2["z"] > 5).all() and (r2["p_value"] < 1e-6).all()
    pe = nt["p_empirical"].to_numpy()
    assert np.all((pe >= 1 / 21 - 1e-12) & (pe <= 1))
    np.testing.assert_array_equal(nt["p_at_floor"], np.isclose(pe, 1 / (1 + nt["draws"])))
    # shuffle null mean as head_metrics.ve_shuffle; the statistic is ve_at_8
    np.testing.assert_allclose(sh["null_mean"].to_numpy().reshape(L, H),
                               head_values(db, "g", "ve_shuffle"))
    np.testing.assert_allclose(sh["statistic"].to_numpy().reshape(L, H),
                               head_values(db, "g", "ve_at_8"))
    # q-values: BH across (layer, kv head) -- each kv head once -- then copied to query heads
    kv_rows = sh.filter(sh["head"] % 2 == 0)
    np.testing.assert_allclose(kv_rows["q_value"], adjust_p_values(kv_rows["p_value"].to_numpy()))
    np.testing.assert_array_equal(sh.filter(sh["head"] % 2 == 1)["q_value"], kv_rows["q_value"])
    # the conventions are recorded with the run
    assert out["draws"] == 5 and out["gauss_draws"] == 20 and out["gauss_pool"] == 4096
    assert out["shuffle_seqs"] == 6 and out["shuffle_seq_draws"] == -(-128 // 6)


def test_rerun_replaces_never_duplicates(gqa_run):
    db = gqa_run[0]
    first = analyze_run(db, "g", **FAST)
    sizes = {t: table(db, f"SELECT count(*) AS n FROM {t} WHERE run_id='g'")["n"][0]
             for t in ("head_metrics", "null_tests", "layer_metrics", "run_metrics")}
    again = analyze_run(db, "g", **FAST)
    for t, n in sizes.items():
        assert table(db, f"SELECT count(*) AS n FROM {t} WHERE run_id='g'")["n"][0] == n, t
    # seeded: identical up to the summation order of DuckDB's parallel aggregates
    assert first.keys() == again.keys()
    for k, v in first.items():
        assert (v is None and again[k] is None) or again[k] == pytest.approx(v, rel=1e-12), k


def test_encoder_run_has_full_rows(db):
    info = make_info(n_layers=3, n_heads=2, d_head=8, causal=False)
    keys, logits = make_run_arrays(info, n_seqs=4, T=12, sink_layers=(1, 2), sink_logit=4.0)
    ingest_synthetic(db, "enc", info, keys, logits)
    out = analyze_run(db, "enc", **FAST)
    a = softmax(logits.astype(np.float64))
    np.testing.assert_allclose(head_values(db, "enc", "max_share"), concentration.max_share(a),
                               rtol=1e-9)
    assert out["onset_layer"] == 1
    assert out["ve_at_8"] is not None


def test_no_onset_is_null(db):
    info = make_info(n_layers=2, n_heads=2, d_head=8, causal=False)
    keys, logits = make_run_arrays(info, n_seqs=2, T=16)  # near-uniform rows: share ~1/16
    ingest_synthetic(db, "flat", info, keys, logits, batch_size=2)
    out = analyze_run(db, "flat", **FAST)
    assert out["onset_layer"] is None and out["onset_depth"] is None
    assert table(db, "SELECT onset_layer FROM table1 WHERE run_id='flat'")["onset_layer"][0] is None


def test_errors(db, gqa_run):
    with pytest.raises(RunNotFoundError, match="g"):
        analyze_run(db, "nope")
    with db.transaction() as con:
        con.execute("UPDATE runs SET status='running' WHERE run_id='g'")
    with pytest.raises(StatsError, match="not complete"):
        analyze_run(db, "g", **FAST)


def test_key_statistics_do_not_depend_on_worker_count(gqa_run):
    from attnbase.stats.analyze import key_statistics

    db = gqa_run[0]
    info = db.run_info("g")
    a, na = key_statistics(db, "g", info, seq_draws=4, gauss_pool=50, seed=1, workers=1)
    b, nb = key_statistics(db, "g", info, seq_draws=4, gauss_pool=50, seed=1, workers=2)
    for m in a:
        np.testing.assert_array_equal(a[m], b[m])
    assert na["shuffle_seq"].shape == (info["n_layers"], info["n_kv_heads"], 6, 4)
    np.testing.assert_array_equal(na["shuffle_seq"], nb["shuffle_seq"])
    np.testing.assert_array_equal(na["ve_seq"], nb["ve_seq"])
    np.testing.assert_array_equal(na["gauss_pool"], nb["gauss_pool"])


def test_run_without_keys_says_how_to_fix(db):
    info = make_info(n_layers=2, n_heads=2, d_head=8)
    keys, logits = make_run_arrays(info, n_seqs=2, T=8)
    ingest_synthetic(db, "nokeys", info, keys, logits, batch_size=2, capture=("logits",))
    with pytest.raises(StatsError, match="no 'keys' array.*--capture"):
        analyze_run(db, "nokeys", **FAST)
