"""A database: its catalog (:mod:`attnbase.warehouse.catalog`) and the layout of its runs.

:class:`Database` is what every command, flow and the service hold: the directory ``DIR`` the
user named, the catalog behind it (a :class:`~attnbase.warehouse.catalog.backend.CatalogBackend`,
chosen by :func:`~attnbase.warehouse.catalog.catalog_backend`: today always the DuckDB
file ``DIR/catalog.duckdb``), where each run's bytes live (:meth:`Database.run`, a
:class:`~attnbase.warehouse.runs.handle.RunHandle`), and the few queries and writes over the
catalog's tables that many callers share. Connections, transactions, the ledger, migrations and
the lock wait are the backend's; :class:`Database` passes them through.
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from attnbase.errors import RunNotFoundError, WarehouseError
from attnbase.warehouse.catalog import catalog_backend, migrations
from attnbase.warehouse.catalog.backend import LOCK_TIMEOUT_S, CatalogBackend
from attnbase.warehouse.catalog.rows import insert_rows, to_arrow
from attnbase.warehouse.catalog.team_url import is_team_url
from attnbase.warehouse.runs.handle import RunHandle, run_handle

#: Database.run's default: look the run's location up in the catalog
_LOOK_UP = object()

#: Tables that carry a ``run_id`` column (deleted with a run), besides the ledger's
#: (:mod:`attnbase.warehouse.catalog.ledger`). ``row_stats``/``col_stats`` are views over
#: per-run files (:mod:`attnbase.warehouse.runs.statfiles`), deleted with the run's files.
RUN_TABLES = ("head_metrics", "null_tests", "layer_metrics", "run_metrics", "arrays",
              "seq_sources", "runs")

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class RunRecord:
    """What :func:`~attnbase.warehouse.extract_run` did to a run."""

    run_id: str
    status: str
    config_hash: str
    n_batches: int
    batches_done: int
    batches_written: int  # by this call (0 when the run was already complete)
    store_path: Path


class Database:
    """A database directory: its catalog plus ``DIR/runs/<run_id>/store.zarr``.

    The constructor only stores the path (and picks the catalog's backend, which opens
    nothing); the directory and catalog are created, and pending migrations applied, on the
    first writing connection. ``catalog``: a backend to use instead (a snapshot's file).
    """

    def __init__(self, path: str | Path, *, lock_timeout: float = LOCK_TIMEOUT_S,
                 catalog: CatalogBackend | None = None) -> None:
        self.url: str | None = None  # a team database's address (postgresql://...)
        self._path: Path | None = None
        if catalog is None and is_team_url(path):
            catalog = catalog_backend(path, lock_timeout=lock_timeout)
            self.url = str(catalog.url)
        else:
            self._path = Path(path)
            if catalog is None and self._path.exists() and not self._path.is_dir():
                raise WarehouseError(
                    f"--db {self._path} is a file, not a database directory; give a directory (an "
                    "existing attnbase database, or a new path to create one), or a team "
                    "database's postgresql:// address")
        self.catalog = (catalog_backend(self._path, lock_timeout=lock_timeout) if catalog is None
                        else catalog)
        self._store_urls: dict[str, tuple] = {}  # Database._located by run

    @property
    def path(self) -> Path:
        """The directory runs and statistics files live under: ``DIR``, or a team database's
        data location (read from its catalog on first use)."""
        if self._path is None:
            self._path = self.catalog.local_root()
        return self._path

    @property
    def name(self) -> str:
        """How messages name the database: its directory or its address."""
        return self.url or str(self._path)

    @classmethod
    def of(cls, db: "Database | str | Path") -> "Database":
        """``db`` itself, or the Database of a directory given as a str or Path."""
        return db if isinstance(db, Database) else cls(db)

    def __repr__(self) -> str:
        return f"Database({self.name!r})"

    # --- layout --------------------------------------------------------------------------
    @property
    def catalog_path(self) -> Path:
        """The catalog's file (the embedded backend's ``DIR/catalog.duckdb``)."""
        if self.catalog.file is None:
            raise WarehouseError(f"{self.name} is a team database: its catalog is no file")
        return self.catalog.file

    def run_dir(self, run_id: str) -> Path:
        """Where a local run of this name lives (``DIR/runs/<run_id>``)."""
        return run_handle(self.path, run_id, None).base

    def store_url(self, run_id: str) -> str | None:
        """``runs.store_url`` of ``run_id``: the ``s3://`` URL its bytes live under, or None
        for a local run (also for a run not registered)."""
        return self._located(run_id)[0]

    def _located(self, run_id: str) -> tuple:
        """``(store_url, recipes, written)`` of ``run_id`` (:class:`RunHandle`'s catalog facts;
        ``(None, None, None)`` for a run not registered). A run's location and recipes are fixed
        while it exists (:meth:`forget_location` after deleting, compacting or registering one);
        its ledger only while it is complete, so a complete run's facts are kept per Database
        and a running one's read again."""
        if run_id in self._store_urls:
            return self._store_urls[run_id]
        if not self.exists():
            return None, None, None
        import json

        with self.connect(read_only=True) as con:
            row = con.execute(
                "SELECT store_url, status, "
                "(SELECT json_group_object(name, derivation) FROM arrays "
                " WHERE run_id = $1 AND derived), "
                "(SELECT list([batch, first_seq, n_seqs] ORDER BY batch) FROM batches "
                " WHERE run_id = $1 AND status = 'complete') "
                "FROM runs WHERE run_id = $1", [run_id]).fetchone()
        if row is None:
            return None, None, None  # not registered (yet): not kept
        url, status, recipes, written = row
        recipes = json.dumps({k: v for k, v in json.loads(recipes or "{}").items()
                              if v is not None}, sort_keys=True)
        located = (url, recipes, tuple(tuple(int(x) for x in w) for w in written or ()))
        if status == "complete":
            self._store_urls[run_id] = located
        return located

    def forget_location(self, run_id: str) -> None:
        self._store_urls.pop(run_id, None)

    def run(self, run_id: str, store_url: "str | None | object" = _LOOK_UP, *,
            recipes: str | None = None,
            written: "tuple[tuple[int, int, int], ...] | None" = None) -> RunHandle:
        """Where ``run_id``'s bytes live (:mod:`attnbase.warehouse.runs.handle`), with what the
        catalog says its store must hold (its derived arrays' recipes, the batches its ledger
        counts). ``store_url`` (and ``recipes``, ``written``): as read elsewhere (the service's
        snapshot of the catalog), so that locating the run opens no connection to the catalog
        file; by default all three are looked up."""
        if store_url is _LOOK_UP:
            store_url, recipes, written = self._located(run_id)
        return run_handle(self.path, run_id, store_url, recipes=recipes, written=written)

    def store_path(self, run_id: str):
        """The run's Zarr store: ``DIR/runs/<run_id>/store.zarr`` or ``<store_url>/store.zarr``."""
        return self.run(run_id).store_path

    # --- the catalog (its backend's) -------------------------------------------------------
    @property
    def lock_timeout(self) -> float:
        return self.catalog.lock_timeout

    @lock_timeout.setter
    def lock_timeout(self, seconds: float) -> None:
        self.catalog.lock_timeout = seconds

    def exists(self) -> bool:
        return self.catalog.exists()

    def require(self) -> "Database":
        """Itself where the database exists; else the one-line error naming how to make one."""
        if not self.catalog.exists():
            raise self.catalog.missing()
        return self

    def migrate(self) -> list[migrations.Migration]:
        """Apply pending migrations (creating DIR and the catalog if needed)."""
        return self.catalog.migrate()

    def connect(self, read_only: bool = False, config: dict | None = None,
                stats: bool = True) -> AbstractContextManager[Any]:
        """A short-lived connection (:meth:`CatalogBackend.connect
        <attnbase.warehouse.catalog.backend.CatalogBackend.connect>`)."""
        return self.catalog.connect(read_only=read_only, config=config, stats=stats)

    def transaction(self, stats: bool = True) -> AbstractContextManager[Any]:
        """A writing connection inside one transaction: committed on success, else rolled back."""
        return self.catalog.transaction(stats=stats)

    def ledger(self) -> AbstractContextManager[Any]:
        """A writing transaction that changes which statistics files readers see
        (:meth:`CatalogBackend.ledger <attnbase.warehouse.catalog.backend.CatalogBackend.ledger>`)."""
        return self.catalog.ledger()

    # --- queries -------------------------------------------------------------------------
    def run_ids(self) -> list[str]:
        if not self.exists():
            return []
        with self.connect(read_only=True) as con:
            return [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]

    def find_run(self, run_id: str) -> dict | None:
        """The ``runs`` row of ``run_id`` as a dict, or None."""
        if not self.exists():
            return None
        with self.connect(read_only=True) as con:
            cur = con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d[0] for d in cur.description], row))

    def run_info(self, run_id: str) -> dict:
        """The ``runs`` row of ``run_id``; :class:`RunNotFoundError` (listing known runs) otherwise."""
        info = self.find_run(run_id)
        if info is None:
            known = self.run_ids()
            listing = ", ".join(known[:20]) if known else "none"
            raise RunNotFoundError(
                f"no run {run_id!r} in {self.name} (known runs: {listing}); "
                f"see `attnbase runs --db {self.name}`"
            )
        return info

    def list_runs(self):
        """Every run with its ledger progress, as a polars DataFrame."""
        import polars as pl

        if not self.exists():
            return pl.DataFrame()
        with self.connect(read_only=True) as con:
            return con.sql(
                """
                SELECT r.run_id, r.model, r.family, r.status, r.n_seqs, r.seq_len, r.dtype,
                       coalesce(b.done, 0) AS batches_done, coalesce(b.total, 0) AS batches_total,
                       r.created_at, r.finished_at
                FROM runs r
                LEFT JOIN (SELECT run_id, count(*) FILTER (WHERE status = 'complete') AS done,
                                  count(*) AS total
                           FROM batches GROUP BY run_id) b USING (run_id)
                ORDER BY r.created_at, r.run_id
                """
            ).pl()

    def array_rows(self, run_id: str) -> list[dict]:
        with self.connect(read_only=True) as con:
            cur = con.execute("SELECT * FROM arrays WHERE run_id = ? ORDER BY name", [run_id])
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]

    # --- writes --------------------------------------------------------------------------
    def replace_rows(self, table: str, run_id: str, df: Any, where: str | None = None,
                     params: Sequence[Any] = ()) -> int:
        """Delete ``table``'s rows of ``run_id`` (and ``where``), insert ``df``; one transaction.

        ``df`` (polars/pandas DataFrame, pyarrow Table or mapping of arrays) is matched to the
        table's columns by name; a missing ``run_id`` column is filled in. Returns rows inserted.
        """
        if not _IDENT.match(table):
            raise WarehouseError(f"not a table name: {table!r}")
        tbl = to_arrow(df)
        with self.transaction() as con:
            insert_rows(con, table, run_id, tbl, where=where, params=params, delete=True)
        return tbl.num_rows

    def delete_run(self, run_id: str) -> None:
        """Remove a run's catalog rows (one transaction), then its bytes (and any local debris
        of a run of that name)."""
        run = self.run(run_id)
        if self.exists():
            # the run's rows first (it is gone for readers), then its ledger's (rows a stop in
            # between leaves are replaced when a run of that name is registered)
            with self.transaction(stats=False) as con:
                for table in RUN_TABLES:
                    con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            with self.ledger() as led:
                led.delete_run(run_id)
        delete_run_bytes(self.path, run)
        self.forget_location(run_id)

    # --- arrays --------------------------------------------------------------------------
    def read_layer(self, run_id: str, name: str, layer: int) -> np.ndarray:
        """One layer's block of array ``name`` (every seq), read with checksums verified."""
        self.run_info(run_id)
        return self.run(run_id).store().read_layer(name, layer)

    def read_layers(self, run_id: str, name: str, layers: Sequence[int] | None = None
                    ) -> Iterator[tuple[int, np.ndarray]]:
        """``(layer, block)`` of array ``name`` for each of ``layers`` (default: all), streamed:
        the next block is read in a background thread while the caller works on this one (the
        read releases the GIL in its copies and checksums), so at most two blocks are alive.
        The run is looked up and its store opened once."""
        from concurrent.futures import ThreadPoolExecutor

        self.run_info(run_id)
        store = self.run(run_id).store()
        todo = list(range(store.array(name).shape[0]) if layers is None else layers)
        if not todo:
            return
        with ThreadPoolExecutor(1, thread_name_prefix="attnbase-read") as pool:
            ahead = pool.submit(store.read_layer, name, todo[0])
            for i, layer in enumerate(todo):
                block = ahead.result()
                if i + 1 < len(todo):
                    ahead = pool.submit(store.read_layer, name, todo[i + 1])
                yield layer, block
                del block


def location(db: "Database | str | Path") -> str:
    """``db`` as a process elsewhere finds it: an address as is, a directory made absolute."""
    if isinstance(db, Database):
        return db.url or str(db.path.resolve())
    return str(db) if is_team_url(db) else str(Path(db).resolve())


def delete_run_bytes(db_path: Path, run: RunHandle) -> None:
    """Every byte of ``run`` and the local debris of a run of that name under ``db_path`` (a
    stopped merge's staging directories included)."""
    from attnbase.warehouse.runs.statcompact import remove_staging

    local = run_handle(db_path, run.run_id, None)
    local.delete_all()
    remove_staging(local)
    if run.remote:
        run.delete_all()
