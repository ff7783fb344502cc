"""The people-facing views of the stats stage: ``head_summary`` and ``table1``.

Created by the stats migration (:mod:`attnbase.stats.migrations`, version 100). The column lists
are fixed (not a dynamic PIVOT) so that reports and users can rely on them; a metric added later
gets a new migration that replaces the view.
"""

from __future__ import annotations

from attnbase.metrics import HEAD_SUMMARY, METRICS, NULL_MEANS, NULL_TESTED, TABLE1, TABLE1_EXTRAS

#: head_metrics names pivoted into head_summary columns, in order (:mod:`attnbase.metrics`).
HEAD_SUMMARY_METRICS: tuple[str, ...] = HEAD_SUMMARY
#: run_metrics names that make the Table-1 row, then the extras reported alongside.
TABLE1_METRICS: tuple[str, ...] = TABLE1
TABLE1_EXTRAS_METRICS: tuple[str, ...] = TABLE1_EXTRAS

#: metrics shown as integers (no digits after the point)
_INTEGER_METRICS = {name for name, m in METRICS.items() if m.digits == 0}


def _null_columns() -> str:
    """The null tests' p, q and z of :data:`~attnbase.metrics.NULL_TESTED` per null model."""
    cols = [f"max({col}) FILTER (WHERE metric = '{NULL_TESTED}' AND null_model = '{null}') "
            f"AS {mean}_{suffix}"
            for col, suffix in (("p_value", "p"), ("q_value", "q"), ("z", "z"))
            for null, mean in NULL_MEANS.items()]
    return ",\n       ".join(cols)


def _pivot(metrics, source: str = "m") -> str:
    cols = []
    for name in metrics:
        expr = f"max({source}.value) FILTER (WHERE {source}.metric = '{name}')"
        if name in _INTEGER_METRICS:
            expr = f"CAST({expr} AS INTEGER)"
        cols.append(f"{expr} AS {name}")
    return ",\n       ".join(cols)


#: One wide row per (run_id, layer, head): the head metrics plus the VE@8 null tests' p-values,
#: q-values and z-scores (null_tests.null_model since warehouse migration 10; stats migration 101).
HEAD_SUMMARY_SQL = f"""
CREATE OR REPLACE VIEW head_summary AS
WITH wide AS (
SELECT m.run_id, m.layer, m.head,
       {_pivot(HEAD_SUMMARY_METRICS)}
FROM head_metrics m
GROUP BY m.run_id, m.layer, m.head
), tests AS (
SELECT run_id, layer, head,
       {_null_columns()}
FROM null_tests
GROUP BY run_id, layer, head
)
SELECT wide.*, tests.ve_gauss_p, tests.ve_gauss_q, tests.ve_shuffle_p, tests.ve_shuffle_q,
       tests.ve_gauss_z, tests.ve_shuffle_z
FROM wide LEFT JOIN tests USING (run_id, layer, head)
"""

#: One row per analysed run: the Table-1 columns, then extras and the model revision.
TABLE1_SQL = f"""
CREATE OR REPLACE VIEW table1 AS
SELECT r.run_id, r.model, r.n_layers, r.d_head,
       {_pivot(TABLE1_METRICS + TABLE1_EXTRAS_METRICS)},
       r.model_revision
FROM runs r JOIN run_metrics m USING (run_id)
GROUP BY r.run_id, r.model, r.n_layers, r.d_head, r.model_revision
"""

VIEW_SQL: tuple[str, ...] = (HEAD_SUMMARY_SQL, TABLE1_SQL)


def create_views(con) -> None:
    """(Re)create ``head_summary`` and ``table1`` on an open DuckDB connection."""
    for stmt in VIEW_SQL:
        con.execute(stmt)
