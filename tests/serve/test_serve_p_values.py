"""p-values on the service's pages are never "0" (docs/metrics.md §8): the head page's null
tests and the /sql page's result table, rendered from their templates without a server."""

from __future__ import annotations

import re


def _null_test(**kw) -> dict:
    row = {"metric": "ve_at_8", "null_model": "gauss", "statistic": 0.9, "null_mean": 0.5,
           "null_sd": 0.01, "z": 40.0, "p_value": 0.0, "q_value": 0.0, "p_method": "clt_normal",
           "draws": 200, "p_empirical": 1 / 201, "p_at_floor": True}
    return {**row, **kw}


def _cells(html: str) -> list[str]:
    table = re.search(r'<table class="data" id="null-tests">(.*?)</table>', html, re.S).group(1)
    return re.findall(r'<td class="p">([^<]*)</td>', table)


def _stats(null_tests) -> str:
    from attnbase.serve.web import templates

    macros = templates().get_template("head_sections.html.j2").module
    return str(macros.stats({"metrics": {}, "ranks": {}, "null_tests": null_tests}))


def test_head_page_null_tests_show_bounds_not_zero():
    """p and q stored as 0 read "< 1e-300"; the empirical p at its floor "< 0.005, 200 draws"."""
    html = _stats([_null_test()])
    assert _cells(html) == ["&lt; 1e-300", "&lt; 1e-300", "&lt; 0.005, 200 draws"]
    assert "<th>p empirical</th>" in html
    assert not re.search(r"<td[^>]*>0</td>", html)


def test_head_page_shows_an_ordinary_p_value_as_it_is():
    """Negative control: a p-value off the floor and above 0 is shown with its digits."""
    html = _stats([_null_test(p_value=0.0312, q_value=0.0624, p_empirical=7 / 201,
                              p_at_floor=False, z=1.86)])
    assert _cells(html) == ["0.0312", "0.0624", "0.0348"]


def test_sql_page_result_p_columns_show_bounds():
    """The /sql page: a 0 in a p-value column is the bound; a 0 elsewhere stays 0."""
    from types import SimpleNamespace

    from attnbase.serve.web import templates

    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(
        settings=SimpleNamespace(prefect_api=None))))
    html = templates().get_template("sql.html.j2").render(
        request=request, authed=False, sql="select 1", examples=[], error=None, settings=[],
        result={"columns": ["layer", "p_value", "ve_gauss_q"], "rows": [[0, 0.0, 0.0]],
                "truncated": False, "elapsed_ms": 1.0})
    row = re.search(r'id="result">.*?</tr>\s*<tr>(.*?)</tr>', html, re.S).group(1)
    assert re.findall(r"<td>([^<]*)</td>", row) == ["0", "&lt; 1e-300", "&lt; 1e-300"]
