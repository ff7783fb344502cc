"""Real-model checks of the compositional studies (slow: extracts MiniLM)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.warehouse import Database

    db = Database(tmp_path_factory.mktemp("real") / "db")
    cfg = ExtractConfig(model="minilm", corpus="default", n_seqs=8, seq_len=48, batch_size=4,
                        capture=("logits",), device="cpu")
    extract_run(db, "m", cfg, progress=False)
    return db


def test_sampled_reversal_agrees_with_exact_enumeration_on_minilm(minilm_run):
    from attnbase.stats import studies

    studies.distances_study(minilm_run, "m")
    _, exact = studies.reversal_study(minilm_run, "m")
    _, sampled = studies.reversal_study(minilm_run, "m", draws=50_000, force_sampled=True)
    for d in studies.COMPARED:
        assert exact[f"reversal_exact/{d}"] == 1.0 and sampled[f"reversal_exact/{d}"] == 0.0
        assert sampled[f"reversal_ci_low/{d}"] <= exact[f"reversal_rate/{d}"] \
            <= sampled[f"reversal_ci_high/{d}"], d
    # the sink matters for the classical dissimilarities of a model with a [CLS] sink
    assert exact["reversal_rate/cosine"] > 0.05


def test_prune_on_minilm_scores_embedding_cosine(minilm_run):
    from attnbase.studies.prune import prune_study

    sid, table, metric = prune_study(minilm_run, "m", "minilm", fractions=(0.1, 0.3),
                                     eval_seqs=4, random_seeds=2, device="cpu")
    assert metric == "pooled-embedding cosine" and table["base"] == pytest.approx(1.0)
    assert all(-1 <= v <= 1 for v in table["rows"]["js"])
