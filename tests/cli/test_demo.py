"""``attnbase demo`` end to end (slow: real MiniLM and SmolLM2-135M weights, ~1-2 min)."""

from __future__ import annotations

import pytest

from attnbase.commands.demo import DEMO_RUNS, run_demo
from attnbase.warehouse.sandbox.sql import read_sql


@pytest.mark.slow
def test_demo_report_compares_encoder_and_causal_lm_with_every_study(tmp_path):
    db = tmp_path / "db"
    html = run_demo(db)
    text = html.read_text()
    assert html.with_suffix(".pdf").stat().st_size > 0
    for run_id, *_ in DEMO_RUNS:
        assert run_id in text  # both Table-1 rows, side by side
    for title in ("Convention dependence", "Attention path products",
                  "Routing vs filtering", "Rank collapse across depth"):
        assert title in text
    kinds = set(read_sql(db, "SELECT DISTINCT kind FROM studies")["kind"].to_list())
    assert kinds >= {"distances", "reversal", "clusters", "paths", "prune", "entropy_change"}
    assert 'id="left-out"' not in text  # every section the report knows has its study
    weights = read_sql(db, "SELECT count(*) AS n FROM runs WHERE run_id LIKE '%-weights'")
    assert weights["n"][0] == len(DEMO_RUNS)
