"""A report's figures that draw several runs label each curve by its run, its tables carry a
run column, and it draws only the runs it was asked for: the report's run, its --compare runs
and its ablation siblings (same model, revision and corpus, another variant or init)."""

from __future__ import annotations

import re

import duckdb

from attnbase.reports import render_html
from attnbase.warehouse import Database
from test_report_sections import section_html


def _svg_text(body: str) -> str:
    """The figure's text elements joined by spaces (the legend wraps long entries)."""
    return " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", body))


def _catalog(tmp_path):
    from report_fixtures import make_catalog

    db = make_catalog(tmp_path / "db")
    con = duckdb.connect(str(db / "catalog.duckdb"))
    try:
        con.execute("ALTER TABLE runs ADD COLUMN config JSON")
        con.execute("UPDATE runs SET model_revision = 'rev1', config = '{}' WHERE run_id = 'neox-b'")
        for rid, cfg, corpus in (("neox-ao", '{"variant": "attention-only"}', "default"),
                                 ("neox-again", "{}", "default"),  # same variant: unrelated
                                 ("neox-probe", '{"variant": "no-mlp"}', "probe:random")):
            con.execute("INSERT INTO runs (run_id, model, model_revision, n_layers, n_heads, "
                        "status, dtype, corpus, config) VALUES (?, 'neox-tiny', 'rev1', 4, 4, "
                        "'complete', 'float32', ?, ?)", [rid, corpus, cfg])
            con.executemany("INSERT INTO layer_metrics VALUES (?,?,?,?)",
                            [(rid, layer, "rank_collapse", 0.5 ** (layer + 1)) for layer in range(5)])
    finally:
        con.close()
    return db


def test_rank_collapse_labels_each_curve_by_run_and_draws_only_its_runs(tmp_path):
    db = _catalog(tmp_path)
    body = section_html(render_html(Database(db), "neox-b"), "rank_collapse")
    # legend entries (SVG text) name the run; two "full, pretrained" curves could not be told apart
    text = _svg_text(body)
    assert "neox-b: full, pretrained" in text and "neox-ao: attention-only, pretrained" in text
    assert "neox-again" not in body and "neox-probe" not in body  # not asked for, not siblings
    header = re.search(r"<tr>\s*<th[^>]*>(.*?)</th>\s*<th[^>]*>(.*?)</th>\s*<th[^>]*>(.*?)</th>",
                       body, re.S).groups()
    assert header == ("Run", "Variant", "Init")


def test_a_compared_run_of_the_same_variant_is_drawn_under_its_own_name(tmp_path):
    db = _catalog(tmp_path)
    body = section_html(render_html(Database(db), "neox-b", compare=("neox-again",)),
                        "rank_collapse")
    text = _svg_text(body)
    assert "neox-again: full, pretrained" in text and "neox-b: full, pretrained" in text


def test_a_compared_run_of_another_depth_is_tabulated_with_blanks(tmp_path):
    """The rank-collapse table of runs with 5 and 3 hidden states: the shallower run's row is
    filled with '-' where it has no such state (it was one cell per state it has, which broke
    the table's page fitting: the demo's MiniLM against SmolLM2)."""
    db = _catalog(tmp_path)
    con = duckdb.connect(str(db / "catalog.duckdb"))
    try:
        con.execute("INSERT INTO runs (run_id, model, model_revision, n_layers, n_heads, status, "
                    "dtype, corpus, config) VALUES ('short', 'other', 'r', 2, 4, 'complete', "
                    "'float32', 'default', '{}')")
        con.executemany("INSERT INTO layer_metrics VALUES (?,?,?,?)",
                        [("short", layer, "rank_collapse", 0.5) for layer in range(3)])
    finally:
        con.close()
    body = section_html(render_html(Database(db), "neox-b", compare=("short",)), "rank_collapse")
    row = re.search(r"<tr>\s*<td[^>]*>short</td>(.*?)</tr>", body, re.S).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    assert cells[-2:] == ["-", "-"] and "-" not in cells[2:5]
