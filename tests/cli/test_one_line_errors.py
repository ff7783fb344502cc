"""Damaged or hostile inputs of the commands: one line on stderr and exit 2, never a traceback
(issue 44, "One line, never a traceback")."""

from __future__ import annotations

import errno
import os

import pytest

EXTRACT = ("extract", "--model", "tiny-gpt2", "--run", "x", "--seqs", "2", "--seq-len", "16",
           "-q")


def _one_line(code, out, err, needle):
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert needle in err, err


def test_negative_seed_is_one_line(cli, tmp_path):
    """Before: numpy's ValueError as a traceback, exit 1."""
    _one_line(*cli(*EXTRACT, "--db", tmp_path / "db", "--seed", "-1"),
              "error: --seed must be >= 0, got -1")
    _one_line(*cli(*EXTRACT, "--db", tmp_path / "db", "--init", "random", "--init-seed", "-3"),
              "--init-seed must be >= 0, got -3")
    assert not (tmp_path / "db").exists()  # refused before any work
    from attnbase.extract.config import ExtractConfig

    assert ExtractConfig(model="tiny-gpt2", seed=0, init_seed=0).seed == 0  # control


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """tiny-gpt2 saved as a model directory, and damaged copies of it."""
    import json
    import shutil

    from attnbase.extract import load_model

    root = tmp_path_factory.mktemp("models")
    lm = load_model("tiny-gpt2", dtype="float32", device="cpu")
    lm.model.save_pretrained(root / "good")
    lm.tokenizer.save_pretrained(root / "good")
    weights = (root / "good" / "model.safetensors").read_bytes()
    for kind in ("unknown", "empty", "truncated", "random"):
        shutil.copytree(root / "good", root / kind)
    cfg = json.loads((root / "unknown" / "config.json").read_text())
    (root / "unknown" / "config.json").write_text(json.dumps({**cfg, "model_type": "no-such"}))
    (root / "empty" / "model.safetensors").write_bytes(b"")
    (root / "truncated" / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    (root / "random" / "model.safetensors").write_bytes(os.urandom(len(weights)))
    return root


@pytest.mark.parametrize("kind, needle", [
    ("unknown", "model_type 'no-such' has no modeling file in this transformers"),
    ("empty", "its weights file (model.safetensors) cannot be read"),
    ("truncated", "it is empty, truncated or damaged: copy or download it again"),
    ("random", "its weights file (model.safetensors) cannot be read"),
])
def test_damaged_model_directory_is_one_line(cli, tmp_path, model_dirs, kind, needle):
    """Before: AutoConfig's list of every model type (unknown) or safetensors'
    SafetensorError as a traceback, exit 1."""
    args = [a if a != "tiny-gpt2" else str(model_dirs / kind) for a in EXTRACT]
    _one_line(*cli(*args, "--db", tmp_path / "db"), needle)
    assert not (tmp_path / "db").exists()


def test_intact_model_directory_extracts(cli, tmp_path, model_dirs):
    args = [a if a != "tiny-gpt2" else str(model_dirs / "good") for a in EXTRACT]
    code, out, err = cli(*args, "--db", tmp_path / "db")
    assert code == 0, err


def test_unwritable_database_directory_is_one_line(cli):
    """/sys (sysfs) refuses a new directory to anyone, root included. Before: PermissionError
    as a traceback, exit 1."""
    _one_line(*cli(*EXTRACT, "--db", "/sys/attnbase-test-db"),
              "/sys/attnbase-test-db; choose a directory you can write")


@pytest.mark.parametrize("code, needle", [
    (errno.EROFS, "choose a directory on a writable file system"),
    (errno.ENOSPC, "the disk is full: free some space and run the command again"),
    (errno.EACCES, "choose a directory you can write"),
])
def test_os_refusals_named(code, needle):
    from attnbase.cli import _unwritable

    err = _unwritable(OSError(code, os.strerror(code), "/d/reports/r/report.html"))
    assert needle in str(err) and "/d/reports/r/report.html" in str(err)
    assert _unwritable(OSError(errno.ENOENT, "No such file", "/x")) is None  # control


def test_empty_image_folder_names_images(cli, tmp_path):
    """Before: an image model's empty folder was said to hold "no .txt files"."""
    (tmp_path / "imgs").mkdir()
    _one_line(*cli("extract", "--model", "tiny-vit", "--run", "v", "--seqs", "2", "-q",
                   "--corpus", tmp_path / "imgs", "--db", tmp_path / "db"),
              "holds no .txt files (text) and no .png/.jpg/.jpeg images; add some")


def test_sql_memory_limit_names_its_setting(cli, fake_db):
    """DuckDB's own text advised a PRAGMA the sandbox refuses; now the limit and the settings
    that raise it."""
    code, out, err = cli("sql", "--db", fake_db.path, "--memory-mb", "400",
                         "select count(*) from (select distinct range from range(60000000))")
    _one_line(code, out, err, "query stopped at its memory limit of 400 MB")
    assert "--memory-mb" in err and "sql_memory_mb" in err and "PRAGMA" not in err
    code, out, err = cli("sql", "--db", fake_db.path, "--memory-mb", "400", "-f", "csv",
                         "select count(*) as n from (select distinct range from range(1000))")
    assert code == 0 and out == "n\n1000\n"  # control
