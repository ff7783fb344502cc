"""The run page's massive activations (docs/metrics.md §6b) against the real server of
tests/serve/conftest.py: one row per hidden state, the numbers of the API's layer_metrics, the
token at the largest activation as text."""

from __future__ import annotations

import html
import re

from serve_fixtures import RUN


def _table(html: str) -> list[list[str]]:
    t = re.search(r'<table class="data" id="massive">(.*?)</table>', html, re.S).group(1)
    return [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)
            for row in re.findall(r"<tr>(.*?)</tr>", t, re.S)[1:]]


def test_run_page_has_a_row_of_massive_activations_per_hidden_state(client):
    from attnbase.metrics import N
    from attnbase.serve.web import fmt_num
    from attnbase.tokentext import token_labels

    d = client.get(f"/api/runs/{RUN}").json()
    lm = d["layer_metrics"]
    rows = _table(client.get(f"/runs/{RUN}").text)
    assert len(rows) == d["run"]["n_layers"] + 1 == len(lm[N.massive_top1])
    for row in rows:
        layer = row[0].removeprefix("H")
        assert row[1] == fmt_num(lm[N.massive_top1][layer], N.massive_top1)
        assert row[5] == fmt_num(lm[N.massive_ratio][layer], N.massive_ratio)
        seq, pos, dim = (int(lm[n][layer]) for n in (N.massive_seq, N.massive_pos, N.massive_dim))
        assert row[6] == f"({seq}, {pos}, {dim})"
        want = token_labels(d["run"]["model"], [int(lm[N.massive_token][layer])])[0][0]
        assert html.unescape(row[7]) == f"<code>{want}</code>"  # escaped: text, not markup
        # a random-init tiny model has no massive activation (its ratio is far below 1,000)
        assert row[9] == "no" and lm[N.massive_flag][layer] == 0
