"""Every limit of the service in one settings model (Datasette's ``settings`` list), on
pydantic-settings.

``attnbase serve`` builds one :class:`Settings` (:func:`load_settings`): a field is taken from
the command's own option where it has one and it was given, else from ``--setting NAME=VALUE``,
else from the environment variable ``ATTNBASE_SERVE_<NAME>`` (e.g. ``ATTNBASE_SERVE_SQL_MEMORY_MB``),
else its default. Each field's description is shown by ``attnbase serve --help`` where it is an
option and on the ``/sql`` page.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

#: the prefix of the environment variables that set the service's settings
ENV_PREFIX = "ATTNBASE_SERVE_"


def _f(default, help: str):
    return Field(default, description=help)


class Settings(BaseSettings):
    """The service's configuration; frozen (one object per server process)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    db: Path | str | None  # a directory, or a team database's postgresql:// address
    host: str = _f("127.0.0.1", "interface to listen on (non-loopback needs an API token)")
    port: int = _f(8642, "TCP port")
    sql_time_limit_ms: int = _f(5000, "time limit of one query; a request may only lower it")
    max_returned_rows: int = _f(10_000, "row cap of a JSON query result (truncated: true)")
    max_stream_bytes: int = _f(256 << 20, "byte cap of a CSV/Arrow/Parquet answer as sent "
                                          "(the rows past it cut, X-Attnbase-Truncated: true)")
    max_json_bytes: int = _f(64 << 20, "byte cap of a JSON answer as sent (truncated: true)")
    sql_memory_mb: int = _f(512, "memory of one ad-hoc query: its own process, stopped "
                                  "(400) when its resident set passes this; its DuckDB's "
                                  "memory_limit is 3/4 of it, without spilling")
    sql_query_threads: int = _f(1, "DuckDB threads of one ad-hoc query")
    sql_nice: int = _f(10, "scheduling niceness of an ad-hoc query that has run "
                           "sql_nice_after_ms (pages first when the CPU is short)")
    sql_nice_after_ms: int = _f(1000, "run time after which an ad-hoc query is niced")
    max_body_bytes: int = _f(64 << 10, "largest request body accepted (413 beyond)")
    head_timeout_s: float = _f(5.0, "a request's line and headers must arrive within this "
                                    "many seconds (of connecting, or of its first byte); "
                                    "else 408 and the connection closed")
    body_timeout_s: float = _f(10.0, "a request's body must arrive within this many seconds "
                                     "of its headers; else 408 and the connection closed")
    send_timeout_s: float = _f(10.0, "a client that takes none of its answer's bytes for this "
                                     "many seconds is disconnected (its answer's memory freed)")
    keep_alive_s: float = _f(5.0, "an idle keep-alive connection is closed after this many "
                                  "seconds")
    max_connections: int = _f(256, "open connections of one server process; one more gets "
                                   "503 and is closed")
    workers: int = _f(1, "server processes sharing the port, each with its own threads, "
                         "Python interpreter (GIL) and DuckDB instance; the kernel spreads "
                         "connections between them")
    sql_threads: int = _f(8, "worker threads for pages, patterns and the API's reads (the "
                             "event loop never runs one)")
    sql_concurrency: int = _f(3, "ad-hoc queries (POST /api/sql, the /sql console) running at "
                                 "once, on their own threads: more wait; pages never behind them")
    sql_queue_wait_ms: int = _f(5000, "longest an ad-hoc query waits for one of the "
                                      "sql_concurrency slots (its time limit starts after); "
                                      "then 503 with Retry-After")
    duckdb_memory_limit: str = _f("2GB", "DuckDB memory_limit of the server's connections")
    duckdb_threads: int = _f(2, "DuckDB threads of the server's connections")
    duckdb_max_temp_directory_size: str = _f("0B", "DuckDB spill limit (0B: no spilling, an "
                                                   "oversized query fails instead)")
    open_wait_s: float = _f(10.0, "bounded retry of the catalog's read-only open while another "
                                  "process writes it")
    decoded_cache_mb: int = _f(64, "decoded zarr chunks and statistics row groups a server "
                                   "process keeps for the next page (MiB; 0: none)")
    stat_checksums: bool = _f(True, "check each statistics file's CRC-32C against the "
                                    "catalog once per version of the file (path, size, "
                                    "mtime) before a request reads it; a damaged file fails "
                                    "its run's questions (500) naming it and attnbase verify")
    max_compare_runs: int = _f(12, "distinct runs /compare shows at once (400 beyond)")
    max_head_bytes: int = _f(64 << 10, "largest request line and headers accepted (431 "
                                       "beyond)")
    max_pattern_len: int = _f(512, "longest sequence whose pattern is served")
    cookie_name: str = _f("attnbase_token", "HttpOnly cookie set by the login form")
    prefect_api: str | None = _f(None, "Prefect server API URL (PREFECT_API_URL, as `attnbase "
                                       "schedule` uses it); set, /flows lists its deployments "
                                       "and last runs (read-only)")
    prefect_timeout_s: float = _f(3.0, "timeout of one request to the Prefect server")
    flow_runs_shown: int = _f(20, "last flow runs (most recent start first) /flows lists")
    deployments_shown: int = _f(100, "deployments /flows lists at most (with flow_runs_shown "
                                       "under Prefect's limit of 200 per request)")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def duckdb_config(self) -> dict:
        """The configuration of every connection the server opens: the SQL sandbox plus its
        resource limits (one configuration, so DuckDB shares one instance between them)."""
        from attnbase.warehouse.sandbox.sql import SANDBOX_CONFIG

        return {**SANDBOX_CONFIG, "memory_limit": self.duckdb_memory_limit,
                "threads": self.duckdb_threads,
                "max_temp_directory_size": self.duckdb_max_temp_directory_size,
                # the statistics files never change once written (a batch's file is replaced
                # whole, by rename): their footers are read once per snapshot, not per query
                "parquet_metadata_cache": True}

    @classmethod
    def default(cls, name: str):
        """The default of setting ``name``."""
        return cls.model_fields[name].default

    @classmethod
    def help(cls, name: str) -> str:
        """The description of setting ``name``."""
        return cls.model_fields[name].description or ""

    def described(self) -> list[tuple[str, object, str]]:
        """``(name, value, help)`` of every setting but ``db``."""
        return [(name, getattr(self, name), f.description or "")
                for name, f in type(self).model_fields.items() if name != "db"]


def _type_name(name: str) -> str:
    kind = Settings.model_fields[name].annotation
    return getattr(kind, "__name__", str(kind))


def parse_settings(pairs: list[str]) -> dict[str, str]:
    """``["NAME=VALUE", ...]`` (``attnbase serve --setting``) as ``{name: value}``, the names
    checked (one line naming the valid names otherwise); the values are typed by
    :class:`Settings`."""
    from attnbase.errors import AttnbaseError

    known = [n for n in Settings.model_fields if n != "db"]
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in known:
            raise AttnbaseError(f"--setting {pair!r}: use NAME=VALUE with NAME one of "
                                f"{', '.join(sorted(known))}")
        out[name] = value
    return out


def load_settings(db: "Path | str | None", options: dict, pairs: list[str]) -> Settings:
    """The settings of ``attnbase serve``: ``options`` (the command's own options, None where
    not given) over ``pairs`` (``--setting NAME=VALUE``) over ``ATTNBASE_SERVE_<NAME>`` over
    the defaults. A value that is not of its setting's type is one line naming where it came
    from and the type."""
    from attnbase.errors import AttnbaseError

    given = {k: v for k, v in options.items() if v is not None}
    settings = parse_settings(pairs)
    try:
        return Settings(db=db, **{**settings, **given})
    except ValidationError as err:
        first = err.errors()[0]
        name, value = str(first["loc"][0]), first["input"]
        where = (f"--{name.replace('_', '-')} {value!r}" if name in given else
                 f"--setting {name}={value!r}" if name in settings else
                 f"{ENV_PREFIX}{name.upper()}={value!r}")
        raise AttnbaseError(f"{where}: expected a {_type_name(name)}") from None
