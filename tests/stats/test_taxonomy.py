"""Head taxonomy scores (docs/metrics.md §3b): closed forms on hand-built heads, with negative
controls, and the analysis writing them per head from a run's stored logits and tokens."""

from __future__ import annotations

import numpy as np
import pytest

from attnbase.stats.taxonomy import duplicate_token, induction, prev_token, taxonomy_means, \
    taxonomy_sums


def uniform(T: int) -> np.ndarray:
    return np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]


def prev_head(T: int) -> np.ndarray:
    a = np.zeros((T, T))
    a[0, 0] = 1.0
    a[np.arange(1, T), np.arange(T - 1)] = 1.0
    return a


def repeated(T: int, seed: int = 0) -> np.ndarray:
    """(1, T): T/2 distinct ids, then the same again."""
    half = np.random.default_rng(seed).permutation(1000)[:T // 2]
    return np.concatenate([half, half])[None]


def duplicate_head(tokens: np.ndarray) -> np.ndarray:
    """Each query on its earlier occurrences (evenly), else on itself."""
    t = tokens[0]
    T = len(t)
    a = np.eye(T)
    for i in range(T):
        j = [k for k in range(i) if t[k] == t[i]]
        if j:
            a[i] = 0.0
            a[i, j] = 1.0 / len(j)
    return a


def induction_head(tokens: np.ndarray) -> np.ndarray:
    """Each query on the token after its earlier occurrence, else on key 0."""
    t = tokens[0]
    T = len(t)
    a = np.zeros((T, T))
    a[:, 0] = 1.0
    for i in range(T):
        j = [k + 1 for k in range(i) if t[k] == t[i]]
        if j:
            a[i] = 0.0
            a[i, j] = 1.0 / len(j)
    return a


def test_a_previous_token_head_scores_one_and_nothing_else():
    T = 16
    tok = repeated(T)
    a = prev_head(T)[None]  # (seq=1, query, key)
    assert prev_token(a, tok) == pytest.approx(1.0)
    # on a repeated sequence the previous token is not an earlier occurrence, nor after one
    assert duplicate_token(a, tok) == pytest.approx(0.0)
    assert induction(a, tok) == pytest.approx(0.0)


def test_a_duplicate_token_head_scores_one_and_nothing_else():
    T = 16
    tok = repeated(T)
    a = duplicate_head(tok)[None]
    assert duplicate_token(a, tok) == pytest.approx(1.0)
    assert induction(a, tok) == pytest.approx(0.0)
    assert prev_token(a, tok) == pytest.approx(0.0)  # query T/2 + k on key k, never i - 1


def test_an_induction_head_on_a_repeated_sequence_scores_one():
    T = 16
    tok = repeated(T)
    a = induction_head(tok)[None]
    assert induction(a, tok) == pytest.approx(1.0)
    assert duplicate_token(a, tok) == pytest.approx(0.0)
    # the second half's queries attend to i - T/2 + 1, the previous token only when T/2 == 1
    assert prev_token(a, tok) == pytest.approx(1 / (T - 1))  # row 1 on key 0


def test_uniform_causal_attention_scores_its_closed_forms():
    T = 128
    tok = repeated(T)
    a = uniform(T)[None]
    expect_prev = np.mean([1 / (i + 1) for i in range(1, T)])
    assert prev_token(a, tok) == pytest.approx(expect_prev, rel=1e-12)
    assert expect_prev == pytest.approx(0.034907, abs=1e-6)
    # queries T/2 .. T-1 each see one earlier occurrence: 1/(i+1), and one key after it too
    second = np.arange(T // 2, T)
    assert duplicate_token(a, tok) == pytest.approx(np.mean(1 / (second + 1)), rel=1e-12)
    assert induction(a, tok) == pytest.approx(np.mean(1 / (second + 1)), rel=1e-12)


def test_no_repeats_gives_no_duplicate_or_induction_score():
    T = 8
    tok = np.arange(T)[None]
    a = uniform(T)[None]
    assert np.isnan(duplicate_token(a, tok)) and np.isnan(induction(a, tok))
    assert prev_token(a, tok) == pytest.approx(np.mean(1 / np.arange(2, T + 1)))


def test_heads_and_chunks_add_up_to_the_pooled_means():
    T = 12
    rng = np.random.default_rng(3)
    tok = rng.integers(0, 4, size=(6, T))
    z = rng.standard_normal((3, 6, T, T))
    z[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] = -np.inf
    a = np.exp(z - z.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    whole = taxonomy_means(taxonomy_sums(a, tok))
    parts = [taxonomy_sums(a[:, s], tok[s]) for s in (slice(0, 2), slice(2, 6))]
    added = taxonomy_means({k: parts[0][k] + parts[1][k] for k in parts[0]})
    for name in whole:
        np.testing.assert_allclose(added[name], whole[name], rtol=1e-12)
        assert whole[name].shape == (3,)
    # one head scored alone is the same head in the stack
    np.testing.assert_allclose(induction(a[1], tok), whole["induction"][1], rtol=1e-12)


def test_transformer_lens_definition_differs_by_the_share_of_repeated_queries():
    """TL's detect_head (mul): sum(A * pattern) / sum(A), over every query. Its pattern for
    duplicate/induction heads marks the same keys as ours, so TL = ours x share of qualifying
    queries; previous-token: TL = ours x (T - 1) / T."""
    T = 16
    tok = repeated(T)
    t = tok[0]
    dup_pat = np.tril(t[:, None] == t[None, :], -1).astype(float)
    ind_pat = np.zeros_like(dup_pat)
    ind_pat[:, 1:] = dup_pat[:, :-1]
    prev_pat = np.eye(T, k=-1)
    a = induction_head(tok)
    tl = {name: float((a * pat).sum() / a.sum()) for name, pat in
          (("prev", prev_pat), ("dup", dup_pat), ("ind", ind_pat))}
    share = (dup_pat.sum(-1) > 0).mean()
    assert share == 0.5
    assert tl["ind"] == pytest.approx(induction(a[None], tok) * share)
    assert tl["dup"] == pytest.approx(duplicate_token(a[None], tok) * share)
    assert tl["prev"] == pytest.approx(prev_token(a[None], tok) * (T - 1) / T)


def test_attention_and_tokens_must_match():
    with pytest.raises(ValueError, match="does not match tokens"):
        prev_token(uniform(4)[None], np.zeros((1, 5), dtype=int))


@pytest.mark.slow  # ~3.5 s: an analysis of a synthetic run (torch, DuckDB)
def test_analyze_writes_the_scores_of_every_head_from_the_stored_logits(db, monkeypatch):
    """analyze_run streams attn_logits in chunks of windows (a chunk of 2 windows here) and
    writes the numpy scores per (layer, head); their layer and run rows are head means."""
    from synth import ingest_synthetic, make_info, make_run_arrays, softmax

    from attnbase.metrics import HEAD_TYPES
    from attnbase.stats import layer_parts
    from attnbase.stats.analyze import analyze_run

    info = make_info(n_layers=2, n_heads=2, d_head=8, causal=True)
    keys, logits = make_run_arrays(info, n_seqs=5, T=12, sink_layers=(1,), sink_logit=4.0)
    ingest_synthetic(db, "t", info, keys, logits)
    monkeypatch.setattr(layer_parts, "TAXONOMY_CHUNK_BYTES", 2 * 2 * 12 * 12 * 8)
    run = analyze_run(db, "t", draws=5, gauss_draws=20, seed=1, n_boot=50)
    tokens = np.zeros((5, 12), dtype=np.int32)  # synth stores token 0 everywhere
    expect = taxonomy_means(taxonomy_sums(softmax(logits.astype(np.float64)), tokens))
    with db.connect(read_only=True) as con:
        for name in HEAD_TYPES:
            got = np.array(con.execute("SELECT value FROM head_metrics WHERE run_id = 't' AND "
                                       "metric = ? ORDER BY layer, head", [name]).fetchall())
            np.testing.assert_allclose(got.reshape(2, 2), expect[name], rtol=1e-9, err_msg=name)
            assert run[name] == pytest.approx(expect[name].mean(), rel=1e-9)


@pytest.mark.slow  # ~3 s: an analysis of a synthetic run
def test_sink_rate_is_the_share_of_heads_over_eps(db):
    """Gu et al.'s Sink_1^eps per layer and run (docs/metrics.md §3b) from the same attention as
    numpy; negative control: with eps above every head's sink mass it is 0, and the run's value
    is the fraction of all (layer, head)."""
    from synth import ingest_synthetic, make_info, make_run_arrays, softmax

    from attnbase.metrics import N
    from attnbase.stats.analyze import analyze_run

    info = make_info(n_layers=3, n_heads=4, d_head=8, causal=True)
    keys, logits = make_run_arrays(info, n_seqs=4, T=16, sink_layers=(1, 2), sink_logit=4.0)
    ingest_synthetic(db, "s", info, keys, logits)
    sink = softmax(logits.astype(np.float64))[..., 0].mean((-2, -1))  # (layer, head)
    assert (sink > 0.3).any() and not (sink > 0.3).all()  # the test means something
    for eps in (0.3, 0.999):
        run = analyze_run(db, "s", draws=5, gauss_draws=20, seed=1, n_boot=50, sink_eps=eps)
        with db.connect(read_only=True) as con:
            layer = [v for (v,) in con.execute(
                "SELECT value FROM layer_metrics WHERE run_id = 's' AND metric = ? "
                "ORDER BY layer", [N.sink_rate]).fetchall()]
        np.testing.assert_allclose(layer, (sink > eps).mean(-1), rtol=1e-12)
        assert run[N.sink_rate] == pytest.approx((sink > eps).mean(), rel=1e-12)
        assert run[N.sink_rate_eps] == eps
    assert run[N.sink_rate] == 0.0
