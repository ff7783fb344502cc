"""The report's high-norm tokens and registers section (docs/metrics.md §6c): a run with
registers and one without, compared side by side, each curve and table row naming its run and
its extra tokens; a text run's report has no such section and no note about it."""

from __future__ import annotations

import re

import duckdb
import pytest

from attnbase.metrics import N
from attnbase.reports import render_html
from attnbase.warehouse import Database
from test_report_sections import left_out_items, section_html, sections


def _as_image_runs(db):
    """neox-b becomes a DINOv2 with 4 registers, gpt2-a a ViT; their high_norm_* rows: the
    ViT's share rises to 0.25 with [CLS] attention above uniform, the DINOv2's stays 0."""
    con = duckdb.connect(str(db / "catalog.duckdb"))
    try:
        con.execute("ALTER TABLE runs ADD COLUMN sink_positions INTEGER[]")
        con.execute("UPDATE runs SET family = 'dinov2_with_registers', seq_len = 21, "
                    "sink_positions = [0, 1, 2, 3, 4] WHERE run_id = 'neox-b'")
        con.execute("UPDATE runs SET family = 'vit', seq_len = 17, sink_positions = [0] "
                    "WHERE run_id = 'gpt2-a'")
        rows = []
        for run, share in (("gpt2-a", (0.0, 0.125, 0.25)), ("neox-b", (0.0, 0.0, 0.0))):
            for layer, s in enumerate(share):
                rows += [(run, layer, N.high_norm_frac, s),
                         (run, layer, N.high_norm_max_ratio, 2.0 + 20 * s)]
                if layer < 2:
                    rows += [(run, layer, N.high_norm_cls_attn, 3 * s / 17 * 16),
                             (run, layer, N.high_norm_cls_uniform, s * 16 / 17)]
        con.executemany("INSERT INTO layer_metrics VALUES (?,?,?,?)", rows)
    finally:
        con.close()


@pytest.mark.slow
def test_registers_compared_side_by_side(tmp_path):
    from report_fixtures import make_catalog

    db = make_catalog(tmp_path / "db")
    _as_image_runs(db)
    html = render_html(Database(db), "neox-b", compare=("gpt2-a",))
    assert sections(html)["high_norm"] == "present"
    body = section_html(html, "high_norm")
    text = " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", body))
    assert "neox-b (4 registers): share of high-norm patches" in text
    assert "gpt2-a (none): [CLS] attention on them" in text
    rows = re.findall(r"<tr><td>(neox-b|gpt2-a)</td>(.*?)</tr>", body, re.S)
    assert [r[0] for r in rows] == ["neox-b"] * 3 + ["gpt2-a"] * 3
    vit_h2 = re.findall(r"<td>(.*?)</td>", rows[5][1])
    assert vit_h2[:4] == ["none", "H2", "0.25", "7"] and vit_h2[4:] == ["—", "—"]
    dino_h1 = re.findall(r"<td>(.*?)</td>", rows[1][1])
    assert dino_h1[:3] == ["4 registers", "H1", "0"]


@pytest.mark.slow
def test_a_text_run_has_no_high_norm_section_nor_note(tmp_path):
    """Negative control: no high_norm_* rows (a text run): no section, and no left-out note
    (the section concerns image runs only)."""
    from report_fixtures import make_catalog

    db = make_catalog(tmp_path / "db")
    html = render_html(Database(db), "neox-b")
    assert "high_norm" not in sections(html)
    assert "high_norm" not in left_out_items(html)


def test_high_norm_figure_has_whole_hidden_states_and_no_negative_share(tmp_path):
    """Every run at share 0 (seeded tiny models): the y axis starts at 0, not at a negative
    share, and the x axis ticks whole hidden-state indices only (three hidden states would
    otherwise tick 0.0, 0.5, ...)."""
    from report_fixtures import make_catalog
    from test_report_sections import tick_labels

    db = make_catalog(tmp_path / "db")
    _as_image_runs(db)
    con = duckdb.connect(str(db / "catalog.duckdb"))
    try:
        con.execute("UPDATE layer_metrics SET value = 0 WHERE metric IN (?, ?, ?)",
                    [N.high_norm_frac, N.high_norm_cls_attn, N.high_norm_cls_uniform])
    finally:
        con.close()
    body = section_html(render_html(Database(db), "neox-b", compare=("gpt2-a",)), "high_norm")
    xs, ys = tick_labels(body, "x"), tick_labels(body, "y")
    assert xs and all(re.fullmatch(r"\d+", x) for x in xs), xs
    assert ys and not any(y.startswith(("−", "-")) for y in ys), ys
