"""A MiniLM head page's numbers equal ``head_summary`` (slow: a real MiniLM extraction)."""

from __future__ import annotations

import re

import httpx
import pytest
from serve_fixtures import Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm_server(tmp_path_factory):
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.stats.analyze import analyze_run
    from attnbase.warehouse import Database

    db = Database(tmp_path_factory.mktemp("minilm") / "db")
    extract_run(db, "m", ExtractConfig(model="minilm", corpus="default", n_seqs=8, seq_len=32,
                                       batch_size=8, device="cpu"), progress=False)
    analyze_run(db, "m", draws=20, gauss_draws=20, seed=0, n_boot=200)
    srv = Server(db.path)
    yield srv, db.path
    srv.stop()


def test_minilm_head_page_equals_head_summary(minilm_server):
    from attnbase.serve.web import fmt_num
    from attnbase.stats.views import HEAD_SUMMARY_METRICS
    from attnbase.warehouse.sandbox.sql import read_sql

    srv, db = minilm_server
    rows = read_sql(db, "select * from head_summary where run_id = 'm' order by layer, head")
    assert rows.height == 6 * 12
    for row in rows.filter(rows["layer"].is_in([1, 4])).head(6).to_dicts():
        html = httpx.get(f"{srv.url}/runs/m/heads/{row['layer']}/{row['head']}", timeout=30).text
        shown = dict(re.findall(r'data-metric="([a-z_0-9]+)">([^<]+)<', html))
        api = httpx.get(f"{srv.url}/api/runs/m/heads/{row['layer']}/{row['head']}").json()
        for m in HEAD_SUMMARY_METRICS:
            if row[m] is not None:
                assert shown[m] == fmt_num(row[m])
                assert api["metrics"][m] == pytest.approx(row[m], rel=1e-12)
        assert "[CLS]" in html  # MiniLM's token strings on the pattern's axes
