"""``attnbase extract`` end to end with the real extraction stage."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from cli_paths import ATTNBASE

from attnbase.warehouse import Database, open_run, read_sql


def one_line_error(code, out, err):
    assert code != 0
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.mark.slow  # 6-17 s: run by `make test-slow`
def test_minilm_demo_fills_catalog(cli, tmp_path):
    db = tmp_path / "db"
    code, out, err = cli("extract", "--db", db, "--model", "minilm", "--corpus", "default",
                         "--seqs", 8, "--seq-len", 64, "--run", "demo", "-q")
    assert code == 0, err
    assert "run 'demo' complete" in out
    n = read_sql(db, "SELECT count(*) AS n FROM row_stats WHERE run_id = 'demo'")["n"][0]
    assert n == 6 * 12 * 8 * 64
    sink = read_sql(db, "SELECT avg(sink_mass) AS m FROM row_stats WHERE layer BETWEEN 1 AND 4")
    assert sink["m"][0] > 10 * (1 / 64)  # a [CLS] sink: far above uniform attention
    info = Database(db).run_info("demo")
    assert (info["family"], info["n_layers"], info["n_heads"], info["d_head"]) == ("bert", 6, 12, 32)
    assert info["status"] == "complete" and info["sink_token"] == "[CLS]"
    ds = open_run(db, "demo")
    assert ds["attn_logits"].shape == (6, 12, 8, 64, 64)
    assert np.isfinite(ds["attn_logits"][0, 0, 0].values).all()  # BERT: no mask within windows
    code, out, _ = cli("runs", "--db", db)
    assert "demo" in out and "2/2" in out


def test_complete_run_not_recomputed_and_conflict(cli, tmp_path):
    db = tmp_path / "db"
    args = ["extract", "--db", db, "--model", "tiny-gpt2", "--seqs", 4, "--seq-len", 16,
            "--batch-size", 2, "--run", "t", "-q"]
    assert cli(*args)[0] == 0
    mtimes = {p: p.stat().st_mtime_ns for p in (db / "runs" / "t").rglob("*") if p.is_file()}
    code, out, _ = cli(*args)
    assert code == 0 and "already complete" in out
    assert mtimes == {p: p.stat().st_mtime_ns for p in (db / "runs" / "t").rglob("*") if p.is_file()}
    # same name, another configuration
    before = read_sql(db, "SELECT * FROM runs")
    code, out, err = cli(*args[:-3], "--seed", 1, "--run", "t", "-q")
    one_line_error(code, out, err)
    assert "already exists with a different configuration" in err and "--overwrite" in err
    assert read_sql(db, "SELECT * FROM runs").equals(before)
    code, out, err = cli(*args[:-3], "--seed", 1, "--run", "t", "-q", "--overwrite")
    assert code == 0, err
    assert json.loads(Database(db).run_info("t")["config"])["seed"] == 1


def _bad_model_dir(tmp_path):
    d = tmp_path / "mpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "mpt"}))
    return d


def _short_corpus(tmp_path):
    p = tmp_path / "short.txt"
    p.write_text("just a few words here.")
    return p


ERRORS = {
    "unknown alias": (lambda tp: ["--model", "gpt-17"], "gpt-17"),
    "missing model path": (lambda tp: ["--model", str(tp / "no" / "such" / "model")], "does not exist"),
    "unsupported architecture": (lambda tp: ["--model", str(_bad_model_dir(tp))],
                                 "does not go through the attention interface"),
    "corpus too short": (lambda tp: ["--model", "tiny-gpt2", "--corpus", str(_short_corpus(tp))],
                         "window"),
    "bad capture name": (lambda tp: ["--model", "tiny-gpt2", "--capture", "keys,values"], "values"),
    "bad run name": (lambda tp: ["--model", "tiny-gpt2", "--run", "../up"], "invalid run name"),
}


@pytest.mark.parametrize("case", list(ERRORS))
@pytest.mark.parametrize("db_exists", [False, True])
def test_errors_are_one_line_and_write_nothing(cli, tmp_path, fake_db, case, db_exists):
    make_args, needle = ERRORS[case]
    db = fake_db.path if db_exists else tmp_path / "fresh"
    args = make_args(tmp_path)
    if "--run" not in args:
        args += ["--run", "x"]
    code, out, err = cli("extract", "--db", db, "--seqs", 8, "--seq-len", 64, "-q", *args)
    one_line_error(code, out, err)
    assert needle in err
    if db_exists:
        assert read_sql(db, "SELECT run_id FROM runs")["run_id"].to_list() == ["r1"]
        assert sorted(p.name for p in (db / "runs").iterdir()) == ["r1"]
    else:
        assert not db.exists()


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted(tmp_path):
    """SIGKILL after batch 1 (ATTNBASE_CRASH_AFTER_BATCH), re-run: identical to one clean run."""
    base = [str(ATTNBASE), "extract", "--model", "tiny-gpt2", "--seqs", 10, "--seq-len", 32,
            "--batch-size", 2, "--run", "k", "-q"]
    base = list(map(str, base))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    p = subprocess.run(base + ["--db", str(clean)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(base + ["--db", str(crashed)], env={**env, "ATTNBASE_CRASH_AFTER_BATCH": "1"},
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == -9, p.stderr  # SIGKILL
    status = read_sql(crashed, "SELECT status FROM batches ORDER BY batch")["status"].to_list()
    assert status == ["complete", "complete", "pending", "pending", "pending"]
    assert Database(crashed).run_info("k")["status"] == "running"
    p = subprocess.run(base + ["--db", str(crashed)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "3/5 batches written this time" in p.stdout
    a, b = open_run(clean, "k"), open_run(crashed, "k")
    assert sorted(a.data_vars) == sorted(b.data_vars)
    for name in a.data_vars:
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
    q = ("SELECT count(*) AS n, count(DISTINCT (layer, head, seq, query)) AS d, "
         "sum(sink_mass) AS s FROM row_stats")
    ra, rb = read_sql(clean, q), read_sql(crashed, q)
    info = Database(clean).run_info("k")
    rows = info["n_layers"] * info["n_heads"] * 10 * 32
    assert rb["n"][0] == rb["d"][0] == ra["n"][0] == rows  # no duplicates
    assert rb["s"][0] == pytest.approx(ra["s"][0], rel=1e-12)
    assert read_sql(crashed, "SELECT count(*) AS n FROM col_stats")["n"][0] == ra["n"][0]
