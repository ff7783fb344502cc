"""Negative and positive controls of the VE@8 null tests (docs/metrics.md §8), through analyze_run.

A run of i.i.d. Gaussian keys is ingested through the real warehouse and analysed like any run:
its heads must come out null, with p-values close to uniform (about 5% below 0.05: neither 0%,
which would mean a test that cannot reject, nor 100%, which the shuffle null's old empirical
p-values at their floor gave). Planted low-rank keys in the same run must beat both nulls.
"""

import numpy as np
import pytest
from scipy import stats as sps
from synth import ingest_synthetic, make_info, make_run_arrays

from attnbase.stats.analyze import analyze_run

L, H, N_SEQ, T, D_HEAD = 8, 32, 16, 16, 16
PLANTED = 7  # the last layer: rank-3 keys plus noise


@pytest.fixture(scope="module")
def control_run(tmp_path_factory):
    from attnbase.warehouse import Database

    db = Database(tmp_path_factory.mktemp("controls") / "db")
    info = make_info(n_layers=L, n_heads=H, d_head=D_HEAD, causal=True)
    _, logits = make_run_arrays(info, n_seqs=N_SEQ, T=T, seed=1)
    rng = np.random.default_rng(2024)
    keys = rng.standard_normal((L, H, N_SEQ, T, D_HEAD)).astype(np.float32)
    a = rng.standard_normal((H, N_SEQ, T, 3))
    b = rng.standard_normal((H, 1, 3, D_HEAD))
    keys[PLANTED] = (a @ b + 0.7 * rng.standard_normal((H, N_SEQ, T, D_HEAD))).astype(np.float32)
    ingest_synthetic(db, "ctrl", info, keys, logits, batch_size=8)
    out = analyze_run(db, "ctrl", draws=200, gauss_draws=200, seed=5, seq_draws=8, n_boot=50)
    with db.connect(read_only=True) as con:
        nt = con.sql("SELECT * FROM null_tests WHERE run_id = 'ctrl'").pl()
    return out, nt


@pytest.mark.parametrize("null_model", ["gauss", "shuffle"])
def test_gaussian_keys_give_uniform_p_values(control_run, null_model):
    _, nt = control_run
    neg = nt.filter((nt["null_model"] == null_model) & (nt["layer"] != PLANTED))
    p, z = neg["p_value"].to_numpy(), neg["z"].to_numpy()
    assert p.size == (L - 1) * H == 224
    frac = float(np.mean(p < 0.05))
    # Binomial(224, 0.05): 11.2 expected, sd 3.3; 1%..11% is more than +-3 sd
    assert 0.01 <= frac <= 0.11, frac
    assert sps.kstest(p, "uniform").pvalue > 0.01
    # z is standard normal under the null (its sd includes the null mean's Monte-Carlo error)
    assert abs(z.mean()) < 0.25 and 0.8 < z.std() < 1.2
    # the empirical p-values too (200 draws of the mean each), and they are rarely at the floor
    pe = neg["p_empirical"].to_numpy()
    assert 0.01 <= float(np.mean(pe < 0.05)) <= 0.11
    assert neg["p_at_floor"].sum() <= 5
    # BH over heads: essentially no discoveries among null heads
    assert float(np.mean(neg["q_value"].to_numpy() < 0.05)) <= 0.02


@pytest.mark.parametrize("null_model", ["gauss", "shuffle"])
def test_planted_low_rank_keys_beat_the_null(control_run, null_model):
    _, nt = control_run
    pos = nt.filter((nt["null_model"] == null_model) & (nt["layer"] == PLANTED))
    assert pos.height == H
    assert (pos["z"] > 5).all() and (pos["p_value"] < 1e-6).all() and (pos["q_value"] < 1e-4).all()
    # 200 draws cannot show p below 1/201; the empirical p sits at its floor and says so
    assert pos["p_at_floor"].all()
    np.testing.assert_allclose(pos["p_empirical"], 1 / 201)


def test_run_summary_counts_only_the_planted_heads(control_run):
    out, _ = control_run
    # 32 of 256 heads are planted; BH may add at most a stray null head
    assert 32 / 256 <= out["frac_heads_beat_gauss"] <= 34 / 256
    assert 32 / 256 <= out["frac_heads_beat_shuffle"] <= 34 / 256
