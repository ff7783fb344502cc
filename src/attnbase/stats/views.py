"""The people-facing views of the stats stage: ``head_summary`` and ``table1``.

Created by the stats migration (:mod:`attnbase.stats.migrations`, version 100). The column lists
are fixed (not a dynamic PIVOT) so that reports and users can rely on them; a metric added later
gets a new migration that replaces the view.
"""

from __future__ import annotations

#: head_metrics names pivoted into head_summary columns, in order.
HEAD_SUMMARY_METRICS: tuple[str, ...] = (
    "key_norm_cv",
    "key_norm_cv_excl_sink",
    "ve_at_8",
    "ve_gauss",
    "ve_shuffle",
    "max_share",
    "row_max_share",
    "mean_sink_mass",
)

#: run_metrics names that make the Table-1 row ("All Routes Lead to Collapse", Table 1), in order,
#: then the extras this project reports alongside.
TABLE1_METRICS: tuple[str, ...] = (
    "key_norm_cv",
    "key_norm_cv_baseline",
    "ve_at_8",
    "ve_gauss",
    "ve_shuffle",
    "onset_layer",
    "onset_depth",
    "r_cv_share",
    "r_cv_share_p",
)
TABLE1_EXTRAS: tuple[str, ...] = (
    "r_cv_share_ci_low",
    "r_cv_share_ci_high",
    "r_cv_share_spearman",
)

_INTEGER_METRICS = {"onset_layer"}


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
       max(p_value) FILTER (WHERE metric = 've_at_8' AND null_model = 'gauss') AS ve_gauss_p,
       max(q_value) FILTER (WHERE metric = 've_at_8' AND null_model = 'gauss') AS ve_gauss_q,
       max(p_value) FILTER (WHERE metric = 've_at_8' AND null_model = 'shuffle') AS ve_shuffle_p,
       max(q_value) FILTER (WHERE metric = 've_at_8' AND null_model = 'shuffle') AS ve_shuffle_q,
       max(z) FILTER (WHERE metric = 've_at_8' AND null_model = 'gauss') AS ve_gauss_z,
       max(z) FILTER (WHERE metric = 've_at_8' AND null_model = 'shuffle') AS ve_shuffle_z
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
       {_pivot(TABLE1_METRICS + TABLE1_EXTRAS)},
       r.model_revision
FROM runs r JOIN run_metrics m USING (run_id)
GROUP BY r.run_id, r.model, r.n_layers, r.d_head, r.model_revision
"""

VIEW_SQL: tuple[str, ...] = (HEAD_SUMMARY_SQL, TABLE1_SQL)


def create_views(con) -> None:
    """(Re)create ``head_summary`` and ``table1`` on an open DuckDB connection."""
    for stmt in VIEW_SQL:
        con.execute(stmt)
