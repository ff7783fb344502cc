"""``attnbase serve`` over real HTTP: every route, the error codes, traversal, the SQL limits.

One server per module (a subprocess on a free loopback port, stopped by PID) on the database of
serve_fixtures.py, with a 1 s SQL time limit.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
from serve_fixtures import ATTNBASE, MARKUP_MODEL, REPORT_HTML, RUN, SECRET

CONTRACT_PATHS = ["/healthz", "/api/metrics", "/api/runs", "/api/runs/{run}", "/api/runs/{run}/heads",
                  "/api/runs/{run}/heads/{layer}/{head}",
                  "/api/runs/{run}/heads/{layer}/{head}/pattern", "/api/sql", "/api/flows"]
RUNAWAY = ("select count(*) from row_stats a, row_stats b, row_stats c "
           "where a.entropy + b.entropy > c.entropy")


def sql_rows(db, query: str) -> list[dict]:
    """Rows as ``attnbase sql`` computes them (its function, in-process: no CLI start-up)."""
    from attnbase.warehouse.sandbox.sql import read_sql

    return read_sql(db, query).to_dicts()


def sql_cli(db, query: str, fmt: str = "json"):
    p = subprocess.run([str(ATTNBASE), "sql", "--db", str(db), query, "-f", fmt],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_url_line_and_health(server, client):
    assert server.first_line.startswith(f"attnbase serve: {server.url}/")
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_openapi_lists_the_contract(client):
    paths = client.get("/api/openapi.json").json()["paths"]
    assert set(CONTRACT_PATHS) <= set(paths)
    assert "sql" in json.dumps(paths["/api/sql"]["post"])


def test_runs_and_run(client, serve_db):
    runs = client.get("/api/runs").json()
    assert {r["run_id"] for r in runs} == {RUN, "markup-run"}
    row = next(r for r in runs if r["run_id"] == RUN)
    assert row["model"] == "tiny-gpt2" and row["n_layers"] == 4 and row["status"] == "complete"
    assert row["batches_done"] == row["batches_total"] == 2
    assert row["table1"]["key_norm_cv"] is not None
    assert [r["run_id"] for r in client.get("/api/runs", params={"status": "failed"}).json()] \
        == ["markup-run"]
    d = client.get(f"/api/runs/{RUN}").json()
    assert d["run"]["run_id"] == RUN and d["table1"]["run_id"] == RUN
    assert {"attn_logits", "tokens"} <= {a["name"] for a in d["arrays"]}
    cli = sql_rows(serve_db, f"select * from table1 where run_id = '{RUN}'")[0]
    assert d["table1"]["ve_at_8"] == pytest.approx(cli["ve_at_8"], rel=1e-12)
    assert d["reports"] == {"html": f"/reports/{RUN}/report.html", "pdf": None}
    assert any(s["kind"] == "distances" for s in d["studies"])


def test_heads_equal_head_summary(client, serve_db):
    heads = client.get(f"/api/runs/{RUN}/heads").json()
    cli = sql_rows(serve_db, f"select * from head_summary where run_id = '{RUN}' "
                                       "order by layer, head")
    assert len(heads) == 16 and len(cli) == 16
    for a, b in zip(heads, cli):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-12) if isinstance(b[k], float) else a[k] == b[k]


def test_head_api_and_page_equal_head_summary(client, serve_db):
    from attnbase.stats.views import HEAD_SUMMARY_METRICS
    from attnbase.serve.web import fmt_num

    summary = sql_rows(serve_db, f"select * from head_summary where run_id = '{RUN}' "
                                           "and layer = 2 and head = 1")[0]
    d = client.get(f"/api/runs/{RUN}/heads/2/1").json()
    assert (d["run_id"], d["layer"], d["head"]) == (RUN, 2, 1)
    present = [m for m in HEAD_SUMMARY_METRICS if summary[m] is not None]
    assert len(present) >= 6
    for m in present:
        assert d["metrics"][m] == pytest.approx(summary[m], rel=1e-12)
    # rank: 1 + the number of heads with a larger value (head_summary is the control)
    heads = sql_rows(serve_db, f"select mean_sink_mass v from head_summary "
                                         f"where run_id = '{RUN}'")
    larger = sum(h["v"] > summary["mean_sink_mass"] for h in heads)
    same = sum(h["v"] == summary["mean_sink_mass"] for h in heads)
    assert d["ranks"]["mean_sink_mass"] == {"rank": larger + 1, "of": 16, "ties": same}
    tests = {(t["metric"], t["null_model"]): t for t in d["null_tests"]}
    assert tests[("ve_at_8", "gauss")]["z"] == pytest.approx(summary["ve_gauss_z"], rel=1e-12)
    assert tests[("ve_at_8", "shuffle")]["q_value"] == pytest.approx(summary["ve_shuffle_q"])
    assert d["nearest"] and all((n["layer"], n["head"]) != (2, 1) for n in d["nearest"])
    assert {n["convention"] for n in d["nearest"]} == {"with_sink", "drop_sink"}
    assert d["cluster"] and all(c["size"] >= 1 for c in d["cluster"])
    # a clustering is claimed only where its k qualified (study_results k/<d> not null)
    ks = {(r["study_id"], r["key"].split("/")[1]): r["value"] for r in sql_rows(
        serve_db, "select study_id, key, value from study_results where key like 'k/%'")}
    assert [c["qualified"] for c in d["cluster"]] == [
        ks[(c["study_id"], c["dissimilarity"])] is not None for c in d["cluster"]]
    assert not any(c["qualified"] for c in d["cluster"])  # 16 heads: none qualifies here

    html = client.get(f"/runs/{RUN}/heads/2/1").text
    shown = dict(re.findall(r'data-metric="([a-z_0-9]+)">([^<]+)<', html))
    for m in present:
        assert shown[m] == fmt_num(summary[m])
    assert 'id="pattern"' in html and "&lt;|bos|&gt;" in html  # token labels, escaped
    cluster_rows = re.findall(r"<tr><td>clusters-.*?</tr>", html.split('id="cluster"')[1])
    assert len(cluster_rows) == len(d["cluster"])
    for c, row in zip(d["cluster"], cluster_rows):
        assert ("no clustering to compare" in row) == (not c["qualified"]), row


def test_head_page_rank_names_ties(client, serve_db):
    """A metric with one value for every head (VE@8's Gaussian null depends on d_head and T
    only) is not ranked "1 of N" on the head page; ties are counted against head_summary."""
    metrics = ["mean_sink_mass", "ve_gauss"]
    heads = sql_rows(serve_db, f"select layer, head, {', '.join(metrics)} from head_summary "
                               f"where run_id = '{RUN}'")
    assert len({h["ve_gauss"] for h in heads}) == 1  # the fixture's control: all tied
    me = next(h for h in heads if (h["layer"], h["head"]) == (2, 1))
    d = client.get(f"/api/runs/{RUN}/heads/2/1").json()
    html = client.get(f"/runs/{RUN}/heads/2/1").text
    # the rank is the row's last cell (after value and unit)
    rows = dict(re.findall(r'data-metric="([a-z_0-9]+)">.*?<td>([^<]*)</td></tr>', html))
    for m in metrics:
        ties = sum(h[m] == me[m] for h in heads)
        assert d["ranks"][m]["ties"] == ties
    assert rows["ve_gauss"] == "the same for all 16 heads"
    assert rows["mean_sink_mass"] == f"{d['ranks']['mean_sink_mass']['rank']} of 16"


def test_nearest_are_the_k_closest_distinct_heads(client, serve_db):
    """Each (study, dissimilarity, convention) lists the NEAREST_K closest *other* heads, each
    once, against a brute-force ranking of head_distances (which holds every pair in both
    orders and the diagonal: a ranking that kept both orders showed 3 heads of 5)."""
    from attnbase.serve.heads import NEAREST_K

    d = client.get(f"/api/runs/{RUN}/heads/2/1").json()
    dist = sql_rows(serve_db, "select study_id, dissimilarity, convention, layer_b l, head_b h, "
                              "value from head_distances where layer_a = 2 and head_a = 1 and "
                              "not (layer_b = 2 and head_b = 1)")
    want: dict[tuple, list] = {}
    for r in sorted(dist, key=lambda r: (r["value"], r["l"], r["h"])):
        want.setdefault((r["study_id"], r["dissimilarity"], r["convention"]), []).append(
            (r["l"], r["h"], r["value"]))
    got: dict[tuple, list] = {}
    for n in d["nearest"]:
        got.setdefault((n["study_id"], n["dissimilarity"], n["convention"]), []).append(
            (n["layer"], n["head"], n["value"]))
    assert got.keys() == want.keys() and len(got) >= 2
    for key, rows in got.items():
        assert len(rows) == NEAREST_K == len(set(r[:2] for r in rows)), key
        assert [r[:2] for r in rows] == [r[:2] for r in want[key][:NEAREST_K]], key
        assert [r[2] for r in rows] == pytest.approx([r[2] for r in want[key][:NEAREST_K]])
    sizes = sql_rows(serve_db, "select study_id, dissimilarity, convention, cluster, count(*) n "
                               "from head_clusters group by all")
    size = {(r["study_id"], r["dissimilarity"], r["convention"], r["cluster"]): r["n"]
            for r in sizes}
    for c in d["cluster"]:
        assert c["size"] == size[(c["study_id"], c["dissimilarity"], c["convention"],
                                  c["cluster"])]


def _softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - np.max(np.where(np.isfinite(x), x, -np.inf), axis=-1, keepdims=True))
    e[~np.isfinite(x)] = 0
    return e / e.sum(-1, keepdims=True)


def test_pattern_is_softmax_of_stored_logits(client, serve_db):
    import attnbase

    ds = attnbase.open_run(serve_db, RUN)
    logits = ds.attn_logits.isel(layer=3, head=2, seq=5).values
    want = _softmax(logits)
    r = client.get(f"/api/runs/{RUN}/heads/3/2/pattern", params={"seq": 5})
    assert r.status_code == 200
    d = r.json()
    got = np.array(d["probs"], dtype=float)
    assert d["seq"] == 5 and got.shape == (16, 16)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert np.all(got[np.triu_indices(16, 1)] == 0)  # causal: masked keys are 0
    np.testing.assert_allclose(got.sum(1), 1, atol=1e-12)
    assert d["tokens"][0] == "<|bos|>" and len(d["tokens"]) == 16
    assert d["token_ids"] == [int(t) for t in ds.tokens.isel(seq=5).values]
    # the tokens are text (byte-level marks decoded, whitespace visible), ids beside them
    from attnbase.tokentext import token_texts, tokenizer_for

    assert d["tokens"] == token_texts(tokenizer_for("tiny-gpt2"), d["token_ids"])
    assert not any("Ġ" in t or "Ċ" in t for t in d["tokens"])
    assert any(t.startswith("␣") for t in d["tokens"])
    # negative control: another head's pattern on the same sequence differs
    other = np.array(client.get(f"/api/runs/{RUN}/heads/3/1/pattern",
                                params={"seq": 5}).json()["probs"], dtype=float)
    assert np.abs(other - got).max() > 1e-3
    # drop_sink: renormalised without key 0 (docs/metrics.md §4); query 0 has only the sink: null
    drop = client.get(f"/api/runs/{RUN}/heads/3/2/pattern",
                      params={"seq": 5, "convention": "drop_sink"}).json()["probs"]
    assert all(v is None for v in drop[0])
    drop = np.array(drop[1:], dtype=float)
    np.testing.assert_allclose(drop[:, 1:], want[1:, 1:] / (1 - want[1:, :1]), rtol=1e-12)
    assert np.all(drop[:, 0] == 0)
    np.testing.assert_allclose(drop.sum(1), 1, atol=1e-12)


@pytest.mark.parametrize("path, needle", [
    ("/api/runs/nope", "known runs: markup-run, tiny-a"),
    ("/api/runs/nope/heads", "known runs"),
    (f"/api/runs/{RUN}/heads/4/0", "no layer 4 (valid: 0..3)"),
    (f"/api/runs/{RUN}/heads/0/7", "no head 7 (valid: 0..3)"),
    (f"/api/runs/{RUN}/heads/-1/0", "no layer -1 (valid: 0..3)"),
    (f"/api/runs/{RUN}/heads/0/0/pattern?seq=8", "no sequence 8 (valid: 0..7)"),
    (f"/api/runs/{RUN}/heads/0/0/pattern?seq=0&convention=nosink",
     "unknown convention 'nosink' (valid: with_sink, drop_sink)"),
    ("/api/nothing", "no page"),
])
def test_api_404_names_the_range(client, path, needle):
    r = client.get(path)
    assert r.status_code == 404 and needle in r.json()["detail"]


@pytest.mark.parametrize("path, needle", [
    ("/runs/nope", "known runs"),
    (f"/runs/{RUN}/heads/9/0", "no layer 9 (valid: 0..3)"),
    (f"/runs/{RUN}/heads/0/0?seq=99", "no sequence 99 (valid: 0..7)"),
    (f"/runs/{RUN}?metric=bogus", "no head metric 'bogus'"),
])
def test_page_404_is_html(client, path, needle):
    r = client.get(path)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert needle.replace("'", "&#39;") in r.text


def test_pages_render_and_escape(client):
    index = client.get("/")
    assert index.status_code == 200 and f'href="/runs/{RUN}"' in index.text
    assert MARKUP_MODEL not in index.text and "&lt;script&gt;alert(&#34;x&#34;)" in index.text
    assert "<script>alert" not in client.get("/runs/markup-run").text
    filtered = client.get("/", params={"model": "tiny-gpt2"}).text
    assert f'href="/runs/{RUN}"' in filtered and 'href="/runs/markup-run"' not in filtered
    run = client.get(f"/runs/{RUN}", params={"metric": "z:ve_at_8/gauss"}).text
    assert run.count('class="cell"') == 16 and run.count("<svg") >= 4
    assert f'href="/runs/{RUN}/heads/3/3"' in run and f"/reports/{RUN}/report.html" in run
    assert "cdn" not in run.lower() and "http://" not in run.split("<svg")[0]
    compare = client.get("/compare", params={"runs": f"{RUN},markup-run"})
    assert compare.status_code == 200 and "key_norm_cv" in compare.text
    sql = client.get("/sql", params={"sql": "select 1 + 1 as two"})
    assert sql.status_code == 200 and "<th>two</th>" in sql.text and "row_stats" in sql.text
    assert client.get("/static/app.js").status_code == 200


def test_pages_show_metrics_by_the_registry(client):
    """The pages label, unit and format metric names from attnbase/metrics.py, as
    ``/api/metrics`` lists it; the JSON twins key the same values by name."""
    from markupsafe import escape

    from attnbase.metrics import METRICS, RUN_LIST_COLUMNS
    from attnbase.serve.web import fmt_num

    listed = client.get("/api/metrics").json()
    assert [m["name"] for m in listed] == list(METRICS)
    assert all((m["label"], m["unit"], m["digits"]) == (METRICS[m["name"]].label,
               METRICS[m["name"]].unit, METRICS[m["name"]].digits) for m in listed)
    index = client.get("/").text
    for name in RUN_LIST_COLUMNS:
        m = METRICS[name]
        assert f'<th title="{name} ({escape(m.unit)})">{escape(m.label)}</th>' in index, name
    table1 = client.get(f"/api/runs/{RUN}").json()["table1"]
    run = client.get(f"/runs/{RUN}").text
    shown = [k for k in table1 if k in METRICS]
    assert len(shown) >= 9
    for k in shown:
        m = METRICS[k]
        assert (f'<th title="{k}">{escape(m.label)}</th><td>{fmt_num(table1[k], k)}</td>'
                f"<td>{escape(m.unit)}</td>") in run, k
    head = client.get(f"/runs/{RUN}/heads/2/1").text
    metrics = client.get(f"/api/runs/{RUN}/heads/2/1").json()["metrics"]
    assert metrics and all(f'<th title="{k}">{escape(METRICS[k].label)}</th>' in head
                           for k in metrics)
    # no page shows a bare name as a header (parameters such as draws are also null_tests
    # columns)
    assert [k for k, m in METRICS.items() for page in (index, run, head)
            if not m.parameter and f"<th>{k}</th>" in page] == []


def test_etag_follows_the_catalog(client):
    r = client.get("/api/runs")
    tag = r.headers["etag"]
    assert client.get("/api/runs", headers={"If-None-Match": tag}).status_code == 304
    assert client.get(f"/runs/{RUN}", headers={"If-None-Match": tag}).status_code == 304


def test_sql_json_csv_parquet(client, serve_db):
    r = client.post("/api/sql", json={"sql": "select run_id, n_seqs from runs order by 1"})
    d = r.json()
    assert r.status_code == 200 and d["columns"] == ["run_id", "n_seqs"]
    assert d["rows"] == [["markup-run", 8], [RUN, 8]] and d["truncated"] is False
    assert d["elapsed_ms"] > 0
    d = client.post("/api/sql", json={"sql": "select * from row_stats", "max_rows": 7}).json()
    assert len(d["rows"]) == 7 and d["truncated"] is True
    # the server's row cap (10,000) holds whatever a request asks
    d = client.post("/api/sql", json={"sql": "select * from range(20000)",
                                      "max_rows": 50000}).json()
    assert len(d["rows"]) == 10_000 and d["truncated"] is True
    q = "select layer, head, avg(sink_mass) m from row_stats group by 1, 2 order by 1, 2"
    csv = client.post("/api/sql", json={"sql": q, "format": "csv"})
    assert csv.headers["content-type"].startswith("text/csv")
    import io

    import polars as pl

    got = pl.read_csv(io.StringIO(csv.text))
    want = pl.DataFrame(sql_rows(serve_db, q))
    assert got.shape == want.shape == (16, 3)
    np.testing.assert_allclose(got["m"].to_numpy(), want["m"].to_numpy(), rtol=1e-12)
    pq = client.post("/api/sql", json={"sql": q, "format": "parquet"})
    assert pl.read_parquet(io.BytesIO(pq.content)).shape == (16, 3)
    dl = client.get("/sql/download", params={"sql": q, "format": "csv"})
    assert "attachment" in dl.headers["content-disposition"]
    # avg() over parallel threads sums in varying order: equal to the last few ulps
    np.testing.assert_allclose(pl.read_csv(io.StringIO(dl.text))["m"].to_numpy(),
                               want["m"].to_numpy(), rtol=1e-12)


def test_arrow_equals_attnbase_sql(client, serve_db):
    import pyarrow as pa
    import polars as pl

    q = (f"select layer, head, seq, query, sink_mass, entropy from row_stats "
         f"where run_id = '{RUN}' order by all")
    r = client.post("/api/sql", json={"sql": q, "format": "arrow"})
    assert r.headers["content-type"] == "application/vnd.apache.arrow.stream"
    got = pl.from_arrow(pa.ipc.open_stream(r.content).read_all())
    want = pl.DataFrame(json.loads(sql_cli(serve_db, q)))
    assert got.height == want.height == 4 * 4 * 8 * 16
    assert got.columns == want.columns
    for c in got.columns:
        np.testing.assert_array_equal(got[c].to_numpy(), want[c].to_numpy())


@pytest.mark.parametrize("sql, code, needle", [
    ("selec 1", 400, 'SQL error: Parser Error: syntax error at or near "selec"'),
    ("select * from no_such_table", 400, "Catalog Error"),
    ("drop table runs", 403, "read-only"),
    ("insert into runs (run_id) values ('x')", 403, "read-only"),
    ("attach 'x.duckdb' as x", 403, "read-only"),
    ("copy runs to 'out.csv'", 403, "read-only"),
    ("select * from read_csv('/etc/passwd')", 403, "reads only the catalog"),
    ("select * from read_text('secret.txt')", 403, "reads only the catalog"),
    ("select * from glob('*')", 403, "reads only the catalog"),
])
def test_sql_errors(client, serve_db, sql, code, needle):
    r = client.post("/api/sql", json={"sql": sql})
    assert r.status_code == code, r.text
    detail = r.json()["detail"]
    assert needle in detail and "\n" not in detail
    assert not (serve_db / "out.csv").exists() and not (serve_db / "x.duckdb").exists()


def test_oversized_body_refused(client):
    r = client.post("/api/sql", content=b'{"sql": "' + b"a" * 100_000 + b'"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]


def test_runaway_stopped_at_limit_while_others_answered(client, server):
    import httpx

    out = {}

    def runaway():
        t0 = time.monotonic()
        r = httpx.post(server.url + "/api/sql", json={"sql": RUNAWAY}, timeout=30)
        out["runaway"] = (r.status_code, r.json()["detail"], time.monotonic() - t0)

    t = threading.Thread(target=runaway)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    r = client.post("/api/sql", json={"sql": "select count(*) from runs"})
    second = time.monotonic() - t0
    page = client.get(f"/api/runs/{RUN}/heads/1/1")
    t.join(20)
    assert r.status_code == 200 and r.json()["rows"] == [[2]] and page.status_code == 200
    code, detail, took = out["runaway"]
    print(f"\nrunaway cross join stopped after {took:.2f} s at its 1 s limit; a second "
          f"client's query answered in {second * 1000:.0f} ms meanwhile")
    assert code == 400 and "time limit of 1000 ms" in detail
    assert took < 1.5, f"runaway query stopped after {took:.2f} s"
    assert second < 0.8, f"second client waited {second:.2f} s"
    # a request may lower the limit, never raise it
    t0 = time.monotonic()
    r = client.post("/api/sql", json={"sql": RUNAWAY, "timeout_ms": 200})
    assert r.status_code == 400 and "200 ms" in r.json()["detail"] and time.monotonic() - t0 < 0.8
    t0 = time.monotonic()
    r = client.post("/api/sql", json={"sql": RUNAWAY, "timeout_ms": 60_000})
    assert "1000 ms" in r.json()["detail"] and time.monotonic() - t0 < 1.5


def test_pages_never_wait_behind_a_full_query_pool(client, server):
    """``sql_concurrency`` runaway queries fill the queries' pool; a page and a pattern are
    still answered at once (their threads are not the queries'), and one more query waits for
    a free slot instead of running beside them."""
    import httpx

    from attnbase.serve.settings import Settings

    n = Settings(db=server.db).sql_concurrency
    # warm: the first pattern of a server imports torch (derived logits), seconds on 2 cores
    assert client.get(f"/runs/{RUN}/heads/1/1").status_code == 200
    done = []

    def runaway():
        done.append(httpx.post(server.url + "/api/sql", json={"sql": RUNAWAY}, timeout=30))

    extra = {}

    def one_more():
        extra["r"] = httpx.post(server.url + "/api/sql", json={"sql": "select count(*) from runs"},
                                timeout=30)
        extra["at"] = time.monotonic() - started

    threads = [threading.Thread(target=runaway) for _ in range(n)]
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(0.3)
    threads.append(threading.Thread(target=one_more))
    threads[-1].start()
    t0 = time.monotonic()
    page = client.get(f"/runs/{RUN}/heads/1/1")
    pattern = client.get(f"/api/runs/{RUN}/heads/1/1/pattern", params={"seq": 1})
    pages_s = time.monotonic() - t0
    for t in threads:
        t.join(20)
    assert page.status_code == pattern.status_code == extra["r"].status_code == 200
    assert [r.status_code for r in done] == [400] * n
    assert pages_s < 0.6, f"pages waited {pages_s:.2f} s behind {n} queries"
    # control: the pool is real; the extra query had no slot before a runaway hit its 1 s limit
    assert extra["at"] >= 1.0, f"the extra query ran beside a full pool ({extra['at']:.2f} s)"


def _raw_get(port: int, path: str) -> tuple[int, bytes]:
    """GET with the path exactly as written (httpx would normalise ``..``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize("path", [
    "/reports/../catalog.duckdb", "/reports/%2e%2e/catalog.duckdb", "/reports/..%2fcatalog.duckdb",
    "/reports/%2E%2E%2Fcatalog.duckdb", f"/reports/{RUN}/../../catalog.duckdb",
    f"/reports/{RUN}/..%2f..%2fcatalog.duckdb", f"/reports/{RUN}/%2e%2e%2f%2e%2e%2fsecret.txt",
    "/reports/..%5c..%5csecret.txt", f"/reports/{RUN}/report.html%00.txt",
    "/reports/%252e%252e/catalog.duckdb", "/reports/catalog.duckdb", "/reports/secret.txt",
    f"/reports/{RUN}/secret.txt", "/reports/../../../../etc/passwd", "//reports/../secret.txt",
    f"/reports/{RUN}/report.pdf", "/reports/markup-run/report.html",
])
def test_reports_traversal_is_404(server, path):
    code, body = _raw_get(server.port, path)
    assert code == 404, (path, code)
    assert SECRET.encode() not in body and b"DUCK" not in body and b"root:" not in body


def test_stored_report_is_served(client):
    r = client.get(f"/reports/{RUN}/report.html")
    assert r.status_code == 200 and r.text == REPORT_HTML


def test_serve_refuses_bad_hosts_and_ports(cli, serve_db, server, tmp_path):
    code, out, err = cli("serve", "--db", serve_db, "--host", "0.0.0.0", "--port", "1")
    assert code == 2 and err.count("\n") == 1 and "attnbase token create --db" in err
    code, _, err = cli("serve", "--db", serve_db, "--port", server.port)  # taken by the server
    assert code == 2 and err.count("\n") == 1 and "cannot listen on 127.0.0.1" in err
    code, _, err = cli("serve", "--db", tmp_path / "none")
    assert code == 2 and "no attnbase database" in err and not (tmp_path / "none").exists()


def test_python_client(server, serve_db):
    import attnbase

    with attnbase.connect(server.url) as svc:
        assert set(svc.runs()["run_id"]) == {RUN, "markup-run"}
        df = svc.sql(f"select layer, count(*) n from row_stats where run_id = '{RUN}' "
                     "group by 1 order by 1")
        assert df["n"].to_list() == [4 * 8 * 16] * 4
        assert svc.head(RUN, 0, 0)["layer"] == 0
        from attnbase.serve.client import ServiceError

        with pytest.raises(ServiceError, match="403 attnbase sql is read-only"):
            svc.sql("drop table runs")


def test_server_connections_have_the_limits(serve_db):
    """The service's own connections (pages, patterns): the sandbox and the resource limits.
    Read in-process: a user's query may not read settings (the next test)."""
    from attnbase.serve.catalog import FileCatalog as Catalog
    from attnbase.serve.settings import Settings

    cat = Catalog(Settings(db=serve_db))
    try:
        t, m, e, lock, mem, pmc = cat.rows(
            "select current_setting('threads') t, current_setting('max_temp_directory_size') m, "
            "current_setting('enable_external_access') e, current_setting('lock_configuration') "
            "l, current_setting('memory_limit') mem, current_setting('parquet_metadata_cache') p"
        )[0].values()
    finally:
        cat.close()
    assert (t, m, e, lock, pmc) == (2, "0 bytes", False, True, True)
    assert mem.endswith("GiB") and 1.7 <= float(mem.split()[0]) <= 2.0  # "2GB", shown in GiB


def test_user_queries_cannot_read_settings(client):
    r = client.post("/api/sql", json={"sql": "select current_setting('memory_limit')"})
    assert r.status_code == 403 and "current_setting" in r.json()["detail"]


def test_chunked_oversized_body_refused(client):
    def body():
        yield b'{"sql": "'
        for _ in range(20):
            yield b"a" * 8192
        yield b'"}'

    r = client.post("/api/sql", content=body(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_vectorised_colours_are_the_scalar_ones():
    """The pattern's colours (one numpy pass) are :func:`colour`'s strings, value by value:
    missing values grey, out-of-range clipped, a flat scale (hi <= lo) at its middle."""
    from attnbase.serve.colours import colour, colours

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-0.5, 1.5, 500), [np.nan, np.inf, -np.inf, 0.0, 1.0, 0.5]])
    for lo, hi in ((0.0, 1.0), (0.2, 0.7), (0.3, 0.3), (1.0, 0.0)):
        want = [colour(float(v) if np.isfinite(v) else None, lo, hi) for v in x]
        assert colours(x, lo, hi).tolist() == want


def test_head_page_row_stats_are_the_stored_rows(client, serve_db):
    """The head page's row statistics of a sequence (read from its batch file) are the
    ``row_stats`` rows of that head and sequence, query by query, as `attnbase sql` reads them
    (sequence 5 lies in the second batch)."""
    from attnbase.serve.web import fmt_num

    html = client.get(f"/runs/{RUN}/heads/2/1", params={"seq": 5}).text
    table = html[html.index('id="row-stats"'):]
    table = table[:table.index("</table>")]
    shown = [re.findall(r"<td>([^<]*)</td>", row) for row in table.split("<tr>")[2:]]
    want = sql_rows(serve_db, f"select query, n_keys, sink_mass, entropy, max_prob, argmax "
                              f"from row_stats where run_id = '{RUN}' and layer = 2 and head = 1 "
                              "and seq = 5 order by query")
    assert len(want) > 4 and len(shown) == len(want)
    for cells, r in zip(shown, want):
        assert [cells[0], cells[2], cells[3], cells[4], cells[5], cells[6]] == [
            str(r["query"]), str(r["n_keys"]), fmt_num(r["sink_mass"]), fmt_num(r["entropy"]),
            fmt_num(r["max_prob"]), str(r["argmax"])]


def test_every_connection_caches_parquet_footers(serve_db):
    """The statistics files' footers are cached on every connection of the service, not only the
    one that set it (a plain SET of this setting is session-scoped: the requests' cursors had it
    off); the sandbox's lock holds there too."""
    from attnbase.serve.catalog import FileCatalog as Catalog
    from attnbase.serve.settings import Settings

    cat = Catalog(Settings(db=serve_db))
    try:
        got = []
        for _ in range(2):  # two sessions: two cursors of the snapshot's connection
            with cat.session():
                got.append(list(cat.rows(
                    "select current_setting('parquet_metadata_cache') a, "
                    "current_setting('lock_configuration') b, "
                    "current_setting('enable_external_access') c")[0].values()))
    finally:
        cat.close()
    assert got == [[True, True, False]] * 2
