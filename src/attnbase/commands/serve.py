"""``attnbase serve``: the web service over a database (pages, JSON/Arrow API, tokens)."""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import database_arg, db_option

from attnbase.serve.settings import Settings

_DEFAULTS = {f: Settings.__dataclass_fields__[f].default
             for f in ("host", "port", "sql_time_limit_ms", "workers", "decoded_cache_mb")}


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        db: str = db_option(),
        host: str = typer.Option(_DEFAULTS["host"], "--host",
                                 help="interface (non-loopback needs an API token)"),
        port: int = typer.Option(_DEFAULTS["port"], "--port", min=0, max=65535, help="TCP port"),
        sql_time_limit_ms: int = typer.Option(_DEFAULTS["sql_time_limit_ms"], "--sql-time-limit-ms", min=1,
                                              help="time limit of one query (a request may "
                                                   "only lower it)"),
        prefect_api: str | None = typer.Option(
            None, "--prefect-api", envvar="PREFECT_API_URL", metavar="URL",
            help="Prefect server API (e.g. http://127.0.0.1:4200/api, the server `attnbase "
                 "schedule` uses): /flows lists its deployments and last runs"),
        workers: int = typer.Option(_DEFAULTS["workers"], "--workers", min=1, max=64,
                                    help="server processes sharing the port (each its own "
                                         "GIL and DuckDB instance; on a box of 2+ cores, 2 "
                                         "serve more than 1)"),
        decoded_cache_mb: int = typer.Option(
            _DEFAULTS["decoded_cache_mb"], "--decoded-cache-mb", min=0,
            help="MiB of decoded array chunks and statistics row groups each worker keeps for "
                 "the next page (0: none)"),
        setting: list[str] = typer.Option(
            [], "--setting", metavar="NAME=VALUE",
            help="any other limit of the service's settings (attnbase.serve.settings; listed "
                 "on the /sql page), e.g. --setting sql_memory_mb=512; repeatable"),
        access_log: bool = typer.Option(False, "--access-log",
                                        help="log every request (paths only, never tokens)"),
    ) -> None:
        """Serve DIR or a team database over HTTP: pages, patterns, sandboxed SQL."""
        from attnbase.serve.server import serve as run_server

        from attnbase.serve.settings import parse_settings

        run_server(Settings(db=database_arg(db), host=host, port=port, sql_time_limit_ms=sql_time_limit_ms,
                            prefect_api=prefect_api, workers=workers,
                            decoded_cache_mb=decoded_cache_mb, **parse_settings(setting)),
                   access_log=access_log)
