"""Where one run's bytes live: :func:`run_handle`, the one resolver, and its two kinds.

A run's bytes are its Zarr store and its statistics files (:mod:`attnbase.warehouse.runs.statfiles`):

* :class:`LocalRun`: ``DIR/runs/<run_id>/store.zarr`` and ``DIR/<table>/run_id=<run_id>/``;
* :class:`RemoteRun`: ``s3://bucket/prefix/<run_id>/store.zarr`` and
  ``s3://bucket/prefix/<run_id>/<table>/run_id=<run_id>/`` (``runs.store_url``,
  :mod:`attnbase.warehouse.runs.location`).

Both answer one small interface: the store (:meth:`RunHandle.store`), the statistics files'
places (:meth:`~RunHandle.table_dir`, :meth:`~RunHandle.batch_file`), and bytes by path
(:meth:`~RunHandle.put`, :meth:`~RunHandle.get`, :meth:`~RunHandle.delete`,
:meth:`~RunHandle.delete_tree`, :meth:`~RunHandle.sizes`, :meth:`~RunHandle.checksum`). Nothing
outside this module asks which kind a path is. A handle is small and picklable (strings only): it
travels to a Dask worker, which then reaches the bytes without a catalog.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

RUNS_DIR = "runs"
STORE_NAME = "store.zarr"


def crc32c(data: Any) -> int:
    """CRC-32C (Castagnoli) of a bytes-like value, the checksum zarr's chunks carry too."""
    import google_crc32c

    return int(google_crc32c.value(data if isinstance(data, bytes) else bytes(data)))


@dataclass(frozen=True)
class RunHandle:
    """Where ``run_id``'s bytes live (see the module docstring); made by :func:`run_handle`."""

    db_path: str  #: the database directory DIR (its catalog and local runs)
    run_id: str
    #: what the catalog says a reader of the store must trust over the store's own copy (None:
    #: not known, a store read alone): ``recipes``, the JSON object ``{name: recipe JSON}`` of
    #: the derived arrays (``arrays.derivation``); ``written``, ``(batch, first_seq, n_seqs)``
    #: of each batch the ledger counts complete, whose chunks must all be there
    recipes: str | None = field(default=None, kw_only=True)
    written: tuple[tuple[int, int, int], ...] | None = field(default=None, kw_only=True)

    #: whether the bytes are on object storage (an object is written whole, with no rename
    #: and no fsync; no directory can be swapped atomically)
    remote = False

    # --- places --------------------------------------------------------------------------
    @property
    def base(self):
        """The run's own directory or prefix."""
        raise NotImplementedError

    @property
    def stats_root(self):
        """The root under which ``<table>/run_id=<run_id>/`` holds the run's statistics files."""
        raise NotImplementedError

    @property
    def store_path(self):
        return self.base / STORE_NAME

    @property
    def url(self) -> str | None:
        """``runs.store_url``: the ``s3://`` URL of a remote run, None for a local one."""
        return None

    @property
    def catalog_store_path(self) -> str:
        """The store as ``arrays.path`` records it: relative to DIR (forward slashes) for a
        local run, the URL for a remote one."""
        return f"{RUNS_DIR}/{self.run_id}/{STORE_NAME}"

    def absolute(self) -> "RunHandle":
        """The same run with DIR made absolute (for a process whose working directory differs)."""
        return dataclasses.replace(self, db_path=str(Path(self.db_path).resolve()))

    def store(self, **kw):
        """The run's :class:`~attnbase.warehouse.runs.store.RunStore` (``keep_open``, ``decoded``)."""
        from attnbase.warehouse.runs.store import RunStore

        return RunStore(self.store_path, self.run_id, recipes=self.recipes, written=self.written,
                        **kw)

    def table_dir(self, table: str):
        return self.stats_root / table / f"run_id={self.run_id}"

    def batch_file(self, table: str, batch: int):
        return self.table_dir(table) / f"b{int(batch):06d}.parquet"

    def relpath(self, path) -> str:
        """``path`` relative to :attr:`stats_root` (forward slashes): how the catalog names a
        statistics file."""
        root = str(self.stats_root).rstrip("/")
        s = str(path)
        return s[len(root) + 1:] if s.startswith(root + "/") else s

    def at(self, rel: str):
        """The path of ``rel`` (relative to :attr:`stats_root`)."""
        return self.stats_root / rel

    # --- bytes ---------------------------------------------------------------------------
    def put(self, path, data: Any, *, fsync: bool = True) -> None:
        """Store ``data`` (bytes-like) at ``path`` whole: a reader sees all of it or none."""
        raise NotImplementedError

    def get(self, path) -> bytes:
        raise NotImplementedError

    def exists(self, path) -> bool:
        raise NotImplementedError

    def delete(self, path) -> None:
        """Remove one file (absent: nothing)."""
        raise NotImplementedError

    def delete_tree(self, path) -> None:
        """Remove every file under ``path`` (absent: nothing)."""
        raise NotImplementedError

    def sizes(self, path) -> dict[str, int]:
        """``{relative path: size}`` of every file under ``path`` (absent: empty)."""
        raise NotImplementedError

    def sizer(self, path) -> Callable[[tuple], int | None]:
        """``parts -> size`` (None: absent) of the files under ``path``: a stat per call
        locally, one listing on object storage."""
        listed = self.sizes(path)
        return lambda parts: listed.get("/".join(map(str, parts)))

    def checksum(self, path) -> tuple[int, int]:
        """``(crc32c, size)`` of one file's bytes."""
        data = self.get(path)
        return crc32c(data), len(data)

    def delete_all(self) -> None:
        """Every byte of the run: its store and its statistics files."""
        from attnbase.warehouse.runs.statschema import SCHEMAS

        for table in SCHEMAS:
            self.delete_tree(self.table_dir(table))
        self.delete_tree(self.base)

    def register_filesystem(self, con) -> None:
        """Make the run's statistics files readable by the DuckDB connection ``con``."""


@dataclass(frozen=True)
class LocalRun(RunHandle):
    """A run under the database directory (``DIR/runs/<run_id>``, ``DIR/<table>/...``)."""

    @property
    def base(self) -> Path:
        return Path(self.db_path) / RUNS_DIR / self.run_id

    @property
    def stats_root(self) -> Path:
        return Path(self.db_path)

    def put(self, path, data: Any, *, fsync: bool = True) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own: two writers of one file (two processes making a new database's
        # schema files) never rename each other's
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}.partial")
        try:
            with open(tmp, "wb") as f:
                f.write(memoryview(data))
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get(self, path) -> bytes:
        return Path(path).read_bytes()

    def exists(self, path) -> bool:
        return Path(path).exists()

    def delete(self, path) -> None:
        Path(path).unlink(missing_ok=True)

    def delete_tree(self, path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def sizes(self, path) -> dict[str, int]:
        path = Path(path)
        if not path.exists():
            return {}
        return {p.relative_to(path).as_posix(): p.stat().st_size
                for p in path.rglob("*") if p.is_file()}

    def sizer(self, path) -> Callable[[tuple], int | None]:
        base = Path(path)

        def stat(parts: tuple) -> int | None:
            try:
                return base.joinpath(*map(str, parts)).stat().st_size
            except FileNotFoundError:
                return None

        return stat


@dataclass(frozen=True)
class RemoteRun(RunHandle):
    """A run on object storage, under ``store_url`` (``s3://bucket/prefix/<run_id>``)."""

    store_url: str = ""
    remote = True

    @property
    def base(self):
        from attnbase.warehouse.runs.location import Remote

        return Remote(self.store_url)

    @property
    def stats_root(self):
        return self.base

    @property
    def url(self) -> str:
        return self.store_url

    @property
    def catalog_store_path(self) -> str:
        return f"{self.store_url}/{STORE_NAME}"

    def put(self, path, data: Any, *, fsync: bool = True) -> None:
        path.put([data])  # one PUT: the object appears whole or not at all

    def get(self, path) -> bytes:
        import obstore

        from attnbase.warehouse.runs.location import storage_error

        try:
            return bytes(obstore.get(path.store, path.key).bytes())
        except Exception as err:
            if type(err).__name__ == "NotFoundError":
                raise FileNotFoundError(str(path)) from None
            raise storage_error(err, f"reading {path}") from err

    def exists(self, path) -> bool:
        return path.exists()

    def delete(self, path) -> None:
        path.unlink()

    def delete_tree(self, path) -> None:
        path.delete_tree()

    def sizes(self, path) -> dict[str, int]:
        return path.files()

    def register_filesystem(self, con) -> None:
        from attnbase.warehouse.runs.location import duckdb_filesystem

        if "s3" in con.list_filesystems():
            con.unregister_filesystem("s3")
        con.register_filesystem(duckdb_filesystem())


def run_handle(db_path: "str | Path", run_id: str, store_url: str | None, *,
               recipes: str | None = None,
               written: "tuple[tuple[int, int, int], ...] | None" = None) -> RunHandle:
    """The one resolver: ``run_id`` of the database at ``db_path`` whose ``runs.store_url`` is
    ``store_url`` (None: a local run); ``recipes`` and ``written``: the catalog's facts a
    reader checks the store against (:class:`RunHandle`)."""
    if store_url is None:
        return LocalRun(str(Path(db_path)), run_id, recipes=recipes, written=written)
    return RemoteRun(str(Path(db_path)), run_id, str(store_url), recipes=recipes,
                     written=written)
