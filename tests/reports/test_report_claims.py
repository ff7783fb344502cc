"""A report never claims more than its data (issue 10): captions against what each figure draws,
failed and un-analysed runs, the uniform causal baseline, legible heatmap ticks."""

from __future__ import annotations

import html as htmllib
import re

import duckdb
import numpy as np
import pytest
from report_fixtures import make_catalog

from attnbase.errors import ReportError
from attnbase.reports import figures as F
from attnbase.reports import render_html
from attnbase.warehouse import Database


#: caption phrase -> the mark (figures.SVG.drawn) it claims is drawn
CLAIMS = {"dashed": "dashed", "dash-dot": "dash-dot", "shaded band": "band", "dotted": "dotted",
          "(dots": "dots", "dots are": "dots", "bars": "bars", "diamond": "diamond"}


def figures_with_drawn(html: str) -> list[tuple[list[str], str]]:
    out = []
    for drawn, body in re.findall(r'<figure class="(?:wide|grid)" data-drawn="([^"]*)">(.*?)</figure>',
                                  html, re.S):
        cap = re.search(r"<figcaption>(.*?)</figcaption>", body, re.S).group(1)
        out.append((htmllib.unescape(drawn).split("|"), re.sub(r"<[^>]+>", "", cap)))
    return out


@pytest.mark.parametrize("which", ["html_a", "html_b", "compared"])
def test_captions_claim_only_what_is_drawn(request, which):
    html = request.getfixturevalue(which)
    if which == "compared":
        html = html.html.read_text()
    figs = figures_with_drawn(html)
    assert len(figs) >= 5
    for drawn, caption in figs:
        for phrase, mark in CLAIMS.items():
            if phrase in caption:
                assert mark in drawn, f"caption says {phrase!r} but the figure draws {drawn}: {caption}"


def test_causal_run_shows_the_uniform_baseline(html_a):
    from report_fixtures import T  # the fixture runs are causal with T tokens per window

    h = sum(1 / k for k in range(1, T + 1)) / T
    label = f"uniform causal attention H_T/T = {h:.4f} (T = {T})"
    assert any(label in d for drawn, _ in figures_with_drawn(html_a) for d in drawn)
    assert "The dashed line is the max share of uniform causal attention" in html_a


def test_uniform_baseline_reference_value():
    from types import SimpleNamespace

    from attnbase.reports.sections import uniform_causal_max_share

    run = SimpleNamespace(run={"causal": True, "seq_len": 128})
    assert uniform_causal_max_share(run) == pytest.approx(0.04245, abs=5e-6)  # docs/metrics.md §3
    assert uniform_causal_max_share(SimpleNamespace(run={"causal": False, "seq_len": 128})) is None


def test_heatmap_tick_labels_do_not_run_together():
    svg = F.heatmap(np.arange(12 * 12, dtype=float).reshape(12, 12), title="t",
                    cbar_label="x (fraction)")
    assert len(F._ticks(12)) <= F.MAX_TICKS and F._ticks(12)[:2] == [0, 2]
    assert "heatmap" in svg.drawn


def test_sink_map_not_repeated_when_it_equals_max_share(tmp_path):
    """When sink mass equals max share on every head, only one of the two maps is drawn."""
    db = make_catalog(tmp_path / "db")
    con = duckdb.connect(str(db / "catalog.duckdb"))
    try:
        con.execute("""UPDATE head_metrics h SET value = r.m FROM (
                           SELECT layer, head, avg(sink_mass) AS m FROM row_stats
                           WHERE run_id = 'gpt2-a' AND n_keys >= 3 GROUP BY ALL) r
                       WHERE h.run_id = 'gpt2-a' AND h.metric = 'max_share'
                         AND h.layer = r.layer AND h.head = r.head""")
    finally:
        con.close()
    html = render_html(Database(db), "gpt2-a")
    assert "The sink-mass map is not drawn" in html
    assert "Sink mass A[i, 0] (§3)" not in html


def _with_status(tmp_path, status: str, analysed: bool = True):
    db = make_catalog(tmp_path / "db")
    con = duckdb.connect(str(db / "catalog.duckdb"))
    try:
        con.execute("UPDATE runs SET status = ? WHERE run_id = 'gpt2-a'", [status])
        if not analysed:
            for t in ("head_metrics", "run_metrics", "layer_metrics", "null_tests"):
                con.execute(f"DELETE FROM {t} WHERE run_id = 'gpt2-a'")
    finally:
        con.close()
    return db


def test_failed_run_is_refused(tmp_path, cli):
    db = _with_status(tmp_path, "failed")
    with pytest.raises(ReportError, match="status 'failed'"):
        render_html(Database(db), "gpt2-a")
    code, out, err = cli("report", "--db", db, "--run", "gpt2-a")
    assert code == 2 and out == "" and err.count("\n") == 1 and "status 'failed'" in err
    assert not (db / "reports").exists()


def test_unanalysed_run_warns_on_console_and_on_top(tmp_path, cli):
    db = _with_status(tmp_path, "complete", analysed=False)
    code, out, err = cli("report", "--db", db, "--run", "gpt2-a")
    assert code == 0, err
    assert "warning: run 'gpt2-a' has not been analysed" in err
    assert f"attnbase analyze --db {db} --run gpt2-a" in err
    html = (db / "reports" / "gpt2-a" / "report.html").read_text()
    top = html[: html.index('<nav class="toc">')]
    assert "has not been analysed" in top
