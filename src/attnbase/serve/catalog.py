"""The service's reads of the catalog: short read-only connections beside the writers.

DuckDB lets one process hold the catalog file for writing, and a writer (an extraction, an
analysis, a flow) holds it per transaction. A read-only open that meets that lock is retried with
exponential backoff (20 ms doubling to 250 ms) for up to ``Settings.open_wait_s`` seconds: the
warehouse's one retry policy (:meth:`attnbase.warehouse.catalog.Database._open`), not a second one.
Every connection has :meth:`Settings.duckdb_config` (the SQL sandbox and its resource limits) and
every query runs under the watchdog (:func:`attnbase.warehouse.sql.query_arrow`).

:meth:`Catalog.state` is the catalog's state as the file system shows it (size and mtime of the
catalog file and its WAL): the ETag of every GET response is derived from it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import threading
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, Sequence

import numpy as np

from attnbase.serve.settings import Settings
from attnbase.warehouse.catalog import Database


def clean(value: Any) -> Any:
    """A value as JSON can hold it: NaN/inf -> None, dates -> ISO text, numpy -> Python."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (np.floating,)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.ndarray):
        return [clean(v) for v in value.tolist()]
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


class Catalog:
    """Read-only access of one server process to ``DIR/catalog.duckdb``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(settings.db, lock_timeout=settings.open_wait_s)
        self.config = settings.duckdb_config()
        self.cancel = threading.Event()  # set at shutdown: every running query stops
        self._tables: tuple[str, frozenset[str]] | None = None
        self._local = threading.local()

    @contextmanager
    def session(self):
        """One connection for every query of this thread inside the block (a page's dozen
        queries open the catalog once); nested blocks reuse it."""
        if getattr(self._local, "con", None) is not None:
            yield self
            return
        with self.db.connect(read_only=True, config=self.config) as con:
            self._local.con = con
            try:
                yield self
            finally:
                self._local.con = None

    def state(self) -> str:
        """A short digest of the catalog's on-disk state (changes with every commit)."""
        parts = []
        for p in (self.db.catalog_path, self.db.catalog_path.with_name(
                self.db.catalog_path.name + ".wal")):
            try:
                st = p.stat()
                parts.append(f"{st.st_size}:{st.st_mtime_ns}")
            except FileNotFoundError:
                parts.append("-")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]

    def query(self, sql: str, params: Sequence[Any] | None = None, *, timeout_s: float | None = None,
              max_rows: int | None = None, max_bytes: int | None = None):
        """A :class:`~attnbase.warehouse.sql.QueryResult` under the server's limits."""
        from attnbase.warehouse.sql import query_arrow

        limit = self.settings.sql_time_limit_ms / 1000
        return query_arrow(self.db, sql, params, config=self.config,
                           timeout_s=limit if timeout_s is None else min(timeout_s, limit),
                           max_rows=max_rows, max_bytes=max_bytes, cancel=self.cancel,
                           con=getattr(self._local, "con", None))

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict]:
        """The rows of one of the service's own queries as JSON-ready dicts."""
        return [clean(r) for r in self.query(sql, params).table.to_pylist()]

    def tables(self) -> frozenset[str]:
        """Names of the catalog's tables and views (cached per :meth:`state`)."""
        state = self.state()
        if self._tables is None or self._tables[0] != state:
            names = frozenset(r["table_name"] for r in self.rows(
                "SELECT table_name FROM information_schema.tables"))
            self._tables = (state, names)
        return self._tables[1]

    def run_row(self, run_id: str) -> dict:
        """The ``runs`` row of ``run_id``; :class:`NotFoundError` naming the known runs."""
        from attnbase.errors import NotFoundError

        rows = self.rows("SELECT * FROM runs WHERE run_id = ?", [run_id])
        if not rows:
            known = [r["run_id"] for r in self.rows("SELECT run_id FROM runs ORDER BY run_id")]
            shown = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "") or "none"
            raise NotFoundError(f"no run {run_id!r} in this database (known runs: {shown})")
        return rows[0]
