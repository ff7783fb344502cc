"""Values a format cannot hold (a BLOB or an infinite timestamp in JSON, an INTERVAL or a BLOB
that is not UTF-8 in CSV, a UNION in Parquet): a JSON 400 naming the column and the cast, not a
plain-text 500 (and the service's ``AttnbaseError`` through the client)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("fmt, select, column", [
    ("json", "'infinity'::timestamp", "timestamp[us]"),
    ("json", "'-infinity'::date", "date32[day]"),
    ("json", "'abc'::blob", "binary"),
    ("json", "{'a': 'x'::blob}", "struct<a: binary>"),
    ("csv", "interval 1 day", "month_day_nano_interval"),
    ("csv", "'\\xAA'::blob", "binary"),
    ("parquet", "union_value(k := 1)", "sparse_union"),
])
def test_unwritable_values_are_a_json_400(client, fmt, select, column):
    r = client.post("/api/sql", json={"sql": f"select 1 as a, {select} as v", "format": fmt})
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"column 'v' ({column}") and "\n" not in detail, detail
    assert "CAST(v AS VARCHAR)" in detail
    # control: the cast the message names answers
    ok = client.post("/api/sql", json={"sql": f"select 1 as a, CAST({select} AS VARCHAR) as v",
                                       "format": fmt})
    assert ok.status_code == 200, ok.text


def test_console_page_names_the_column(client):
    r = client.get("/sql", params={"sql": "select 'abc'::blob as b"})
    assert r.status_code == 400 and "column &#39;b&#39; (binary)" in r.text


def test_client_raises_attnbase_error(server):
    import attnbase
    from attnbase.errors import AttnbaseError

    svc = attnbase.connect(server.url)
    with pytest.raises(AttnbaseError, match=r"column 'u' \(sparse_union<k: int32=0>\) of "
                                            r"the answer cannot be a polars column"):
        svc.sql("select union_value(k := 1) as u")  # before: polars' ComputeError
    assert svc.sql("select 1 as a")["a"].to_list() == [1]  # control
