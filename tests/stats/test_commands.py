"""`attnbase analyze` / `attnbase table1` on a synthetic run (fast: no model), and the stats migration."""

from synth import ingest_synthetic, make_info, make_run_arrays
from typer.testing import CliRunner

from attnbase.cli import app


def test_stats_migration_creates_the_views(db):
    with db.connect() as con:
        versions = {v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
        views = {v for (v,) in con.execute("SELECT view_name FROM duckdb_views() "
                                           "WHERE NOT internal").fetchall()}
        assert con.execute("SELECT count(*) FROM table1").fetchone()[0] == 0
    assert 100 in versions
    assert {"head_summary", "table1"} <= views


def test_analyze_and_table1_commands(db):
    info = make_info(n_layers=3, n_heads=2, d_head=8, causal=True)
    keys, logits = make_run_arrays(info, n_seqs=4, T=12, sink_layers=(1, 2), sink_logit=5.0)
    ingest_synthetic(db, "a", info, keys, logits)
    ingest_synthetic(db, "b", info, keys[:, :, :2], logits[:, :, :2], batch_size=2)
    runner = CliRunner()
    res = runner.invoke(app, ["table1", "--db", str(db.path)])
    assert res.exit_code == 0 and "no analysed runs" in res.output, res.output
    for run in ("a", "b"):
        res = runner.invoke(app, ["analyze", "--db", str(db.path), "--run", run, "--draws", "3",
                                  "--gauss-draws", "10", "--seed", "1", "--threshold", "0.3",
                                  "--no-progress"])
        assert res.exit_code == 0, res.output
        rows = res.output.split("analysed ")[0].splitlines()
        assert any(r.startswith("onset layer ") and r.endswith(" 1") for r in rows), rows
        # the values form one column: each starts after the longest label and two spaces
        starts = {len(r) - len(r.split("  ")[-1].lstrip()) for r in rows}
        assert len(starts) == 1 and len(rows) >= 10, rows
    res = runner.invoke(app, ["table1", "--db", str(db.path)])
    assert res.exit_code == 0, res.output
    header = next(line for line in res.output.splitlines() if " a " in line and " b " in line)
    assert header  # runs side by side, one column each
    assert "VE@8 shuffle null" in res.output and "synthetic" in res.output
    with db.connect(read_only=True) as con:
        got = dict(con.execute("SELECT metric, value FROM run_metrics WHERE run_id = 'a' AND "
                               "metric IN ('draws', 'gauss_draws', 'seed', 'onset_threshold')")
                   .fetchall())
    assert got == {"draws": 3, "gauss_draws": 10, "seed": 1, "onset_threshold": 0.3}


def test_analyze_unknown_run_is_one_line_error(db, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    db.migrate()
    exe = Path(sys.executable).parent / "attnbase"
    res = subprocess.run([str(exe), "analyze", "--db", str(db.path), "--run", "zz"],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: no run 'zz'")
