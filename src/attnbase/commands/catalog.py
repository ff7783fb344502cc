"""``attnbase catalog copy``: move a directory database into a team database."""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import open_database


def register(app: typer.Typer) -> None:
    catalog_app = typer.Typer(help="the catalog as a whole: copy a directory database into a "
                                   "team database", no_args_is_help=True)
    app.add_typer(catalog_app, name="catalog")

    @catalog_app.command("copy")
    def copy(
        source: Path = typer.Option(..., "--from", help="the directory database to copy"),
        target: str = typer.Option(..., "--to", help="the team database "
                                   "(postgresql://USER@HOST:PORT/DBNAME, made by attnbase init)"),
    ) -> None:
        """Copy every run (its bytes and catalog rows) and study of --from into --to; the
        source is only read. Stopped anywhere, the same command finishes the job."""
        from attnbase.warehouse.copy import copy_database

        result = copy_database(open_database(source), open_database(target), say=typer.echo)
        typer.echo(f"copied {len(result.copied)} run(s), {result.files} file(s) "
                   f"({result.bytes / 2**20:.1f} MiB written), {result.study_rows} study row(s); "
                   f"{len(result.skipped)} run(s) already there; check with "
                   f"`attnbase verify --db {target}`")
