"""``attnbase serve``: the web service over a database (pages, JSON/Arrow API, tokens)."""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import database_arg, db_option

#: the options below default to None (not given): then ``--setting``, ``ATTNBASE_SERVE_<NAME>``
#: or the setting's default applies (attnbase.serve.settings, imported when the command runs)
_DEFAULT = " (default: the setting's, listed on the /sql page)"


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        db: str = db_option(),
        host: str | None = typer.Option(None, "--host", help="interface (non-loopback needs "
                                        "an API token)" + _DEFAULT),
        port: int | None = typer.Option(None, "--port", min=0, max=65535,
                                        help="TCP port" + _DEFAULT),
        sql_time_limit_ms: int | None = typer.Option(
            None, "--sql-time-limit-ms", min=1,
            help="time limit of one query (a request may only lower it)"
                 + _DEFAULT),
        prefect_api: str | None = typer.Option(
            None, "--prefect-api", envvar="PREFECT_API_URL", metavar="URL",
            help="Prefect server API (e.g. http://127.0.0.1:4200/api, the server `attnbase "
                 "schedule` uses): /flows lists its deployments and last runs"),
        workers: int | None = typer.Option(None, "--workers", min=1, max=64,
                                           help="server processes sharing the port (each its "
                                                "own GIL and DuckDB instance; on a box of 2+ "
                                                "cores, 2 serve more than 1)"
                                                + _DEFAULT),
        decoded_cache_mb: int | None = typer.Option(
            None, "--decoded-cache-mb", min=0,
            help="MiB of decoded array chunks and statistics row groups each worker keeps for "
                 "the next page (0: none)" + _DEFAULT),
        setting: list[str] = typer.Option(
            [], "--setting", metavar="NAME=VALUE",
            help="any other limit of the service's settings (attnbase.serve.settings; listed "
                 "on the /sql page), e.g. --setting sql_memory_mb=512; repeatable; or "
                 "ATTNBASE_SERVE_<NAME> in the environment"),
        access_log: bool = typer.Option(False, "--access-log",
                                        help="log every request (paths only, never tokens)"),
    ) -> None:
        """Serve DIR or a team database over HTTP: pages, patterns, sandboxed SQL."""
        from attnbase.serve.server import serve as run_server

        from attnbase.serve.settings import load_settings

        options = dict(host=host, port=port, sql_time_limit_ms=sql_time_limit_ms,
                       prefect_api=prefect_api, workers=workers,
                       decoded_cache_mb=decoded_cache_mb)
        run_server(load_settings(database_arg(db), options, setting),
                   access_log=access_log)
