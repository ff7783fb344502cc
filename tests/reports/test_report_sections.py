"""Which sections a report holds, and the notes for those whose data the catalog lacks."""

from __future__ import annotations

import re

import numpy as np
import pytest

from attnbase.reports import SECTIONS, render_html
from attnbase.reports.data import load_run
from attnbase.warehouse import Database

NOTE = re.compile(r"no [^<]+ in the catalog for this run; run `attnbase [^`]+` to compute it")


def sections(html: str) -> dict[str, str]:
    """section name -> 'present' | 'missing', in document order."""
    return dict(
        (name, cls) for cls, name in
        re.findall(r'<section id="sec-[\w-]+" class="(present|missing)" data-section="([\w-]+)"',
                   html))


def left_out_items(html: str) -> dict[str, str]:
    """section name -> its entry in the one "Left out" list at the top of the report."""
    return dict(re.findall(r'<li data-left-out="([\w-]+)">(.*?)</li>', html, re.S))


def section_html(html: str, name: str) -> str:
    m = re.search(rf'<section [^>]*data-section="{name}">(.*?)</section>', html, re.S)
    assert m, f"no section {name}"
    return m.group(1)


def test_registry_is_complete_and_unique():
    names = [s.name for s in SECTIONS]
    assert len(names) == len(set(names))
    for required in ("run", "table1", "comparison", "norm_cv", "ve", "max_share", "head_maps",
                     "concentration", "entropy", "conventions", "rank_collapse", "spectral",
                     "methods"):
        assert required in names
    for s in SECTIONS:
        assert s.title


def test_collapse_run_has_its_sections_and_notes_for_the_rest(html_a):
    got = sections(html_a)
    for name in ("run", "table1", "norm_cv", "ve", "max_share", "head_maps", "concentration",
                 "entropy", "methods"):
        assert got[name] == "present", name
    items = left_out_items(html_a)
    for name in ("conventions", "rank_collapse", "spectral"):
        assert name not in got, name  # left out, not rendered as an empty section
        assert html_a.count(f'data-left-out="{name}"') == 1  # listed once
        assert "compute with <code>attnbase " in items[name]
    assert "attnbase weights --db " in items["spectral"] and "--model gpt2-tiny" in items["spectral"]
    assert "attnbase study distances --db " in items["conventions"]
    assert "then study reversal and study clusters" in items["conventions"]
    assert "comparison" not in got and "comparison" not in items  # only with --compare
    assert "not in the catalog" not in html_a


def test_future_families_render_when_their_data_exists(html_b):
    got = sections(html_b)
    for name in ("conventions", "rank_collapse", "spectral"):
        assert got[name] == "present", name
    conv = section_html(html_b, "conventions")
    assert "reversal rate" in conv and "0.31" in conv and "0.42" in conv
    assert "≤ 0.001, 999 draws" in conv  # the ARI's permutation p at its floor, as a bound
    assert "Routing fraction" in section_html(html_b, "spectral")


def test_bare_run_is_all_notes(catalog):
    html = render_html(Database(catalog), "bare")
    got = sections(html)
    assert got["run"] == got["methods"] == "present"
    assert set(got) == {"run", "methods"}
    assert "run status is &#39;running&#39;" in html or "run status is 'running'" in html
    assert "has not been analysed" in html
    assert len(left_out_items(html)) >= 9


def test_spine_only_catalog(spine_catalog):
    """Only runs + row_stats: row-level sections render, the statistic families are notes."""
    html = render_html(Database(spine_catalog), "gpt2-a")
    got = sections(html)
    assert got["concentration"] == got["entropy"] == "present"
    assert {"table1", "ve", "norm_cv"} <= set(left_out_items(html))
    assert not {"table1", "ve", "norm_cv"} & set(got)


def test_every_figure_has_labels_legend_and_a_caption(html_b):
    figures = re.findall(r"<figure class=\"(wide|grid)\"[^>]*>(.*?)</figure>", html_b, re.S)
    assert len(figures) >= 8
    for kind, body in figures:
        caption = re.search(r"<figcaption>(.*?)</figcaption>", body, re.S)
        assert caption and "Look for" in caption.group(1)
        for svg in re.findall(r"<svg.*?</svg>", body, re.S):
            assert ("(0-based index)" in svg or "depth fraction" in svg or "hidden state" in svg
                    or "dissimilarity (with_sink vs drop_sink)" in svg  # §5 categorical axes
                    or "heads masked (fraction of all heads)" in svg
                    or "path length" in svg)
            if kind == "wide":
                assert 'id="legend_1"' in svg
            else:  # heatmaps carry a colour bar with a label in units
                assert "(fraction)" in svg or "(dimensionless)" in svg or "nats" in svg


def test_table1_and_null_baselines(html_a):
    body = section_html(html_a, "table1")
    for label in ("key-norm CV", "isotropic baseline", "VE@8 Gauss null", "VE@8 shuffle null",
                  "onset layer", "r(CV, max share)"):
        assert label in body
    assert "0.1768" in body  # 1/sqrt(2*16)
    assert "1.20e-04" in body  # r_cv_share_p
    assert "16 of 16" in body  # heads beating the Gauss null (q < 0.05)


def test_methods_state_conventions_nulls_and_provenance(html_a):
    body = section_html(html_a, "methods")
    for text in ("cfg-gpt2-a", "rev-abc123", "corpus-9f8e", "float32", "§1", "§2", "§3", "§4",
                 "§8", "Benjamini-Hochberg", "gauss", "shuffle", "200", "20"):
        assert text in body, text
    # what computed the run: this synthetic catalog's runs have no config (a run registered
    # before it was recorded): "?" but the dtypes, which the runs row holds
    assert re.search(r"<td>statistics backend</td><td>\?</td>", body)
    assert re.search(r"<td>store dtype</td><td>float32</td>", body)
    assert re.search(r"<td>gauss</td><td>16</td><td>200</td><td>0</td>", body)
    assert re.search(r"<td>shuffle</td><td>16</td><td>20</td><td>1</td>", body)


def test_entropy_decomposition_adds_up(catalog):
    """The per-layer terms read from row_stats satisfy H = H_b(s) + (1 - s) H(pi) (§4)."""
    rl = load_run(Database(catalog), "gpt2-a").row_layers
    assert rl.height == 4
    np.testing.assert_allclose(rl["sink_part"] + rl["content_part"], rl["entropy"], rtol=1e-9)


def test_comparison_shows_both_runs(compared):
    html = compared.html.read_text()
    assert sections(html)["comparison"] == "present"
    body = section_html(html, "comparison")
    assert "<td>gpt2-a</td>" in body and "<td>neox-b</td>" in body
    assert body.count("<svg") >= 3
    assert "depth fraction" in body
    methods = section_html(html, "methods")
    assert "cfg-gpt2-a" in methods and "cfg-neox-b" in methods


def test_left_out_commands_are_real(catalog, cli_app_commands):
    """Every command a report names for missing data is a command of this CLI."""
    from attnbase.reports.blocks import Context

    ctx = Context(run=load_run(Database(catalog), "bare"), db=Database(catalog))
    for s in SECTIONS:
        if not s.note_when_missing:
            continue
        line = s.command_line(ctx)
        assert NOTE.fullmatch(s.missing_note(ctx)), s.missing_note(ctx)
        words = line.split()
        assert words[0] == "attnbase" and "{" not in line, line
        path = tuple(w for w in words[1:3] if not w.startswith("-"))
        assert path[:1] in cli_app_commands or path in cli_app_commands, line


def test_hints_name_a_team_database_by_its_address_alone(catalog):
    """A report's commands and warnings name a team database by its address, which holds no
    password (an address with one is refused where the Database is made); a directory by its
    path; no Database at all as DB."""
    from attnbase.errors import WarehouseError
    from attnbase.reports.blocks import Context
    from attnbase.reports.render import report_warnings

    address = "postgresql://alice@db.example:5433/lab"
    bare = load_run(Database(catalog), "bare")
    hints = {
        name: [s.command_line(Context(run=bare, db=db)) for s in SECTIONS if s.note_when_missing]
        + list(report_warnings(bare, db or Database(catalog)))
        for name, db in (("team", Database(address)), ("dir", Database(catalog)), ("none", None))
    }
    assert any(f"--db {address} --run bare" in h for h in hints["team"]), hints["team"]
    assert any(f"--db {catalog} --run bare" in h for h in hints["dir"]), hints["dir"]
    assert any("--db DB --run bare" in h for h in hints["none"]), hints["none"]
    assert not any("Database(" in h or "@db.example" in h for h in hints["dir"] + hints["none"])
    with pytest.raises(WarehouseError) as err:
        Database("postgresql://alice:s3cret@db.example:5433/lab")
    assert "s3cret" not in str(err.value)


@pytest.fixture(scope="module")
def cli_app_commands():
    """The CLI's commands as tuples: ("analyze",), ("study", "reversal"), ..."""
    import typer.main

    from attnbase.cli import app

    group = typer.main.get_command(app)
    out = set()
    for name, cmd in group.commands.items():
        out.add((name,))
        for sub in getattr(cmd, "commands", {}) or {}:
            out.add((name, sub))
    return out


def test_depth_sections_render_variants_paths_and_weights(tmp_path):
    """Sibling variant runs, a path study and a weights run of the same model revision."""
    import duckdb

    from report_fixtures import make_catalog

    db = make_catalog(tmp_path / "db")
    con = duckdb.connect(str(db / "catalog.duckdb"))
    try:
        con.execute("ALTER TABLE runs ADD COLUMN config JSON")
        con.execute("UPDATE runs SET model_revision = 'rev1', config = '{}', causal = true "
                    "WHERE run_id = 'neox-b'")
        con.executemany("INSERT INTO layer_metrics VALUES ('neox-b', ?, 'rank_collapse_excl_sink', ?)",
                        [(layer, 0.5 ** layer) for layer in range(5)])
        for rid, cfg, rev in (("neox-ao", '{"variant": "attention-only"}', "rev1"),
                              ("neox-rand", '{"init": "random"}', "rev1+random-init:seed=0")):
            con.execute("INSERT INTO runs (run_id, model, model_revision, n_layers, n_heads, status, "
                        "dtype, corpus, config) VALUES (?, 'neox-tiny', ?, 4, 4, 'complete', "
                        "'float32', 'default', ?)", [rid, rev, cfg])
            con.executemany("INSERT INTO layer_metrics VALUES (?,?,?,?)",
                            [(rid, layer, "rank_collapse", 0.5 ** (2 ** layer)) for layer in range(5)])
        con.execute("INSERT INTO runs (run_id, model, model_revision, n_layers, n_heads, d_head, "
                    "status, dtype, corpus) VALUES ('neox-w', 'neox-tiny', 'rev1', 4, 4, 16, "
                    "'complete', 'float32', '(weights)')")
        con.execute("INSERT INTO studies VALUES ('paths-x', 'paths', ['neox-b'], "
                    "'{\"order\": \"forward\", \"draws\": 5, \"seqs\": 2, \"seed\": 0}', now())")
        rows = [("paths-x", f"ratio_{q}/{k}", v * 0.3 ** k) for k in (1, 2, 3, 4)
                for q, v in (("q05", 0.5), ("q25", 0.8), ("median", 1.0), ("q75", 1.2),
                             ("q95", 1.5), ("mean", 1.0))]
        con.executemany("INSERT INTO study_results VALUES (?,?,?)", rows)
    finally:
        con.close()
    html = render_html(Database(db), "neox-b")
    got = sections(html)
    assert got["rank_collapse"] == got["paths"] == got["spectral"] == "present"
    body = section_html(html, "rank_collapse")
    assert "neox-ao (attention-only, pretrained)" in body and "neox-rand (full, random)" in body
    assert "log scale" in body
    assert "Rank collapse without token 0" in body  # causal run with the excl-sink rows
    assert "5th and 95th percentiles" in section_html(html, "paths")
    # a run without routing metrics borrows those of the weights-only run of its revision
    con = duckdb.connect(str(db / "catalog.duckdb"))
    try:
        con.executemany("INSERT INTO head_metrics VALUES ('neox-w', ?, ?, ?, ?)",
                        [(layer, head, m, v) for layer in range(4) for head in range(4)
                         for m, v in (("routing_fraction", 0.4), ("routing_erank", 5.0),
                                      ("n_unstable", float(head)))])
    finally:
        con.close()
    html = render_html(Database(db), "neox-ao")
    assert sections(html)["spectral"] == "present"
    body = section_html(html, "spectral")
    assert "weights-only run neox-w" in body and "0.75" in body  # 3 of 4 heads unstable


def tick_labels(svg: str, axis: str) -> list[str]:
    """The tick labels of one axis ("x" or "y") of the first figure in ``svg`` (matplotlib's
    ``<g id="xtick_N">`` groups, text kept as text)."""
    svg = svg[:svg.index("</svg>")]
    out = []
    for m in re.finditer(rf'<g id="{axis}tick_\d+">', svg):
        t = re.search(r"<text[^>]*>([^<]*)</text>", svg[m.end():])
        out.append(t.group(1).strip())
    return out
