"""Catalog migrations of the stats stage (versions 100-199; see attnbase.warehouse.migrations)."""

from __future__ import annotations

from attnbase.stats.views import create_views
from attnbase.warehouse.migrations import Migration

MIGRATIONS: list[Migration] = [
    Migration(100, "stats views: head_summary, table1", create_views),
    # after warehouse migration 10 renamed null_tests."null" to null_model
    Migration(101, "stats views: head_summary reads null_model, adds the z-scores", create_views),
]
