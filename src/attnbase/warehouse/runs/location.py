"""Where a run's bytes live: a local directory or a prefix of an S3 bucket (``s3://bucket/prefix``).

The one place that turns a store argument into a location (:func:`resolve`) and that talks to
object storage. A local run lives under ``DIR/runs/<run_id>/`` (its statistics files under
``DIR/row_stats``/``DIR/col_stats``) exactly as before; a run extracted with
``--store s3://bucket/prefix`` lives under ``s3://bucket/prefix/<run_id>/`` -- its Zarr store
``store.zarr/`` and its statistics files ``row_stats/run_id=<run_id>/b<batch>.parquet`` (and
``col_stats``) -- and the catalog records that URL (``runs.store_url``, migration 13).

:class:`Remote` is a small path-like value (``/``, ``joinpath``, ``parent``, ``name``,
``exists``, ``unlink``) so that the warehouse's path code reads the same for both kinds; its
bytes move through obstore (one PUT per object: a chunk, a Parquet file; an object appears
whole or not at all, so nothing like a ``.partial`` file exists remotely).

Why obstore: it puts and gets objects faster than s3fs (``pipe`` of a dict), the more so on a
loaded machine (benchmarks/RESULTS.md: "object storage client"). DuckDB reads only fsspec file systems,
and obstore's fsspec adapter does not serve DuckDB's globs, so :func:`duckdb_filesystem` is an
s3fs file system (listings uncached: a file another process just wrote is seen).

Endpoint and credentials come only from the standard environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``); they
never enter the catalog or a message. Plain ``http://`` is allowed only for a loopback endpoint.
Every request is retried a bounded number of times (:data:`RETRIES`, :data:`TIMEOUT_S`); then
:class:`~attnbase.errors.StorageUnavailableError` says so in one line (the CLI exits 2, and the
same command resumes later: nothing unacknowledged is ever ledgered).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterable
from urllib.parse import urlparse

from attnbase.errors import StorageUnavailableError, WarehouseError

SCHEME = "s3://"
#: Attempts per request after the first, and seconds per attempt (connect and whole request).
RETRIES = 3
CONNECT_TIMEOUT_S = 2
TIMEOUT_S = 60
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def is_url(value: Any) -> bool:
    return isinstance(value, (str, Remote)) and str(value).startswith(SCHEME)


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; a bad URL -> WarehouseError naming it."""
    if not str(url).startswith(SCHEME):
        raise WarehouseError(f"store {url!r} is not an s3:// URL; use s3://bucket/prefix or a "
                             "local directory")
    rest = str(url)[len(SCHEME):].strip("/")
    bucket, _, key = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise WarehouseError(f"store {url!r}: {bucket!r} is not an S3 bucket name (3-63 lowercase "
                             "letters, digits, '.' or '-'); use s3://bucket/prefix")
    if any(p in ("", ".", "..") for p in key.split("/")) and key:
        raise WarehouseError(f"store {url!r} has an empty or relative path segment; use "
                             "s3://bucket/prefix")
    return bucket, key


def check_store_url(url: str) -> str:
    """Validate a ``--store`` value (URL and environment) and return it without a trailing /."""
    split_url(url)
    endpoint()
    return str(url).rstrip("/")


def endpoint() -> str | None:
    """``AWS_ENDPOINT_URL`` (``AWS_ENDPOINT_URL_S3`` first), checked: http only on loopback."""
    ep = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    if ep is None:
        return None
    u = urlparse(ep)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise WarehouseError("AWS_ENDPOINT_URL is not an http(s) URL; set it to e.g. "
                             "https://s3.example.org or http://127.0.0.1:9000")
    if u.scheme == "http" and not is_loopback(u.hostname):
        raise WarehouseError("AWS_ENDPOINT_URL uses plain http to a non-loopback host; use https "
                             "(plain http is allowed only for 127.0.0.1/localhost)")
    return ep


def duckdb_s3_secret(con, name: str = "attnbase_s3") -> None:
    """Make a TEMPORARY S3 secret on ``con`` (DuckDB's httpfs) from the standard environment:
    the endpoint of :func:`endpoint`, the region and the credentials (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``). Values never enter a message."""
    ep = endpoint()
    opts = {"TYPE": "s3", "REGION": _region()}
    for key, env in (("KEY_ID", "AWS_ACCESS_KEY_ID"), ("SECRET", "AWS_SECRET_ACCESS_KEY"),
                     ("SESSION_TOKEN", "AWS_SESSION_TOKEN")):
        if os.environ.get(env):
            opts[key] = os.environ[env]
    if ep is not None:
        u = urlparse(ep)
        opts.update(ENDPOINT=u.netloc, URL_STYLE="path",
                    USE_SSL="true" if u.scheme == "https" else "false")

    def lit(v: str) -> str:
        return v if v in ("true", "false") else "'" + str(v).replace("'", "''") + "'"

    body = ", ".join(f"{k} {lit(v)}" for k, v in opts.items())
    con.execute(f"CREATE OR REPLACE TEMPORARY SECRET {name} ({body})")


def is_loopback(host: str | None) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1): where plain http and a
    token-less service are allowed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


@functools.lru_cache(maxsize=None)
def _bucket_store(bucket: str, prefix: str | None, ep: str | None, region: str):
    from datetime import timedelta

    from obstore.store import S3Store

    kwargs: dict[str, Any] = {"region": region}
    if prefix:
        kwargs["prefix"] = prefix
    if ep is not None:
        kwargs["endpoint"] = ep
    return S3Store(
        bucket,
        client_options={"allow_http": bool(ep and ep.startswith("http://")),
                        "connect_timeout": f"{CONNECT_TIMEOUT_S}s", "timeout": f"{TIMEOUT_S}s"},
        retry_config={"max_retries": RETRIES, "retry_timeout": timedelta(seconds=30),
                      "backoff": {"init_backoff": timedelta(milliseconds=100),
                                  "max_backoff": timedelta(seconds=2), "base": 2}},
        **kwargs,
    )


def bucket_store(bucket: str, prefix: str | None = None):
    """The obstore ``S3Store`` of ``bucket`` (one per bucket and prefix, endpoint and region per
    process)."""
    return _bucket_store(bucket, prefix or None, endpoint(), _region())


def duckdb_filesystem():
    """An s3fs file system for ``duckdb.register_filesystem`` (listings never cached; one
    instance per endpoint and process)."""
    return _duckdb_filesystem(endpoint(), _region())


@functools.lru_cache(maxsize=None)
def _duckdb_filesystem(ep: str | None, region: str):
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=ep, use_listings_cache=False, skip_instance_cache=True,
                             client_kwargs={"region_name": region},
                             config_kwargs={"connect_timeout": CONNECT_TIMEOUT_S,
                                            "retries": {"max_attempts": RETRIES + 1}})


def storage_error(err: BaseException, what: str) -> BaseException:
    """An obstore error as one line: a missing object or bucket, credentials refused, or the
    endpoint unreachable; any other exception (a bug) is returned unchanged."""
    try:
        import obstore.exceptions as oe
    except ModuleNotFoundError:  # an install without the [s3] extra: no object store error
        return err

    if not isinstance(err, oe.BaseError):
        return err
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    detail = re.sub(r"(?i)(signature|credential|access.?key)[^,;)]*", r"\1 <hidden>", detail)[:200]
    name = type(err).__name__
    if name in ("NotFoundError",) or "NoSuchBucket" in str(err):
        return WarehouseError(f"{what}: not found on the object store ({detail}); check the "
                              "bucket and prefix of --store")
    if isinstance(err, (oe.PermissionDeniedError, oe.UnauthenticatedError)):
        return WarehouseError(f"{what}: the object store refused the credentials ({name}); "
                              "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
    return StorageUnavailableError(
        f"{what}: the object store did not answer after {RETRIES} retries ({name}: {detail}); "
        "check AWS_ENDPOINT_URL and the network, then run the same command again (it resumes)")


def _is_not_found(err: BaseException) -> bool:
    return type(err).__name__ == "NotFoundError" or isinstance(err, FileNotFoundError)


class Remote:
    """A key (or key prefix) in an S3 bucket, path-like: ``Remote("s3://b/p") / "x"``."""

    __slots__ = ("bucket", "key")

    def __init__(self, url: str, key: str | None = None) -> None:
        if key is None:
            self.bucket, self.key = split_url(url)
        else:
            self.bucket, self.key = url, key.strip("/")

    # --- path-like -------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def __repr__(self) -> str:
        return f"Remote({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Remote) and (self.bucket, self.key) == (other.bucket, other.key)

    def __hash__(self) -> int:
        return hash((self.bucket, self.key))

    def __truediv__(self, part: str) -> "Remote":
        part = str(part).strip("/")
        return Remote(self.bucket, f"{self.key}/{part}" if self.key else part)

    def joinpath(self, *parts: str) -> "Remote":
        out = self
        for p in parts:
            out = out / p
        return out

    @property
    def name(self) -> str:
        return PurePosixPath(self.key).name

    @property
    def parent(self) -> "Remote":
        return Remote(self.bucket, str(PurePosixPath(self.key).parent).lstrip("."))

    def with_name(self, name: str) -> "Remote":
        return self.parent / name

    # --- objects ---------------------------------------------------------------------------
    @property
    def store(self):
        return bucket_store(self.bucket)

    def exists(self) -> bool:
        """Whether an object with this exact key exists (one HEAD)."""
        import obstore

        try:
            obstore.head(self.store, self.key)
            return True
        except Exception as err:
            if _is_not_found(err):
                return False
            raise storage_error(err, str(self)) from err

    def is_dir(self) -> bool:
        return False  # object storage has no directories; use files()

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """Nothing to do: a prefix exists once an object under it does."""

    def put(self, parts: Iterable[Any]) -> None:
        """Write the object as one PUT of ``parts`` joined (returns once it is stored)."""
        import obstore

        parts = list(parts)
        data = parts[0] if len(parts) == 1 else b"".join(parts)  # bytes-like: one copy at most
        if not isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(memoryview(data))  # a pyarrow Buffer or numpy array
        try:
            obstore.put(self.store, self.key, data)
        except Exception as err:
            raise storage_error(err, f"writing {self}") from err

    def read_bytes(self) -> bytes:
        import obstore

        try:
            return bytes(obstore.get(self.store, self.key).bytes())
        except Exception as err:
            raise storage_error(err, f"reading {self}") from err

    def files(self) -> dict[str, int]:
        """``{relative key: size}`` of every object under this prefix."""
        import obstore

        prefix = f"{self.key}/" if self.key else ""
        out: dict[str, int] = {}
        try:
            for batch in obstore.list(self.store, prefix=prefix or None, chunk_size=1000):
                for meta in batch:
                    out[meta["path"][len(prefix):]] = int(meta["size"])
        except Exception as err:
            raise storage_error(err, f"listing {self}") from err
        return out

    def unlink(self, missing_ok: bool = True) -> None:
        import obstore

        try:
            obstore.delete(self.store, self.key)
        except Exception as err:
            if not _is_not_found(err):
                raise storage_error(err, f"deleting {self}") from err

    def delete_tree(self) -> None:
        """Delete every object under this prefix."""
        import obstore

        keys = [f"{self.key}/{k}" for k in self.files()]
        try:
            for i in range(0, len(keys), 1000):
                obstore.delete(self.store, keys[i:i + 1000])
        except Exception as err:
            raise storage_error(err, f"deleting {self}") from err

    def zarr_store(self, read_only: bool):
        """A zarr ``ObjectStore`` rooted at this prefix."""
        from zarr.storage import ObjectStore

        return ObjectStore(bucket_store(self.bucket, self.key), read_only=read_only)


def resolve(path: "str | Path | Remote") -> "Path | Remote":
    """A local path or an ``s3://`` URL as the value the warehouse works with."""
    if isinstance(path, Remote):
        return path
    if is_url(path):
        return Remote(str(path))
    if isinstance(path, str) and "://" in path:
        raise WarehouseError(f"store {path!r}: only s3:// URLs and local directories are "
                             "supported")
    return Path(path)


def run_base(store_root: str, run_id: str) -> str:
    """The URL of a run under a ``--store`` root: ``s3://bucket/prefix/<run_id>``."""
    return f"{check_store_url(store_root)}/{run_id}"

