"""A weights-only run asked for what needs activations: one line that says it is weights only
and what it supports, exit 2, never advice to re-extract it."""

from __future__ import annotations

import pytest

ASKS = [("analyze",), ("study", "distances"), ("study", "reversal"), ("study", "paths"),
        ("study", "r-conventions")]


@pytest.fixture(scope="module")
def weights_db(tmp_path_factory):
    """Run 'w' made by `attnbase weights`; run 'x' an extraction of hidden states only (no keys)."""
    import shutil

    from attnbase.studies.weights import weights_run
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.warehouse import Database

    db = Database(tmp_path_factory.mktemp("w") / "db")
    weights_run(db, "w", "tiny-gpt2")
    extract_run(db, "x", ExtractConfig(model="tiny-gpt2", corpus="default", n_seqs=2, seq_len=8,
                                       batch_size=2, device="cpu", capture=("hidden",)),
                progress=False)
    return db.path


@pytest.mark.parametrize("ask", ASKS, ids=[" ".join(a) for a in ASKS])
def test_weights_only_run_is_named_with_what_it_supports(cli, weights_db, ask):
    code, _, err = cli(*ask, "--db", weights_db, "--run", "w")
    assert code == 2 and err.count("\n") == 1, err
    assert "run 'w' is weights only" in err and "attnbase report --run w" in err
    assert "--overwrite" not in err and "re-extract" not in err and "--capture" not in err
    assert f"attnbase extract --db {weights_db} --model tiny-gpt2" in err


def test_an_extraction_run_without_arrays_keeps_its_own_error(cli, weights_db):
    """Negative control: run 'x' is no weights run; its error is about its missing arrays."""
    code, _, err = cli("study", "paths", "--db", weights_db, "--run", "x")
    assert code == 2 and "weights only" not in err and "attn_logits" in err
