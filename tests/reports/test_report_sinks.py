"""The report's ``sinks`` section: the run's Sink_1^eps beside Gu et al.'s row of its model and
setup with the difference; a run in another setup is not paired and the note names why."""

from __future__ import annotations

import duckdb
import pytest
from report_fixtures import make_catalog
from test_report_paper import _rows, _section

from attnbase.reports import render_html
from attnbase.warehouse import Database


@pytest.mark.slow  # two reports rendered (figures): ~10 s idle, 45 s on the shared cores
def test_sinks_section_pairs_only_the_matching_run(tmp_path):
    db = make_catalog(tmp_path / "db")
    con = duckdb.connect(str(db / "catalog.duckdb"))
    # gpt2-a: recorded as GPT2-XL on probe:random at 64 tokens (the paper's setup);
    # neox-b: its own model and the bundled text (negative control)
    con.execute("UPDATE runs SET model = 'openai-community/gpt2-xl', corpus = 'probe:random', "
                "seq_len = 64 "
                "WHERE run_id = 'gpt2-a'")
    con.executemany("INSERT INTO run_metrics VALUES (?, ?, ?)",
                    [(r, m, v) for r in ("gpt2-a", "neox-b")
                     for m, v in (("sink_rate", 0.6875), ("sink_rate_eps", 0.3))])
    con.close()

    page_a, page_b = render_html(Database(db), "gpt2-a"), render_html(Database(db), "neox-b")
    rows = _rows(page_a, "sinks")
    assert rows["this run (gpt2-a)"].endswith("0.3 <bos> 68.75")
    assert rows["paper: this model and setup"] == "GPT2-XL random 64 0.3 - 70.29"
    assert rows["difference (run - paper)"] == "-1.54"
    assert "not paired" not in _section(page_a, "sinks")

    other = _section(page_b, "sinks")
    assert "68.75" in other and "paper: this model" not in other
    assert "not paired with a published row: different model: neox-tiny" in other
    assert "70.29" not in other
