"""``attnbase flow run``: one-line config errors, and a run over fake stages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

ATTNBASE = str(Path(sys.executable).with_name("attnbase"))


def test_flow_run_bad_config_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text('models = ["minilm"]\nseq_length = 64\n')
    r = subprocess.run([ATTNBASE, "flow", "run", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "unknown key 'seq_length'; did you mean 'seq_len'?" in r.stderr


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.filterwarnings("ignore:Prefect was imported before attnbase")  # in-process: expected
def test_flow_run_command_runs_the_pipeline(fake_stages, tmp_path):
    from attnbase.cli import app

    cfg = tmp_path / "p.toml"
    cfg.write_text('models = ["m1", "m2"]\nseqs = 4\nbatch_size = 2\n')
    r = CliRunner().invoke(app, ["flow", "run", "--config", str(cfg), "--db", str(tmp_path / "db")])
    assert r.exit_code == 0, r.output
    assert "2 run(s) m1-default, m2-default on the local task runner" in r.output
    assert "report: " in r.output and fake_stages.reports == [("m1-default", ("m2-default",))]
    assert sorted(fake_stages.finished) == ["m1-default", "m2-default"]
