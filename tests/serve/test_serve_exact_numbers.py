"""``POST /api/sql`` answers numbers exactly in JSON (issue 44, item 4): an integer past 2**53
(BIGINT, UBIGINT, a HUGEINT such as ``sum()`` of BIGINTs gives, a DECIMAL) is written with all
its digits, as CSV, Arrow and the command line already did; the notebook client's polars frame
holds the exact value too."""

from __future__ import annotations

import json

import pytest

BIG = 2**53 + 1  # 9007199254740993: the first integer a double cannot hold

CASES = [
    (f"SELECT {BIG}::BIGINT AS v", BIG),
    (f"SELECT sum(x) AS v FROM (VALUES ({BIG}::BIGINT)) t(x)", BIG),  # HUGEINT
    (f"SELECT {2**64 - 1}::UBIGINT AS v", 2**64 - 1),
    (f"SELECT {2**127 - 1}::HUGEINT AS v", 2**127 - 1),
    (f"SELECT -{BIG}::HUGEINT AS v", -BIG),
    ("SELECT 12345678901234567890.12::DECIMAL(38, 2) AS v", "12345678901234567890.12"),
]


def _value(text: str):
    """The one value of a JSON answer, parsed by the standard library (integers exact; a
    number with a fraction kept as its digits)."""
    body = json.loads(text, parse_float=str)
    return body["rows"][0][0]


@pytest.mark.parametrize("sql,want", CASES)
def test_json_numbers_are_exact(client, sql, want):
    r = client.post("/api/sql", json={"sql": sql})
    assert r.status_code == 200, r.text
    assert _value(r.text) == want, r.text
    # and CSV (which was exact before) agrees digit for digit
    c = client.post("/api/sql", json={"sql": sql, "format": "csv"})
    assert c.text.split()[-1] == str(want), c.text


def test_small_numbers_and_floats_are_unchanged(client):
    """Negative control: ordinary values keep their JSON types (integers as integers, doubles
    as doubles, a NaN as null)."""
    r = client.post("/api/sql", json={"sql": "SELECT 3 AS i, 0.5::DOUBLE AS d, "
                                            "'nan'::DOUBLE AS n, 2.50::DECIMAL(4, 2) AS m"})
    assert r.status_code == 200, r.text
    assert json.loads(r.text)["rows"] == [[3, 0.5, None, 2.5]]


def test_the_console_page_shows_the_exact_integer(client):
    # the SQL's own text (echoed in the page) does not hold the answer's digits
    sql = f"SELECT sum(x) AS v FROM (VALUES ({BIG - 1}::BIGINT), (1)) t(x)"
    r = client.get("/sql", params={"sql": sql})
    assert r.status_code == 200 and str(BIG) in r.text.replace(",", ""), r.text[-2000:]


def test_the_notebook_client_gets_the_exact_value(server):
    import attnbase

    svc = attnbase.connect(server.url)
    df = svc.sql(f"SELECT {BIG}::BIGINT AS b, sum(x) AS s FROM (VALUES ({BIG}::BIGINT)) t(x)")
    assert int(df["b"][0]) == BIG and int(df["s"][0]) == BIG, df
