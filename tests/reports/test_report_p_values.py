"""The report never prints a p-value as "0" (docs/metrics.md §8): the Table-1 row's
r_cv_share_p stored as 0 (an underflow) is the bound "< 1e-300"."""

from __future__ import annotations

from types import SimpleNamespace

from attnbase.metrics import N


def _run(p):
    return SimpleNamespace(run_id="r1", run={"model": "m"},
                           run_metrics={N.r_cv_share: 0.97, N.r_cv_share_p: p})


def test_table1_row_writes_an_underflowed_p_as_a_bound():
    from attnbase.reports.sections import TABLE1, table1_row

    col = [m for m, _ in TABLE1].index(N.r_cv_share_p) + 2
    assert table1_row(_run(0.0))[col] == "< 1e-300"
    assert table1_row(_run(0.0123))[col] == "0.0123"  # a p-value above 0: its digits
    assert table1_row(_run(0.0))[col - 1] == "0.97"  # r itself is no p-value
