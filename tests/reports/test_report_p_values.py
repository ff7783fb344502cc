"""The report never prints a p-value as "0" (docs/metrics.md §8): the Table-1 row's
r_cv_share_p stored as 0 (an underflow) is the bound "< 1e-300"."""

from __future__ import annotations

from types import SimpleNamespace

from attnbase.metrics import N
from attnbase.warehouse import Database


def _run(p):
    return SimpleNamespace(run_id="r1", run={"model": "m"},
                           run_metrics={N.r_cv_share: 0.97, N.r_cv_share_p: p})


def test_table1_row_writes_an_underflowed_p_as_a_bound():
    from attnbase.reports.sections import TABLE1, table1_row

    col = [m for m, _ in TABLE1].index(N.r_cv_share_p) + 2
    assert table1_row(_run(0.0))[col] == "< 1e-300"
    assert table1_row(_run(0.0123))[col] == "0.0123"  # a p-value above 0: its digits
    assert table1_row(_run(0.0))[col - 1] == "0.97"  # r itself is no p-value


def test_r_conventions_table_writes_an_underflowed_p_as_a_bound(tmp_path):
    """The paper section's r(CV, share) table: p stored as 0 is "< 1e-300"; p = 0.25 stays."""
    import re

    import duckdb
    from report_fixtures import make_catalog

    from attnbase.reports import render_html

    db = make_catalog(tmp_path / "db")
    stats = {"n": 16.0, "r": 0.99, "ci_low": 0.98, "ci_high": 0.995, "spearman": 0.97}
    con = duckdb.connect(str(db / "catalog.duckdb"))
    con.execute("INSERT INTO studies VALUES ('rc-1', 'r_conventions', ['gpt2-a'], "
                "'{\"default_combination\": \"key_norm_cv|max_share|query_head\"}', now())")
    con.executemany("INSERT INTO study_results VALUES ('rc-1', ?, ?)",
                    [(f"key_norm_cv|{share}|query_head:{k}", v)
                     for share, p in (("max_share", 0.0), ("row_max_share", 0.25))
                     for k, v in {**stats, "p": p}.items()])
    con.close()
    html = render_html(Database(db), "gpt2-a")
    sec = re.search(r'data-section="r_conventions">(.*?)</section>', html, re.S).group(1)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", sec, re.S)]
    p_cells = [c[6] for c in cells if len(c) > 6]
    assert p_cells == ["&lt; 1e-300", "0.25"]
