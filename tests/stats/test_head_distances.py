"""Head distances under both sink conventions, reversal and clustering studies (docs/metrics.md §5)."""

from __future__ import annotations

import numpy as np
import pytest

from attnbase.errors import StatsError
from attnbase.stats import convention, studies
from attnbase.stats.head_distances import (CONVENTIONS, DISSIMILARITIES, HeadDistanceAccumulator,
                                           row_dissimilarity)


def random_rows(rng, n_heads=5, n_rows=12, n_keys=9, causal=True):
    z = rng.standard_normal((n_heads, n_rows, n_keys)) * 1.5
    z[..., 0] += rng.uniform(-1, 4, size=(n_heads, 1))
    if causal:  # rows of different lengths (>= 3 keys), as a causal run has
        n = rng.integers(3, n_keys + 1, size=n_rows)
        z[:, np.arange(n_keys)[None, :] >= n[:, None]] = -np.inf
    return z


@pytest.mark.parametrize("causal", [True, False])
def test_matrix_algebra_matches_the_row_reference(rng, causal):
    z = random_rows(rng, causal=causal)
    acc = HeadDistanceAccumulator(z.shape[0])
    acc.add(z[:, :5])
    acc.add(z[:, 5:])  # blocks accumulate into one mean
    got = acc.result()
    assert set(got) == {(d, c) for d in DISSIMILARITIES for c in CONVENTIONS}
    for (d, c), m in got.items():
        ref = np.zeros_like(m)
        for a in range(z.shape[0]):
            for b in range(z.shape[0]):
                if a != b:
                    ref[a, b] = row_dissimilarity(d, z[a], z[b], c).mean()
        tol = 1e-6 if d == "js" else 1e-10  # JS mixes in float32
        np.testing.assert_allclose(m, ref, atol=tol, err_msg=f"{d}/{c}")


def test_symmetric_zero_diagonal_and_aitchison_identities(rng):
    z = random_rows(rng, n_heads=7)
    acc = HeadDistanceAccumulator(7)
    acc.add(z)
    got = acc.result()
    for m in got.values():
        assert np.array_equal(m, m.T) and np.all(np.diag(m) == 0) and np.all(m >= 0)
    np.testing.assert_array_equal(got[("aitchison", "drop_sink")], got[("aitchison_perp", "drop_sink")])
    np.testing.assert_array_equal(got[("aitchison_perp", "with_sink")],
                                  got[("aitchison_perp", "drop_sink")])


def test_constructed_triplet_flips_for_cosine_and_js_but_not_d_a_perp():
    # heads A, B: same content, sink mass 0.8 vs 0.1; head C: A's sink mass, mirrored content.
    u = np.array([0.5, 0.3, 0.15, 0.05])
    rows = {"A": np.r_[0.8, 0.2 * u], "B": np.r_[0.1, 0.9 * u], "C": np.r_[0.8, 0.2 * u[::-1]]}
    z = np.log(np.stack([rows[h] for h in "ABC"]))[:, None, :].repeat(4, axis=1)
    acc = HeadDistanceAccumulator(3)
    acc.add(z)
    m = acc.result()

    def verdict(d, c):  # anchor A: +1 when C is nearer than B, -1 when B is nearer
        return np.sign(m[(d, c)][0, 1] - m[(d, c)][0, 2])

    for d in ("cosine", "js"):
        assert verdict(d, "with_sink") == 1 and verdict(d, "drop_sink") == -1, d
        assert convention.reversal_rate(m[(d, "with_sink")], m[(d, "drop_sink")]).flips >= 1
    # the sink-orthogonal distance sees equal contents as equal whatever the sink does
    assert verdict("aitchison_perp", "with_sink") == verdict("aitchison_perp", "drop_sink") == -1
    assert m[("aitchison_perp", "with_sink")][0, 1] == pytest.approx(0.0, abs=1e-12)


def test_rows_without_content_geometry_are_refused(rng):
    acc = HeadDistanceAccumulator(2)
    z = np.zeros((2, 1, 4))
    z[..., 2:] = -np.inf
    with pytest.raises(StatsError, match="min_query"):
        acc.add(z)
    with pytest.raises(StatsError, match="unknown dissimilarity 'kl'"):
        HeadDistanceAccumulator(2, ("kl",))


def test_sampled_reversal_agrees_with_exact_enumeration(rng):
    x = rng.standard_normal((40, 6))
    d1 = np.linalg.norm(x[:, None] - x[None], axis=-1)
    y = x + 0.8 * rng.standard_normal(x.shape)
    d2 = np.linalg.norm(y[:, None] - y[None], axis=-1)
    exact = convention.reversal_rate(d1, d2)
    sampled = convention.reversal_rate(d1, d2, draws=20_000, seed=3, force_sampled=True)
    assert exact.exact and not sampled.exact and exact.triplets == convention.n_triplets(40)
    assert sampled.ci_low <= exact.rate <= sampled.ci_high
    assert 0.05 < exact.rate < 0.5


def test_cluster_agreement_recovers_planted_groups_and_tests_them(rng):
    centres = np.repeat(np.eye(3) * 10, 6, axis=0)
    x = centres + rng.standard_normal(centres.shape)
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    same = convention.cluster_agreement(d, d, draws=199, seed=1)
    assert same.k == 3 and same.ari == 1.0 and same.ari_p == pytest.approx(1 / 200)
    # 18 heads in 6 + 6 + 6: the permutation null takes a dozen values, too few to fit a normal
    assert same.p_at_floor and same.null_distinct < convention.NORMAL_FIT_MIN_DISTINCT
    assert same.ari_p_normal is None and same.sizes_with == (6, 6, 6)
    shuffled = rng.permutation(18)
    other = convention.cluster_agreement(d, d[np.ix_(shuffled, shuffled)], draws=199, seed=1)
    assert other.ari < 0.5 and other.ari_p > 0.01


# --- studies in a real catalog -----------------------------------------------------------------
@pytest.fixture
def synth_run(db):
    from synth import ingest_synthetic, make_info, make_run_arrays

    info = make_info(n_layers=3, n_heads=4)
    keys, logits = make_run_arrays(info, n_seqs=6, T=12, sink_layers=(1, 2), seed=2)
    logits[2, :2, :, :, 0] += 3.0  # two heads with a much heavier sink: conventions disagree
    ingest_synthetic(db, "syn", info, keys, logits, batch_size=4)
    return db, logits


def test_distances_study_writes_symmetric_matrices_queryable_in_sql(synth_run):
    db, logits = synth_run
    sid = studies.distances_study(db, "syn")
    with db.connect(read_only=True) as con:
        kind, runs, params = con.execute(
            "SELECT kind, run_ids, params->>'rows' FROM studies WHERE study_id = ?", [sid]).fetchone()
        assert kind == "distances" and runs == ["syn"] and int(params) == 6 * 10
        n, asym, diag = con.execute(
            """SELECT count(*), max(abs(a.value - b.value)), max(abs(a.value)) FILTER
                      (WHERE a.layer_a = a.layer_b AND a.head_a = a.head_b)
               FROM head_distances a JOIN head_distances b
                 ON a.study_id = b.study_id AND a.dissimilarity = b.dissimilarity
                AND a.convention = b.convention AND a.layer_a = b.layer_b AND a.head_a = b.head_b
                AND a.layer_b = b.layer_a AND a.head_b = b.head_a
               WHERE a.study_id = ?""", [sid]).fetchone()
    assert n == 12 * 12 * len(DISSIMILARITIES) * 2 and asym == 0 and diag == 0
    # the streamed study equals one accumulator fed every row at once
    mats, heads = studies.load_distances(db, sid)
    z = logits.reshape(12, 6, 12, 12)[:, :, 2:, :].reshape(12, -1, 12)
    acc = HeadDistanceAccumulator(12)
    acc.add(z)
    for key, m in acc.result().items():
        np.testing.assert_allclose(mats[key], m, atol=1e-9, err_msg=str(key))
    # re-running replaces, never duplicates
    assert studies.distances_study(db, "syn") == sid
    with db.connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM head_distances").fetchone()[0] == n


def test_reversal_and_clusters_studies_store_their_results(synth_run):
    db, _ = synth_run
    did = studies.distances_study(db, "syn", max_rows=40, seed=1)
    parts = studies.load_parts(db, "syn", did)  # the per-sequence sums add up to the matrices
    mats, _ = studies.load_distances(db, did)
    assert parts.n_units == 6 and parts.n_rows.sum() == 40
    assert np.allclose(parts.matrices([("js", "with_sink")])[("js", "with_sink")],
                       mats[("js", "with_sink")])
    sid, res = studies.reversal_study(db, "syn", boot=50)
    assert set(studies.COMPARED) == {k.split("/")[1] for k in res if k.startswith("reversal_rate")}
    assert all(0 <= res[f"reversal_rate/{d}"] <= 1 for d in studies.COMPARED)
    assert all(res[f"reversal_ci_low/{d}"] < res[f"reversal_ci_high/{d}"] for d in studies.COMPARED)
    sid_s, res_s = studies.reversal_study(db, "syn", draws=5000, force_sampled=True, boot=50)
    for d in studies.COMPARED:
        assert res_s[f"reversal_ci_low/{d}"] <= res[f"reversal_rate/{d}"] <= res_s[f"reversal_ci_high/{d}"]
    cid, cres = studies.clusters_study(db, "syn", draws=99, boot=30)
    assert 2 <= cres["k/js"] <= 11 and -1 <= cres["ari/js"] <= 1
    sizes = [v for k, v in cres.items() if k.startswith("cluster_size/js/")]
    assert len(sizes) == cres["k/js"] and sum(sizes) == 12 and min(sizes) >= 2
    assert cres["ari_ci_low/js"] <= cres["ari_ci_high/js"]
    with db.connect(read_only=True) as con:
        got = dict(con.execute("SELECT key, value FROM study_results WHERE study_id = ?",
                               [sid]).fetchall())
        assert got["reversal_rate/js"] == pytest.approx(res["reversal_rate/js"])
        rows = con.execute("SELECT count(*), count(DISTINCT convention) FROM head_clusters "
                           "WHERE study_id = ? AND dissimilarity = 'js'", [cid]).fetchone()
        assert rows == (24, 2)


def test_study_errors_name_the_fix(synth_run, db):
    with pytest.raises(StatsError, match="attnbase study distances"):
        studies.reversal_study(db, "syn")
    with pytest.raises(StatsError, match="min_query"):
        studies.row_set(2, 12, min_query=1)


def test_positions_whose_sink_a_sliding_window_masks_leave_the_row_set(db):
    # layer 0 slides with a window of 6 keys (as Gemma-3's local layers): from query 6 on its
    # rows no longer see key 0, where the two conventions are not both defined
    from synth import ingest_synthetic, make_info, make_run_arrays

    info = make_info(n_layers=2, n_heads=3)
    keys, logits = make_run_arrays(info, n_seqs=4, T=12, sink_layers=(1,), seed=5)
    q, j = np.meshgrid(np.arange(12), np.arange(12), indexing="ij")
    logits[0][:, :, j <= q - 6] = -np.inf
    ingest_synthetic(db, "slide", info, keys, logits, batch_size=4)
    sid = studies.distances_study(db, "slide")
    with db.connect(read_only=True) as con:
        rows, dropped = con.execute(
            "SELECT (params->>'rows')::INT, (SELECT value FROM study_results r WHERE "
            "r.study_id = s.study_id AND key = 'rows_without_sink_dropped') FROM studies s "
            "WHERE study_id = ?", [sid]).fetchone()
    assert (rows, dropped) == (4 * 4, 4 * 6)  # queries 2..5 kept, 6..11 dropped, per sequence
    mats, _ = studies.load_distances(db, sid)
    acc = HeadDistanceAccumulator(6)
    acc.add(logits.reshape(6, 4, 12, 12)[:, :, 2:6, :].reshape(6, -1, 12))
    for key, m in acc.result().items():
        np.testing.assert_allclose(mats[key], m, atol=1e-9, err_msg=str(key))
    # a window shorter than min_query leaves nothing: one line saying so
    logits[0][:, :, j <= q - 1] = -np.inf
    ingest_synthetic(db, "slide1", info, keys, logits, batch_size=4)
    with pytest.raises(StatsError, match="sliding window"):
        studies.distances_study(db, "slide1")
