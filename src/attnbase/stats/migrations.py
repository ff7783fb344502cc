"""Catalog migrations of the stats stage (versions 100-199; see attnbase.warehouse.migrations)."""

from __future__ import annotations

from attnbase.stats.views import create_views
from attnbase.warehouse.migrations import Migration

MIGRATIONS: list[Migration] = [
    Migration(100, "stats views: head_summary, table1", create_views),
]
