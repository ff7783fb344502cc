"""Pipeline TOML validation: the example parses; every mistake is one line naming key and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbase.flows.config import load_pipeline_config, parse_pipeline_config, run_id_for
from attnbase.flows.errors import PipelineConfigError
from attnbase.stats.defaults import NULL_DRAWS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline.toml"


def test_example_pipeline_parses_into_shards():
    cfg = load_pipeline_config(EXAMPLE)
    assert cfg.models == ("minilm", "tiny-llama") and cfg.corpora == ("default",)
    assert (cfg.seqs, cfg.seq_len, cfg.task_runner) == (16, 64, "local")
    shards = cfg.shards()
    assert [r for r, _ in shards] == ["minilm-default", "tiny-llama-default"]
    assert all(c.n_seqs == 16 and c.seq_len == 64 and c.device == "cpu" for _, c in shards)


def test_defaults_and_product_of_models_and_corpora():
    cfg = parse_pipeline_config({"models": ["a", "b"], "corpora": ["x.txt", "dir/y.jsonl"],
                                 "run_prefix": "n-", "task_runner": "dask", "workers": 3})
    assert [r for r, _ in cfg.shards()] == ["n-a-x", "n-a-y", "n-b-x", "n-b-y"]
    assert cfg.batch_size == 8 and cfg.draws == NULL_DRAWS and cfg.workers == 3


def test_run_ids_are_catalog_safe():
    assert run_id_for("/models/My Model/", "default") == "My_Model-default"


@pytest.mark.parametrize("data, key, fix", [
    ({"models": ["m"], "seq_length": 64}, "seq_length", "did you mean 'seq_len'"),
    ({"corpora": ["default"]}, "models", 'models = ["minilm", "tiny-llama"]'),
    ({"models": ["m"], "seqs": "16"}, "seqs", "write seqs = 16"),
    ({"models": ["m"], "seqs": 0}, "seqs", "must be >= 1"),
    ({"models": ["m"], "seq_len": 2}, "seq_len", "must be >= 4"),
    ({"models": ["m"], "workers": True}, "workers", "write workers = 2"),
    ({"models": "minilm"}, "models", "must be a list"),
    ({"models": []}, "models", "non-empty list"),
    ({"models": ["m", "m"]}, "models", "twice"),
    ({"models": ["m"], "dtype": "float8"}, "dtype", "float32"),
    ({"models": ["m"], "capture": ["keys", "values"]}, "capture", "'values'"),
    ({"models": ["m"], "task_runner": "ray"}, "task_runner", 'task_runner = "local"'),
    ({"models": ["m"], "report": "yes"}, "report", "report = true"),
    ({"models": ["m"], "report_dir": "reports"}, "report_dir", 'report_dir = "/shared/reports"'),
    ({"models": ["a/m", "b/m"]}, "m-default", "rename"),
])
def test_bad_values_give_one_line_naming_key_and_fix(data, key, fix):
    with pytest.raises(PipelineConfigError) as ei:
        parse_pipeline_config(data, source="p.toml")
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("p.toml: ")
    assert f"'{key}'" in msg and fix in msg


def test_bad_toml_syntax_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('models = ["minilm"\n')
    with pytest.raises(PipelineConfigError, match=r"bad.toml: not valid TOML"):
        load_pipeline_config(bad)
    with pytest.raises(PipelineConfigError, match=r"does not exist; pass --config"):
        load_pipeline_config(tmp_path / "nope.toml")


def test_flow_extraction_checks_every_shard_before_loading_or_registering(tmp_path):
    """A missing corpus in any shard fails the flow's extraction at once with one line, before a
    model loads or a run is registered (the runner is never used)."""
    from attnbase.errors import AttnbaseError
    from attnbase.extract.config import ExtractConfig
    from attnbase.flows.extract import extract_runs

    good = ExtractConfig(model="tiny-gpt2", corpus="default", n_seqs=2, seq_len=16)
    bad = ExtractConfig(model="tiny-gpt2", corpus=str(tmp_path / "missing.txt"), n_seqs=2,
                        seq_len=16)
    with pytest.raises(AttnbaseError) as err:
        extract_runs(None, str(tmp_path / "db"), [("a", good), ("b", bad)])
    assert "\n" not in str(err.value) and "missing.txt" in str(err.value)
    assert not (tmp_path / "db").exists()


def test_pipeline_database_is_absolute_and_a_team_address_runs_report_and_studies(tmp_path,
                                                                                  monkeypatch):
    """A directory is sent made absolute, an address as is, with its report and studies
    (tests/team/test_team_pipeline.py runs them)."""
    from attnbase.flows.config import pipeline_database

    monkeypatch.chdir(tmp_path)
    url = "postgresql://team@db.example.org:5432/attnbase"
    cfg = parse_pipeline_config({"models": ["tiny-gpt2"], "db": "rel"}, source="p.toml")
    assert pipeline_database(cfg) == str(tmp_path / "rel")
    assert pipeline_database(cfg, "other") == str(tmp_path / "other")
    assert cfg.report and pipeline_database(cfg, url) == url  # report = true by default
    studies = parse_pipeline_config({"models": ["tiny-gpt2"], "studies": ["distances"],
                                     "report_dir": str(tmp_path / "out")}, source="p.toml")
    assert pipeline_database(studies, url) == url and studies.report_dir == str(tmp_path / "out")
