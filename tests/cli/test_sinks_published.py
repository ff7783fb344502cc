"""``attnbase sinks --published``: Gu et al.'s Sink_1^eps rows (docs/metrics.md §3b), each run of
the database paired with the row of its model and setup, and the runs that are not (negative
controls: another model, probe, window length or eps), each with its reason."""

from __future__ import annotations

import json
import re

import pytest

from attnbase.warehouse.published_sinks import pair_run, published_sink_rows, run_input

#: The issue's numbers (issue 42; Gu et al., ICLR 2025): model -> natural, random, repeat-token.
ISSUE_42 = {"GPT2-XL": (77.00, 70.29, 62.28), "Mistral-7B": (97.49, 75.21, 0.00),
            "LLaMA2-7B": (92.47, 90.13, 0.00), "LLaMA3-8B": (99.02, 91.23, 0.00)}


def test_the_packaged_rows_are_the_papers():
    rows = published_sink_rows()
    got = {}
    for r in rows:
        got.setdefault(r["model"], []).append(r["sink_rate_percent"])
        assert (r["seq_len"], r["eps"]) == (64, 0.3)
        assert "Gu et al." in r["source"] and "ICLR 2025" in r["source"]
    assert {m: tuple(v) for m, v in got.items()} == ISSUE_42
    assert [r["input"] for r in rows[:3]] == ["natural", "random", "repeat-token"]


def test_a_run_of_the_papers_model_and_setup_pairs_with_its_row():
    row, why = pair_run("openai-community/gpt2-xl", "probe:random", 64, 0.3)
    assert why == [] and (row["model"], row["input"], row["sink_rate_percent"]) == \
        ("GPT2-XL", "random", 70.29)
    row, _ = pair_run("meta-llama/Llama-2-7b-hf@main", "data/pile.jsonl", 64, 0.3)
    assert (row["model"], row["input"]) == ("LLaMA2-7B", "natural")
    row, _ = pair_run("gpt2-xl", "probe:repeat-token", 64, 0.3)  # the unprefixed GPT-2 name
    assert row["sink_rate_percent"] == 62.28


@pytest.mark.parametrize("model, corpus, seq_len, eps, reason", [
    ("smollm2-135m", "probe:random", 64, 0.3, "different model"),
    ("openai-community/gpt2", "probe:random", 64, 0.3, "different model"),  # GPT-2 small
    ("openai-community/gpt2-xl", "probe:repeat-random", 64, 0.3, "different probe"),
    ("openai-community/gpt2-xl", "images:sample", 64, 0.3, "different probe"),
    ("openai-community/gpt2-xl", "probe:random", 128, 0.3, "different length"),
    ("openai-community/gpt2-xl", "probe:random", 64, 0.5, "different eps"),
    ("openai-community/gpt2-xl", "probe:random", 64, None, "no sink_rate"),
])
def test_a_run_of_another_model_or_setup_is_not_paired(model, corpus, seq_len, eps, reason):
    row, why = pair_run(model, corpus, seq_len, eps)
    assert row is None and len(why) == 1 and why[0].startswith(reason), why


def test_every_difference_is_named():
    row, why = pair_run("smollm2-135m", "probe:repeat-random", 32, 0.5)
    assert row is None
    assert [w.split(":")[0] for w in why] == ["different model", "different probe",
                                              "different length", "different eps"]
    assert "32 tokens, the paper's are 64" in why[2] and "0.5, the paper's is 0.3" in why[3]


def test_run_input_reads_the_recorded_corpus():
    assert [run_input(c) for c in ("default", "probe:random", "probe:repeat-token",
                                   "probe:repeat-random", "images:sample", None)] == \
        ["natural", "random", "repeat-token", None, None, None]


def _tiny_run(db, run_id: str, model: str, corpus: str, seq_len: int, sink_rate: float):
    """A complete synthetic run recorded as ``model`` on ``corpus`` and its run metrics."""
    from dataclasses import replace

    from fakes import fake_batches, fake_config, fake_info

    from attnbase.metrics import N
    from attnbase.runner import ingest_batches

    info = replace(fake_info(), model=model)
    cfg = fake_config(model=model, corpus=corpus, n_seqs=2, seq_len=seq_len, batch_size=2)
    ingest_batches(db, run_id, cfg, info=info, corpus=corpus, corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    with db.transaction() as con:
        con.execute("INSERT INTO run_metrics VALUES (?, ?, ?), (?, ?, ?)",
                    [run_id, N.sink_rate, sink_rate, run_id, N.sink_rate_eps, 0.3])


def _cells(out: str, run_id: str) -> list[str]:
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if cells and cells[0] == run_id:
            return cells
    raise AssertionError(f"no row {run_id!r} in\n{out}")


@pytest.mark.slow  # ~3 s idle, 12 s on the shared cores: a synthetic run ingested
def test_sinks_published_prints_the_paired_row_beside_ours(cli, tmp_path):
    from attnbase.warehouse import Database

    from attnbase.metrics import N

    db = Database(tmp_path / "db")
    _tiny_run(db, "xl-random", "openai-community/gpt2-xl", "probe:random", 64, 0.6875)
    # negative control: the same run recorded at 32 tokens (its catalog rows copied)
    with db.transaction() as con:
        con.execute("INSERT INTO runs SELECT * REPLACE ('xl-random-32' AS run_id, 32 AS seq_len) "
                    "FROM runs WHERE run_id = 'xl-random'")
        con.execute("INSERT INTO run_metrics SELECT 'xl-random-32', metric, value FROM run_metrics "
                    "WHERE run_id = 'xl-random' AND metric IN (?, ?)", [N.sink_rate, N.sink_rate_eps])
    code, out, err = cli("sinks", "--published", "--db", tmp_path / "db")
    assert code == 0, err
    assert _cells(out, "GPT2-XL")[2:5] == ["77.00", "70.29", "62.28"]  # the paper's table
    paired = _cells(out, "xl-random")
    assert paired[7:] == ["68.75", "70.29", "Gu et al. GPT2-XL, random"]
    unpaired = _cells(out, "xl-random-32")
    assert unpaired[7] == "68.75" and unpaired[8] == "-"
    assert unpaired[9].startswith("not paired: different length: 32 tokens")

    code, out, err = cli("sinks", "--published", "--format", "json", "--db", tmp_path / "db")
    assert code == 0, err
    rows = {r["run_id"]: r for r in json.loads(out)}
    assert rows["xl-random"]["paper_sink_rate"] == pytest.approx(0.7029)
    assert rows["xl-random"]["not_paired"] is None
    assert rows["xl-random-32"]["paper_sink_rate"] is None

    code, out, err = cli("sinks", "--db", tmp_path / "db")  # without --published: ours alone
    assert code == 0, err
    assert "70.29" not in out and _cells(out, "xl-random")[7] == "68.75"


def test_sinks_without_a_database_prints_the_papers_rows_and_says_so(cli, tmp_path):
    code, out, err = cli("sinks", "--published", "--db", tmp_path / "none")
    assert code == 0, err
    assert _cells(out, "LLaMA3-8B")[2:5] == ["99.02", "91.23", "0.00"]
    assert "no runs in" in out
