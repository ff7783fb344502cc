"""The DuckDB extensions a team database needs, loaded from their wheels.

DuckDB does not download extensions here (``autoinstall_known_extensions`` is off
everywhere): ``duckdb-extension-ducklake`` and ``duckdb-extension-postgres`` (the ``team``
extra) carry the files for one DuckDB version each, and ``duckdb-extension-httpfs`` the one a
data location on S3 needs (DuckLake writes and reads its Parquet files there through it), under
``site-packages/duckdb_extension_<name>/extensions/v<version>/``. The postgres extension's
entry point is named after its file, ``postgres_scanner``: it is linked under that name into
a cache directory and loaded from there.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from attnbase.errors import MissingExtraError, WarehouseError

#: extension name -> (wheel package, file name DuckDB must load it under)
EXTENSIONS = {"postgres": ("duckdb_extension_postgres", "postgres_scanner.duckdb_extension"),
              "ducklake": ("duckdb_extension_ducklake", "ducklake.duckdb_extension")}
#: loaded besides where the data location is on object storage
S3_EXTENSIONS = {"httpfs": ("duckdb_extension_httpfs", "httpfs.duckdb_extension")}


def _cache_dir(version: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "attnbase" / "duckdb-extensions" / f"v{version}"


def extension_files(s3: bool = False) -> list[Path]:
    """The files to ``LOAD``, postgres first (``s3``: httpfs too); one line naming the fix where
    one is missing or built for another DuckDB."""
    import duckdb

    version = duckdb.__version__
    out = []
    wanted = {**EXTENSIONS, **(S3_EXTENSIONS if s3 else {})}
    for name, (package, load_as) in wanted.items():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise MissingExtraError(
                f"a team database needs the DuckDB extension {name!r} (package "
                f"{package.replace('_', '-')}); install it with: pip install 'attnbase[team]'")
        root = Path(list(spec.submodule_search_locations)[0]) / "extensions"
        src = root / f"v{version}" / f"{name}.duckdb_extension"
        if not src.is_file():
            built = sorted(p.name for p in root.glob("v*")) if root.is_dir() else []
            raise WarehouseError(
                f"the DuckDB extension {name!r} is built for DuckDB {', '.join(built) or '?'}, "
                f"not {version}; install matching versions: pip install 'attnbase[team]'")
        dest = _cache_dir(version) / load_as
        if not dest.exists() or dest.resolve() != src.resolve():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{load_as}.{os.getpid()}")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(src)
            os.replace(tmp, dest)
        out.append(dest)
    return out
