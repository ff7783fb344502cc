"""Quiet, scriptable output: full values when piped, --format, nested CSV values, DuckDB's hints,
no third-party progress bars unless --verbose, flags without placeholders in --help."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest
from cli_paths import ATTNBASE

LONG = "minilm-default-weights-of-a-run-name-longer-than-eighty-columns-" + "x" * 30


@pytest.fixture
def two_runs(tmp_path):
    """A database with an extraction run (long id) and a weights-only run."""
    from fakes import fake_batches, fake_config, fake_info

    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database

    db = Database(tmp_path / "db")
    info, cfg = fake_info(), fake_config()
    ingest_batches(db, LONG, cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    with db.transaction() as con:  # a weights-only run as `attnbase weights` registers it
        con.execute("INSERT INTO runs SELECT * REPLACE ('w-only' AS run_id, '(weights)' AS corpus, "
                    "0 AS n_seqs, 0 AS seq_len) FROM runs WHERE run_id = ?", [LONG])
    return db


def _piped(*args, env=None):
    """The console script with stdout and stderr piped (not a terminal), in an environment
    without the switches an in-process ``cli`` call of this session may have set."""
    from attnbase._quiet import QUIET_ENV

    clean = {k: v for k, v in os.environ.items() if k not in QUIET_ENV}
    return subprocess.run([str(ATTNBASE), *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**clean, **(env or {})})


def test_runs_csv_and_json_hold_full_values_and_label_weights_runs(cli, two_runs):
    code, out, err = cli("runs", "--db", two_runs.path, "--format", "csv")
    assert code == 0, err
    rows = {r["run_id"]: r for r in csv.DictReader(io.StringIO(out))}
    assert set(rows) == {LONG, "w-only"}
    assert rows[LONG]["kind"] == "extraction" and rows[LONG]["batches_done"] == "3"
    assert rows["w-only"]["kind"] == "weights"
    code, out, _ = cli("runs", "--db", two_runs.path, "--format", "json")
    assert {r["run_id"] for r in json.loads(out)} == {LONG, "w-only"}
    code, _, err = cli("runs", "--db", two_runs.path, "--format", "xml")
    assert code == 2 and "unknown --format 'xml'" in err


def test_piped_tables_are_not_truncated(two_runs):
    p = _piped("runs", "--db", two_runs.path)
    assert p.returncode == 0, p.stderr
    assert LONG in p.stdout and "…" not in p.stdout
    line = next(ln for ln in p.stdout.splitlines() if "w-only" in ln)
    assert "weights only" in line and "0/0" not in line and "0 x 0" not in line
    assert "torch" not in line and "?" not in line  # no device or versions it never had


def test_sql_csv_writes_nested_values_as_json_and_keeps_duckdb_hints(cli, two_runs):
    from attnbase.stats.studies import write_study

    write_study(two_runs, "reversal", [LONG, "w-only"], {"seed": 0}, {"reversal_rate/js": 0.2})
    code, out, err = cli("sql", "--db", two_runs.path, "--format", "csv",
                         "select * from studies")
    assert code == 0 and "Traceback" not in err, err
    row = next(csv.DictReader(io.StringIO(out)))
    assert json.loads(row["run_ids"]) == [LONG, "w-only"] and json.loads(row["params"]) == {"seed": 0}
    code, _, err = cli("sql", "--db", two_runs.path, "select layr from runs")
    assert code == 2 and err.count("\n") == 1
    assert "Candidate bindings" in err and "n_layers" in err


def test_help_has_no_bool_placeholders():
    p = _piped("study", "distances", "--help", env={"COLUMNS": "120"})
    assert p.returncode == 0 and "--quiet" in p.stdout and "<bool>" not in p.stdout
    assert "<int>" in p.stdout  # options that take a value still show its type


@pytest.mark.slow
def test_piped_extract_shows_no_loading_weights_bar_unless_verbose(tmp_path):
    """A local model directory is loaded with from_pretrained, which draws transformers'
    ``Loading weights`` bar; --verbose is the positive control that the bar exists."""
    from transformers import AutoModel

    from attnbase.extract.models import _tiny_config, tiny_tokenizer

    tok = tiny_tokenizer()
    model_dir = tmp_path / "tiny-local"
    AutoModel.from_config(_tiny_config("tiny-gpt2", len(tok), tok.bos_token_id,
                                       tok.eos_token_id)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    base = ["extract", "--db", tmp_path / "db", "--model", model_dir, "--corpus", "default",
            "--seqs", 2, "--seq-len", 8]
    quiet = _piped(*base, "--run", "q")
    assert quiet.returncode == 0, quiet.stderr
    assert "Loading weights" not in quiet.stdout + quiet.stderr
    assert "━" not in quiet.stderr  # nor attnbase's own bar: bars are for a terminal
    assert "run 'q' complete" in quiet.stdout
    loud = _piped("--verbose", *base, "--run", "v")
    assert loud.returncode == 0, loud.stderr
    assert "Loading weights" in loud.stdout + loud.stderr


@pytest.mark.slow
def test_quiet_silences_the_gguf_dequantisation_bar():
    """transformers draws its GGUF tensor loop with tqdm directly (no hub switch): after
    quiet_third_party() that loop draws nothing; without it (negative control) it does."""
    from attnbase._quiet import QUIET_ENV

    loop = ("from transformers import modeling_gguf_pytorch_utils as g\n"
            "for _ in g.tqdm(range(50), desc='Converting and de-quantizing GGUF tensors...'):\n"
            "    pass\n")
    clean = {k: v for k, v in os.environ.items() if k not in QUIET_ENV}
    quiet = subprocess.run([sys.executable, "-c", "from attnbase._quiet import quiet_third_party;"
                            " quiet_third_party()\n" + loop], capture_output=True, text=True,
                           env=clean, timeout=120)
    loud = subprocess.run([sys.executable, "-c", loop], capture_output=True, text=True, env=clean,
                          timeout=120)
    assert quiet.returncode == loud.returncode == 0, quiet.stderr + loud.stderr
    assert "de-quantizing" in loud.stderr and "de-quantizing" not in quiet.stderr
