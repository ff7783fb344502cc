"""The report's massive-activations section (docs/metrics.md §6b): a figure whose curves name
their run, a table of where the largest activation sits, and a note when the run has none."""

from __future__ import annotations

import re

import duckdb

from attnbase.metrics import N
from attnbase.reports import render_html
from attnbase.warehouse import Database
from test_report_sections import left_out_items, section_html, sections, tick_labels


def _with_massive(db, run_id: str, n_hidden: int = 5):
    rows = []
    for layer in range(n_hidden):
        big = 3000.0 if layer >= 2 else 5.0
        vals = {N.massive_top1: big, N.massive_top2: 4.0, N.massive_top3: 3.5,
                N.massive_median: 0.5, N.massive_ratio: big / 0.5, N.massive_seq: 1.0,
                N.massive_pos: 0.0, N.massive_dim: 7.0, N.massive_token: 2.0,
                N.massive_sink_share: 1.0 if layer >= 2 else 0.25,
                N.massive_flag: 1.0 if layer >= 2 else 0.0}
        rows += [(run_id, layer, m, v) for m, v in vals.items()]
    con = duckdb.connect(str(db / "catalog.duckdb"))
    try:
        con.executemany("INSERT INTO layer_metrics VALUES (?,?,?,?)", rows)
    finally:
        con.close()


def test_massive_section_draws_the_run_and_tabulates_where(tmp_path):
    from report_fixtures import make_catalog

    db = make_catalog(tmp_path / "db")
    _with_massive(db, "neox-b")
    html = render_html(Database(db), "neox-b")
    assert sections(html)["massive"] == "present"
    body = section_html(html, "massive")
    text = " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", body))
    assert "neox-b: largest |h|" in text and "neox-b: massive (Sun et al.)" in text
    rows = re.findall(r"<tr><td>(H\d+)</td>(.*?)</tr>", body, re.S)
    assert [r[0] for r in rows] == ["H0", "H1", "H2", "H3", "H4"]
    h2 = re.findall(r"<td>(.*?)</td>", rows[2][1])
    assert h2[:4] == ["3000", "0.5", "6000", "(1, 0, 7)"] and h2[-1] == "yes"
    assert re.findall(r"<td>(.*?)</td>", rows[0][1])[-1] == "no"
    # the x axis ticks whole hidden-state indices only, not 0.5 steps
    xs = tick_labels(body, "x")
    assert xs and all(re.fullmatch(r"\d+", x) for x in xs), xs


def test_a_run_without_hidden_states_gets_the_note(tmp_path):
    """Negative control: no massive_* rows, no figure; the section is listed as left out."""
    from report_fixtures import make_catalog

    db = make_catalog(tmp_path / "db")
    html = render_html(Database(db), "neox-b")
    assert "massive" not in sections(html)
    assert "no massive activations" in left_out_items(html)["massive"]

