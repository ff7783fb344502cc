"""examples/paper-sink-emergence.toml (Gu et al.'s Sink_1^eps rows, docs/metrics.md §3b):
the offline dry run exits 0 with the twelve runs' plan and lists what is missing (the four hub
checkpoints), never the built-in probes."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbase.flows.plan import missing_corpus

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "paper-sink-emergence.toml"
HUB = ("openai-community/gpt2-xl", "mistralai/Mistral-7B-v0.1", "meta-llama/Llama-2-7b-hf",
       "meta-llama/Meta-Llama-3-8B")


def test_a_probe_is_never_a_missing_corpus(tmp_path):
    assert missing_corpus("probe:random") is None
    assert missing_corpus("probe:repeat-token") is None
    # negative control: a file of a probe-like name that is not there is missing
    assert missing_corpus(str(tmp_path / "probe-random.txt")).startswith("corpus ")


@pytest.mark.slow
def test_sink_emergence_example_plans_offline_and_lists_what_is_missing(cli, tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("flow", "run", "--config", EXAMPLE, "--dry-run")
    assert code == 0, err
    assert "12 run(s)" in out
    for model in HUB:
        for corpus in ("default", "probe_random", "probe_repeat-token"):
            assert f"{model.split('/')[1]}-{corpus}" in out
    assert out.count("100 x 64, float32, bos auto") == 12
    missing = out[out.index("missing:"):]
    assert "4 hub model(s) not in the local HF cache" in missing
    assert all(m in missing for m in HUB)
    assert "probe:" not in missing and "not found" not in missing  # the probes are built in
    assert not (tmp_path / "attnbase-sinks-db").exists()  # a dry run writes nothing
