"""End to end on real activations: extract MiniLM, analyse, read Table 1 (~20 s)."""

import pytest
from typer.testing import CliRunner



def test_minilm_extract_analyze_table1(tmp_path):
    from attnbase.cli import app
    from attnbase.warehouse import Database

    db = tmp_path / "st"
    runner = CliRunner()
    res = runner.invoke(app, ["extract", "--db", str(db), "--model", "minilm", "--corpus", "default",
                              "--seqs", "8", "--seq-len", "64", "--run", "m"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["analyze", "--db", str(db), "--run", "m", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "onset layer" in res.output
    res = runner.invoke(app, ["table1", "--db", str(db)])
    assert res.exit_code == 0 and "minilm" in res.output, res.output

    with Database(db).connect(read_only=True) as con:
        row = con.sql("SELECT * FROM table1 WHERE run_id = 'm'").pl().to_dicts()[0]
        sink = con.sql("SELECT layer, value FROM layer_metrics WHERE run_id = 'm' "
                       "AND metric = 'mean_sink_mass' ORDER BY layer").pl()
    assert row["model"] == "minilm" and row["n_layers"] == 6 and row["d_head"] == 32
    # MiniLM's [CLS] sink starts at layer 1 (docs/toolchain.md): that is where the onset must fall
    assert row["onset_layer"] == 1
    assert row["onset_depth"] == pytest.approx(1 / 6)
    assert sink["value"][0] < 0.2 < sink["value"][1]
    assert row["key_norm_cv_baseline"] == pytest.approx(0.125)
    assert row["key_norm_cv"] > row["key_norm_cv_baseline"]  # norm stratification
    assert row["ve_at_8"] > row["ve_shuffle"] > 0 and row["ve_at_8"] > row["ve_gauss"]
    assert -1 <= row["r_cv_share"] <= 1 and 0 <= row["r_cv_share_p"] <= 1
