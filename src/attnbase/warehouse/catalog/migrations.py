"""Versioned schema migrations of the catalog.

A migration is ``(version, name, apply)`` where ``apply(con)`` runs SQL on a DuckDB connection
inside the migrating transaction. Applied versions are recorded in
``schema_migrations(version, name, applied_at)``; opening a database applies exactly the
registered versions that are missing there, in ascending order, so re-opening never re-runs one.

Every migration is registered explicitly, in one ordered list: :data:`MIGRATION_PROVIDERS`
names each module that defines a ``MIGRATIONS`` list of :class:`Migration` (the warehouse's own
in :mod:`attnbase.warehouse.catalog.schema` and :mod:`attnbase.warehouse.catalog.study_tables`,
then the stats' and the service's). The other stages' are named, not imported, so that the
warehouse imports no stage above it; providers are imported the first time a database migrates,
and tests/test_import_graph.py checks that the list names every module defining one. Tests and
plugins may also call :func:`register_migration` before the database is opened.

Version ranges, so that stages never collide: warehouse 1-99, stats 100-199, reports 200-299,
flows 300-399, serve 400-499. Within them, work in flight claims sub-ranges so parallel branches never collide:
warehouse 2-9 write path, 10-19 null tests, 20-29 verify/faults, 30-39 model aliases, 40-49 depth
and weights, 50-59 compositional studies, 60-69 sink sets and parameter counts (vision); stats 101-109 null tests, 110-119 compositional studies,
120-129 depth and weights, 130-139 reports/robustness, 140-149 the paper's conventions.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from attnbase.errors import WarehouseError


@dataclass(frozen=True)
class Migration:
    """One schema step. ``apply`` receives an open DuckDB connection (inside a transaction)."""

    version: int
    name: str
    apply: Callable


def _sql(*statements: str) -> Callable:
    def apply(con) -> None:
        for stmt in statements:
            con.execute(stmt)

    return apply


#: Modules that define a ``MIGRATIONS`` list, imported when a database migrates (by name: the
#: warehouse may not import the stages above it; tests/test_import_graph.py checks this list
#: against the modules that define one). Keep provider modules light: each opening of an old
#: catalog imports them.
MIGRATION_PROVIDERS: list[str] = [
    "attnbase.warehouse.catalog.schema",
    "attnbase.warehouse.catalog.study_tables",
    "attnbase.stats.migrations",
    "attnbase.serve.migrations",
]

_REGISTERED: list[Migration] = []


def register_migration(version: int, name: str, apply: Callable) -> Migration:
    """Add a migration from code (tests, plugins). Must happen before the database migrates."""
    m = Migration(version, name, apply)
    _REGISTERED.append(m)
    return m


def all_migrations() -> list[Migration]:
    """Every known migration, ascending by version; duplicate versions raise."""
    found: list[Migration] = []
    for mod_name in MIGRATION_PROVIDERS:
        found.extend(importlib.import_module(mod_name).MIGRATIONS)
    found.extend(_REGISTERED)
    by_version: dict[int, Migration] = {}
    for m in found:
        other = by_version.get(m.version)
        if other is not None and other is not m:
            raise WarehouseError(
                f"two catalog migrations claim version {m.version}: {other.name!r} and {m.name!r}; "
                "give one of them a free version in its stage's range"
            )
        by_version[m.version] = m
    return [by_version[v] for v in sorted(by_version)]


_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name VARCHAR NOT NULL,
    applied_at TIMESTAMP NOT NULL
)
"""


def applied_versions(con) -> set[int]:
    """Versions recorded in ``schema_migrations`` (empty for a fresh catalog)."""
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations' "
        "AND table_catalog = current_database()").fetchone()[0]
    if not exists:
        return set()
    return {int(v) for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}


def pending(con) -> list[Migration]:
    done = applied_versions(con)
    return [m for m in all_migrations() if m.version not in done]


def migrate(con) -> list[Migration]:
    """Apply every pending migration, each in its own transaction; return those applied."""
    if not applied_versions(con):
        con.execute(_LEDGER)
    applied = []
    for m in pending(con):
        con.execute("BEGIN TRANSACTION")
        try:
            m.apply(con)
            con.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, current_timestamp::TIMESTAMP)",
                [m.version, m.name],
            )
            con.execute("COMMIT")
        except Exception as err:
            try:
                con.execute("ROLLBACK")
            except Exception:  # noqa: BLE001  a failed COMMIT ended the transaction already
                pass
            raise WarehouseError(
                f"catalog migration {m.version} ({m.name}) failed: {err}"
            ) from err
        applied.append(m)
    return applied
