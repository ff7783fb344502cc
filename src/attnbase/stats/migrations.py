"""Catalog migrations of the stats stage (versions 100-199; see attnbase.warehouse.catalog.migrations)."""

from __future__ import annotations

from attnbase.warehouse.published import create_published_view
from attnbase.stats.views import create_views
from attnbase.warehouse.catalog.migrations import Migration, _sql

#: One row per study result with the study's kind, runs and params (docs/metrics.md §4-5), e.g.
#: ``SELECT runs, key, value FROM study_summary WHERE kind = 'reversal'``.
_STUDY_SUMMARY = _sql("""
    CREATE OR REPLACE VIEW study_summary AS
    SELECT s.study_id, s.kind, array_to_string(s.run_ids, ',') AS runs, r.key, r.value,
           s.params, s.created_at
    FROM studies s JOIN study_results r USING (study_id)
""")

MIGRATIONS: list[Migration] = [
    Migration(100, "stats views: head_summary, table1", create_views),
    # after warehouse migration 10 renamed null_tests."null" to null_model
    Migration(101, "stats views: head_summary reads null_model, adds the z-scores", create_views),
    Migration(110, "stats views: study_summary (studies x study_results)", _STUDY_SUMMARY),
    Migration(140, "stats views: published_table1 (the paper's Table 1, package data)",
              create_published_view),
]
