"""Every argument checkable without the model is checked before the model loads (issue 10):
the load is replaced by a tripwire, so a check that happened after it would fail these tests."""

from __future__ import annotations

import json

import pytest

import attnbase.extract.models as models


@pytest.fixture
def no_load(monkeypatch):
    def tripwire(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(models, "load_model", tripwire)


def _lines(code, out, err):
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


CASES = {
    "seq-len over minilm's 512 positions": (
        lambda tp: ["--model", "minilm", "--seq-len", 1000], "--seq-len 1000 exceeds the 512 positions"),
    "seq-len over the tiny models' positions": (
        lambda tp: ["--model", "tiny-llama", "--seq-len", 513], "--seq-len 513 exceeds the 512"),
    "seqs 0 names --seqs": (lambda tp: ["--model", "minilm", "--seqs", 0], "--seqs must be >= 1"),
    "seq-len 0": (lambda tp: ["--model", "minilm", "--seq-len", 0], "--seq-len must be >= 4 (sink + content rows), got 0"),
    "batch-size 0": (lambda tp: ["--model", "minilm", "--batch-size", 0], "--batch-size must be >= 1"),
    "missing corpus": (lambda tp: ["--model", "minilm", "--corpus", str(tp / "nope.txt")],
                       "does not exist"),
    "empty corpus": (lambda tp: ["--model", "minilm", "--corpus", _write(tp, "e.txt", "")], "is empty"),
    "whitespace corpus": (lambda tp: ["--model", "minilm", "--corpus", _write(tp, "w.txt", " \n\t ")],
                          "is empty"),
    "empty jsonl": (lambda tp: ["--model", "minilm", "--corpus", _write(tp, "e.jsonl", '{"text": ""}\n')],
                    "is empty"),
    "short corpus, minilm tokenizer (exact)": (
        lambda tp: ["--model", "minilm", "--corpus", _write(tp, "s.txt", "a few words.")], "yields only"),
    "short corpus, no cheap tokenizer (bound)": (
        lambda tp: ["--model", _model_dir(tp, {"model_type": "gpt2", "n_positions": 1024}),
                    "--corpus", _write(tp, "s.txt", "a few words.")], "too short"),
    "short corpus, tiny tokenizer (exact)": (
        lambda tp: ["--model", "tiny-gpt2", "--corpus", _write(tp, "s.txt", "word " * 100)],
        "yields only"),
    "unsupported architecture": (
        lambda tp: ["--model", _model_dir(tp, {"model_type": "mpt"})], "'mpt' is not supported"),
    "model dir over its positions": (
        lambda tp: ["--model", _model_dir(tp, {"model_type": "gpt2", "n_positions": 32})],
        "exceeds the 32 positions"),
    "bad dtype": (lambda tp: ["--model", "minilm", "--dtype", "int8"], "unknown --dtype 'int8'"),
    "bad capture": (lambda tp: ["--model", "minilm", "--capture", "values"], "unknown --capture"),
    "bad run name": (lambda tp: ["--model", "minilm", "--run", "../x"], "invalid run name"),
    "a near alias, before any hub talk": (
        lambda tp: ["--model", "minilmm"], "not an alias or a local directory; did you mean "
        "'minilm'?"),
    "an alias cut short": (lambda tp: ["--model", "smollm2"], "did you mean 'smollm2-135m'?"),
}


def _model_dir(tmp_path, config):
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


@pytest.mark.parametrize("case", list(CASES))
def test_checked_before_the_model_loads(cli, tmp_path, no_load, case):
    make, needle = CASES[case]
    args = make(tmp_path)
    if "--run" not in args:
        args += ["--run", "x"]
    db = tmp_path / "db"
    err = _lines(*cli("extract", "--db", db, "-q", "--seq-len", 64, *args))
    assert needle in err, err
    assert not db.exists()  # nothing written, no 'failed' run left behind


def test_valid_request_passes_preflight(tmp_path):
    from attnbase.extract.config import ExtractConfig
    from attnbase.extract.preflight import max_positions, preflight

    preflight(ExtractConfig(model="tiny-gpt2", n_seqs=4, seq_len=32))
    preflight(ExtractConfig(model="minilm", n_seqs=4, seq_len=512))
    assert max_positions({"n_positions": 1024}) == 1024 and max_positions({}) is None
    assert models._TINY_SHAPE["max_pos"] == 512


def test_version_and_one_quiet(cli):
    import attnbase

    code, out, _ = cli("--version")
    assert code == 0 and out == f"attnbase {attnbase.__version__}\n"
    for command in ("extract", "analyze", "verify"):
        code, out, _ = cli(command, "--help")
        assert code == 0 and "--quiet" in out, command
    code, out, _ = cli("analyze", "--help")
    assert "--no-progress" not in out  # kept as a hidden alias only


def test_cli_gc_policy(monkeypatch):
    """While a command runs, full collections are 100x rarer; afterwards the caller's settings
    are back, and the heap is frozen only at process exit (an ``atexit`` hook), so in-process
    callers such as these tests are left as they were."""
    import gc
    import sys

    from attnbase import cli

    seen = []

    def fake_app():
        seen.append(gc.get_threshold())
        raise SystemExit(0)

    before = gc.get_threshold()
    monkeypatch.setattr(cli, "app", fake_app)
    monkeypatch.setattr(sys, "argv", ["attnbase"])
    with pytest.raises(SystemExit):
        cli.main()
    assert seen == [cli.GC_THRESHOLDS] and cli.GC_THRESHOLDS[2] > 10
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0 and cli._EXIT_FREEZE


def test_near_alias_error_is_the_only_line(cli, tmp_path, no_load):
    """Without -q: no ``device:`` line and no word of the hub before the one error line."""
    code, out, err = cli("extract", "--db", tmp_path / "db", "--model", "minilmm", "--run", "x")
    assert code == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert "did you mean 'minilm'?" in err and "hub" not in err and "device" not in err
