"""``attnbase extract --bos auto|none``: position 0 of a causal LM's windows, recorded in the run."""

from __future__ import annotations

import json

import pytest

from attnbase.extract.config import ExtractConfig
from attnbase.extract.corpus import NO_SINK_TOKEN
from attnbase.warehouse import Database, read_sql
from attnbase.warehouse.runs.store import RunStore


def _tokens(db, run):
    return RunStore(Database(db).store_path(run), run).read("tokens")


@pytest.mark.slow
def test_bos_none_recorded_and_resume_conflict(cli, tmp_path):
    db = tmp_path / "db"
    base = ["extract", "--db", db, "--model", "tiny-gpt2", "--seqs", 3, "--seq-len", 12, "-q"]
    assert cli(*base, "--run", "auto")[0] == 0
    code, out, err = cli(*base, "--run", "none", "--bos", "none")
    assert code == 0, err
    info = {r: Database(db).run_info(r) for r in ("auto", "none")}
    assert info["auto"]["sink_token"] == "<|bos|>" and info["none"]["sink_token"] == NO_SINK_TOKEN
    assert json.loads(info["none"]["config"])["bos"] == "none"
    assert "bos" not in json.loads(info["auto"]["config"])  # auto: the hash of runs before --bos
    auto, none = _tokens(db, "auto"), _tokens(db, "none")
    bos = int(auto[0, 0])
    assert (auto[:, 0] == bos).all() and not (auto[:, 1:] == bos).any()
    assert none.shape == auto.shape and not (none == bos).any()  # 12 text tokens, no BOS
    # resuming with the other --bos is the one-line config conflict naming bos, nothing changed
    before = read_sql(db, "SELECT * FROM runs ORDER BY run_id")
    for run, flag in (("auto", "none"), ("none", "auto")):
        code, out, err = cli(*base, "--run", run, "--bos", flag)
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert "already exists with a different configuration" in err and "bos" in err, err
    assert read_sql(db, "SELECT * FROM runs ORDER BY run_id").equals(before)


def test_bos_none_refused_for_encoders_and_unknown_values(cli, tmp_path):
    code, _, err = cli("extract", "--db", tmp_path / "db", "--model", "minilm", "--run", "m",
                       "--seqs", 2, "--seq-len", 8, "--bos", "none", "-q")
    assert code == 2 and "causal LMs only" in err and "Traceback" not in err
    code, _, err = cli("extract", "--db", tmp_path / "db", "--model", "tiny-gpt2", "--run", "m",
                       "--seqs", 2, "--seq-len", 8, "--bos", "never", "-q")
    assert code == 2 and "--bos" in err and "auto, none" in err
    assert not (tmp_path / "db" / "runs" / "m").exists()


def test_bos_in_hash_only_when_none():
    h = dict(model_revision="r", corpus_hash="c")
    a, n = ExtractConfig(model="x"), ExtractConfig(model="x", bos="none")
    assert "bos" not in a.hash_fields(**h) and n.hash_fields(**h)["bos"] == "none"
    assert a.config_hash(**h) != n.config_hash(**h)
