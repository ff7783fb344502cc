"""Catalog tables of the compositional studies (warehouse migrations 50-59; docs/architecture.md).

``studies`` / ``study_results`` exist since migration 1; these are the per-head tables of
docs/metrics.md §4-5 that a study writes next to its ``study_results`` rows, keyed by ``study_id``.
"""

from __future__ import annotations

from attnbase.warehouse.catalog.migrations import Migration, _sql

_V50 = _sql(
    """
    CREATE TABLE IF NOT EXISTS head_distances (
        study_id VARCHAR NOT NULL,
        dissimilarity VARCHAR NOT NULL,
        convention VARCHAR NOT NULL,
        layer_a SMALLINT NOT NULL,
        head_a SMALLINT NOT NULL,
        layer_b SMALLINT NOT NULL,
        head_b SMALLINT NOT NULL,
        value DOUBLE
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS head_clusters (
        study_id VARCHAR NOT NULL,
        dissimilarity VARCHAR NOT NULL,
        convention VARCHAR NOT NULL,
        layer SMALLINT NOT NULL,
        head SMALLINT NOT NULL,
        cluster INTEGER NOT NULL,
        mds_x DOUBLE,
        mds_y DOUBLE
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS entropy_change (
        study_id VARCHAR NOT NULL,
        layer SMALLINT NOT NULL,
        head SMALLINT NOT NULL,
        d_entropy DOUBLE,
        sink_part DOUBLE,
        content_part DOUBLE
    )
    """,
)

#: Tables keyed by ``study_id`` (a re-run study replaces its rows in all of them).
STUDY_TABLES = ("study_results", "head_distances", "head_clusters", "entropy_change")

MIGRATIONS: list[Migration] = [
    Migration(50, "compositional study tables: head_distances, head_clusters, entropy_change", _V50),
]
