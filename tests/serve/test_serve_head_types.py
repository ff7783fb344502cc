"""The head taxonomy on the service: the API's head metrics and the head page's "types at a
glance" line (docs/metrics.md §3b), against the real server of tests/serve/conftest.py."""

from __future__ import annotations

import re

from serve_fixtures import RUN


def test_head_types_in_the_api_and_at_a_glance_on_the_page(client, serve_db):
    """The head taxonomy scores (docs/metrics.md §3b) are head metrics like any other: in the
    API, the metrics table and the page's "types at a glance" line, by the registry's label."""
    from attnbase.metrics import HEAD_TYPES, label
    from attnbase.serve.web import fmt_num

    d = client.get(f"/api/runs/{RUN}/heads/2/1").json()
    assert all(d["metrics"].get(m) is not None for m in HEAD_TYPES)
    assert all(0.0 <= d["metrics"][m] <= 1.0 for m in HEAD_TYPES)
    html = client.get(f"/runs/{RUN}/heads/2/1").text
    glance = re.search(r'<p id="head-types">(.*?)</p>', html).group(1)
    for m in HEAD_TYPES:
        assert f"{label(m)} {fmt_num(d['metrics'][m])}" in glance
    shown = dict(re.findall(r'data-metric="([a-z_0-9]+)">([^<]+)<', html))
    assert all(shown[m] == fmt_num(d["metrics"][m]) for m in HEAD_TYPES)
