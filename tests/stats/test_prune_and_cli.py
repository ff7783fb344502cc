"""Head masks through the model's attention path, ``study prune`` and the study CLI (tiny-gpt2)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from attnbase.errors import ExtractError


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.warehouse import Database

    db = Database(tmp_path_factory.mktemp("prune") / "db")
    cfg = ExtractConfig(model="tiny-gpt2", corpus="default", n_seqs=4, seq_len=24, batch_size=4,
                        capture=("logits",), device="cpu")
    extract_run(db, "t", cfg, progress=False)
    return db


def test_head_mask_zeroes_exactly_the_masked_heads_before_the_output_projection():
    from attnbase.extract import load_model
    from attnbase.extract.surgery import head_mask, output_projection

    lm = load_model("tiny-gpt2", device="cpu", attn_implementation="eager")
    ids = torch.arange(1, 17)[None]
    seen = {}
    hook = output_projection(lm, 1).register_forward_pre_hook(
        lambda m, a: seen.__setitem__("x", a[0].detach().clone()))
    try:
        with torch.no_grad():
            out0 = lm.model(input_ids=ids).last_hidden_state
            x0 = seen["x"]
            with head_mask(lm, [(1, 2)]):
                out1 = lm.model(input_ids=ids).last_hidden_state
            x1 = seen["x"]
            out2 = lm.model(input_ids=ids).last_hidden_state
    finally:
        hook.remove()
    d = lm.info.d_head
    # the hook registered first sees the input before the mask: compare through the output
    assert torch.equal(x0, x1)  # layer 1's heads are computed by the model itself, unchanged
    assert not torch.allclose(out0, out1)
    assert torch.equal(out0, out2)  # the mask is gone after the with block
    with torch.no_grad(), head_mask(lm, [(1, 2)]):
        proj = output_projection(lm, 1)
        masked = proj(x0)  # through the pre-hook: head 2's features zeroed
    manual = x0.clone()
    manual[..., 2 * d: 3 * d] = 0
    with torch.no_grad():
        np.testing.assert_allclose(masked.numpy(), proj(manual).numpy(), atol=1e-6)
    with pytest.raises(ExtractError, match="does not exist"):
        with head_mask(lm, [(9, 0)]):
            pass


def test_prune_study_on_tiny_gpt2(tiny_run):
    from attnbase.studies.prune import held_out_windows, prune_study
    from attnbase.extract import load_model
    from attnbase.stats import studies
    from attnbase.warehouse.runs.store import RunStore

    db = tiny_run
    studies.distances_study(db, "t", dissimilarities=("js", "aitchison", "aitchison_perp"))
    lm = load_model("tiny-gpt2", device="cpu")
    held = held_out_windows(db, "t", lm, 3)
    used = RunStore(db.store_path("t"), "t").read("tokens")
    assert not ({r.tobytes() for r in held} & {r.tobytes() for r in used})
    sid, table, metric = prune_study(db, "t", "tiny-gpt2", fractions=(0.25, 0.5), eval_seqs=3,
                                     random_seeds=2, device="cpu")
    assert metric == "perplexity" and table["base"] > 1
    assert set(table["rows"]) == {"js", "aitchison", "aitchison_perp", "random"}
    with db.connect(read_only=True) as con:
        got = dict(con.execute("SELECT key, value FROM study_results WHERE study_id = ?",
                               [sid]).fetchall())
    assert got["ppl/none"] == pytest.approx(table["base"])
    assert got["ppl/js/0.5"] == pytest.approx(table["rows"]["js"][1])
    assert "ppl_sd/random/0.25" in got


def test_study_cli_prints_tables_and_one_line_errors(tiny_run, monkeypatch, capsys):
    from attnbase.cli import main

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["attnbase", "study", *map(str, args)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as ex:
            code = ex.code
        out = capsys.readouterr()
        return code, out.out, out.err

    db = tiny_run.path
    code, out, _ = run("distances", "--db", db, "--run", "t", "--quiet")
    assert code == 0 and "aitchison_perp" in out and "study distances-t-" in out
    code, out, _ = run("reversal", "--db", db, "--run", "t")
    assert code == 0 and "exact" in out and "js" in out
    code, out, _ = run("clusters", "--db", db, "--run", "t", "--preset", "clark", "--draws", "49")
    assert code == 0 and "ARI" in out
    code, out, _ = run("paths", "--db", db, "--run", "t", "--draws", 3, "--format", "csv")
    head, *rows = out.strip().splitlines()
    assert code == 0 and head.startswith("length,n,ratio_mean,ratio_sd,") and len(rows) == 4
    code, out, _ = run("paths", "--db", db, "--run", "t", "--draws", 3)
    assert code == 0 and "ratio_median" in out and "{" not in out  # a table, not a dict
    # prune reads the model from the run (no --model)
    code, out, _ = run("prune", "--db", db, "--run", "t", "--fractions", "0.25", "--rankings",
                       "js", "--eval-seqs", 2, "--random-seeds", 1)
    assert code == 0 and "unpruned" in out and "25%" in out
    code, out, _ = run("entropy", "--db", db, "--run", "t", "--layers", "0,3")
    assert code == 0 and "sink share" in out
    code, _, err = run("entropy", "--db", db, "--runs", "t")
    assert code == 2 and err.count("\n") == 1 and "two runs" in err
    code, _, err = run("clusters", "--db", db, "--run", "t", "--preset", "nope")
    assert code == 2 and "clark" in err
