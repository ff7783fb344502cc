"""Every limit of the service in one settings object (Datasette's ``settings`` list).

``attnbase serve`` builds one :class:`Settings` from its options; each field's ``help`` is shown
by ``attnbase serve --help`` where it is an option and on the ``/sql`` page.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Settings:
    """The service's configuration; frozen (one object per server process)."""

    db: Path
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

    def described(self) -> list[tuple[str, object, str]]:
        """``(name, value, help)`` of every setting but ``db``."""
        return [(f.name, getattr(self, f.name), f.metadata.get("help", ""))
                for f in fields(self) if f.name != "db"]


def parse_settings(pairs: list[str]) -> dict:
    """``["NAME=VALUE", ...]`` (``attnbase serve --setting``) as Settings fields, each value of
    its field's type; one line naming the valid names or the expected type otherwise."""
    from attnbase.errors import AttnbaseError

    known = {f.name: f for f in fields(Settings) if f.name != "db"}
    out: dict = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in known:
            raise AttnbaseError(f"--setting {pair!r}: use NAME=VALUE with NAME one of "
                                f"{', '.join(sorted(known))}")
        kind = type(known[name].default)
        try:
            out[name] = (value if kind in (str, type(None)) else
                         value.lower() in ("1", "true", "yes") if kind is bool else kind(value))
        except ValueError:
            raise AttnbaseError(f"--setting {name}={value!r}: expected a {kind.__name__}") from None
    return out
