"""The report's paper sections: the published Table-1 row of the run's model (by hub id) with the
differences, GPT-2 small and Pythia 160M as other-model context for causal runs, and the
r-conventions study's table."""

from __future__ import annotations

from html import unescape
import re

import duckdb
import numpy as np
from report_fixtures import make_catalog

from attnbase.reports import render_html
from attnbase.stats.r_conventions import r_table
from attnbase.warehouse import Database


def _section(html: str, name: str) -> str | None:
    m = re.search(rf'<section [^>]*data-section="{name}">(.*?)</section>', html, re.S)
    return None if m is None else unescape(
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", m.group(1))))


def _rows(html: str, name: str) -> dict[str, str]:
    """The section's table rows by their first cell, the parts of a table split to the page's
    width (reports/fit.py, one key column) joined again."""
    m = re.search(rf'data-section="{name}">(.*?)</section>', html, flags=re.S)
    out: dict[str, str] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", m.group(1), flags=re.S):
        cells = [unescape(re.sub(r"<[^>]+>", "", c)).strip()
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
        if cells:
            out[cells[0]] = " ".join(filter(None, [out.get(cells[0], ""), *cells[1:]]))
    return out


def test_paper_sections(tmp_path):
    db = make_catalog(tmp_path / "db")
    rng = np.random.default_rng(0)
    cv = {"key_norm_cv": rng.random((4, 4)), "key_norm_cv_excl_sink": rng.random((4, 4))}
    share = {s: rng.random((4, 4)) for s in ("max_share", "max_share_excl_sink", "max_share_q4",
                                             "max_share_excl_sink_q4", "row_max_share")}
    table = r_table(cv, share, np.arange(4), n_boot=200)
    con = duckdb.connect(str(db / "catalog.duckdb"))
    con.execute("UPDATE runs SET model = 'openai-community/gpt2@main' WHERE run_id = 'gpt2-a'")
    con.execute("INSERT INTO studies VALUES ('rc-1', 'r_conventions', ['gpt2-a'], "
                "'{\"default_combination\": \"key_norm_cv|max_share|query_head\"}', now())")
    con.executemany("INSERT INTO study_results VALUES ('rc-1', ?, ?)",
                    [(f"{c}|{s}|{p}:{k}", v) for (c, s, p), st in table.items()
                     for k, v in st.items()])
    con.close()

    page_a, page_b = render_html(Database(db), "gpt2-a"), render_html(Database(db), "neox-b")
    own = _section(page_a, "paper")
    rows = _rows(page_a, "paper")
    assert "GPT-2 small 12 64 0.151 0.774 0.294 0.514 L2 (17%) 0.37" in rows["paper: this model"]
    # run_metrics of gpt2-a: norm-CV 0.17, VE@8 0.5, onset 1, r 0.81 -> run minus paper
    assert "+0.019 -0.274 +0.000 -0.184 -1 layers +0.44" in rows["difference (run - paper)"]
    assert "other model (Pythia 160M)" in own and "other model (GPT-2 small)" not in own
    other = _section(page_b, "paper")
    assert "other model (GPT-2 small)" in other and "other model (Pythia 160M)" in other
    assert "paper: this model" not in other and "not one of the paper's nine" in other

    rc = _section(page_a, "r_conventions")
    assert rc.count("query_head") == 10 and "kv_head" not in rc
    r0 = table[("key_norm_cv", "max_share", "query_head")]["r"]
    assert f"max_share (default: r_cv_share) query_head 16 {r0:+.3f}" in rc
    assert _section(page_b, "r_conventions") is None
