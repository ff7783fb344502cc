"""SQL over the catalog for the attention-side statistics (docs/metrics.md §3).

``row_stats`` / ``col_stats`` hold one row per attention row / per (sequence, key) of every head,
so the concentration aggregates are DuckDB queries, never Python loops; the numpy definitions in
:mod:`attnbase.stats.concentration` are their reference (tests hold them to parity).

Named parameters: ``$run`` (run id), ``$min_query`` (first query row of ``row_max_share``),
``$threshold`` (onset threshold).
"""

from __future__ import annotations

from attnbase.metrics import METRICS, N

#: Per (layer, head): ``max_share`` = max_key sum_seq received / number of query rows,
#: ``row_max_share`` = mean of max_prob over rows with query >= $min_query,
#: ``mean_sink_mass`` = mean of sink_mass over every row. Tidy: (layer, head, metric, value).
HEAD_CONCENTRATION_SQL = """
WITH received AS (
    SELECT layer, head, key, sum(received) AS received
    FROM col_stats WHERE run_id = $run
    GROUP BY layer, head, key
), top AS (
    SELECT layer, head, max(received) AS top_received
    FROM received GROUP BY layer, head
), rows_ AS (
    SELECT layer, head,
           count(*) AS n_rows,
           avg(sink_mass) AS mean_sink_mass,
           avg(max_prob) FILTER (WHERE query >= $min_query) AS row_max_share
    FROM row_stats WHERE run_id = $run
    GROUP BY layer, head
), wide AS (
    SELECT r.layer, r.head,
           t.top_received / r.n_rows AS max_share,
           r.row_max_share,
           r.mean_sink_mass
    FROM rows_ r JOIN top t USING (layer, head)
)
SELECT layer, head, metric, value
FROM (UNPIVOT wide ON max_share, row_max_share, mean_sink_mass INTO NAME metric VALUE value)
"""

#: Per layer: every head metric averaged over heads (the layer profile). The averages below
#: add their values in a fixed order (``ORDER BY`` inside the aggregate): DuckDB's parallel
#: sums combine partial sums in whatever order its threads finish, so an unordered ``avg``
#: can differ in its last bits between two calls on the same rows.
LAYER_METRICS_SQL = """
SELECT layer, metric, avg(value ORDER BY head) AS value
FROM head_metrics WHERE run_id = $run
GROUP BY layer, metric
"""

#: Per layer: Gu et al.'s Sink_1^eps (docs/metrics.md §3b), the fraction of the layer's heads
#: whose mean_sink_mass (A[i, 0] over windows and every query) exceeds $eps. The run's value is
#: the mean over layers (:data:`RUN_MEANS_SQL`): every layer has the same heads, so it is the
#: fraction of all (layer, head).
SINK_RATE_SQL = f"""
SELECT layer, '{N.sink_rate}' AS metric, avg((value > $eps)::DOUBLE ORDER BY head) AS value
FROM head_metrics WHERE run_id = $run AND metric = '{N.mean_sink_mass}' AND value IS NOT NULL
GROUP BY layer
"""

#: Layer metrics that have no run level (a position or a flag per hidden state, §6b): the
#: run means leave them out.
LAYER_ONLY = tuple(m.name for m in METRICS.values() if "layer" in m.levels and "run" not in m.levels)

#: Per run: every layer metric averaged over layers ("mean over layers of the mean over heads"),
#: but those of :data:`LAYER_ONLY`.
RUN_MEANS_SQL = f"""
SELECT metric, avg(value ORDER BY layer) AS value
FROM layer_metrics WHERE run_id = $run
  AND metric NOT IN ({", ".join(f"'{m}'" for m in LAYER_ONLY) or "''"})
GROUP BY metric
"""

#: Onset: the smallest layer whose mean-over-heads max_share exceeds $threshold (NULL if none).
ONSET_SQL = f"""
SELECT min(layer) AS {N.onset_layer}
FROM (SELECT layer, avg(value ORDER BY head) AS m FROM head_metrics
      WHERE run_id = $run AND metric = '{N.max_share}' GROUP BY layer)
WHERE m > $threshold
"""

#: The (layer, query head) pairs of the key-norm CV / max_share correlation.
CV_SHARE_PAIRS_SQL = f"""
SELECT layer, head,
       max(value) FILTER (WHERE metric = '{N.key_norm_cv}') AS {N.key_norm_cv},
       max(value) FILTER (WHERE metric = '{N.max_share}') AS {N.max_share}
FROM head_metrics WHERE run_id = $run
GROUP BY layer, head
ORDER BY layer, head
"""
