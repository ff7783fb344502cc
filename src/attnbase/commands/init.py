"""``attnbase init``: make a database before anything writes to it.

A directory is made on first write anyway; ``init`` is how a team database starts:
``attnbase init --db postgresql://USER@HOST:PORT/DBNAME --data DIR`` puts the catalog in that
PostgreSQL database (DuckLake) and records DIR (or ``s3://BUCKET/PREFIX``) as where run stores
and statistics files live.
"""

from __future__ import annotations

from typing import Optional

import typer

from attnbase.commands.dbopt import db_option, open_database


def register(app: typer.Typer) -> None:
    @app.command("init")
    def init(
        db: str = db_option(),
        data: Optional[str] = typer.Option(
            None, "--data", help="a team database's data location: s3://BUCKET/PREFIX (endpoint and "
            "credentials from the standard AWS_* environment) or a directory every machine of "
            "the team mounts at the same path (required with a postgresql:// --db)"),
    ) -> None:
        """Make the database (a directory's catalog, or a team database on PostgreSQL); an
        existing one is left as it is."""
        from pathlib import Path

        from attnbase.errors import WarehouseError
        from attnbase.warehouse.catalog.team_url import is_team_url

        if not is_team_url(db):
            if data is not None:
                raise WarehouseError("--data is for a team database (--db postgresql://...); a "
                                     "directory database keeps its data in the directory")
            database = open_database(db)
            applied = database.migrate()
            typer.echo(f"database {Path(db).resolve()}: "
                       + ("made" if applied else "exists, left as it was"))
            return
        if data is None:
            raise WarehouseError("attnbase init --db postgresql://... needs --data DIR: where "
                                 "run stores and statistics files live")
        from attnbase.warehouse.runs.location import check_store_url, is_url

        if is_url(data):
            location = check_store_url(data)
        elif "://" in data:
            raise WarehouseError(f"--data {data}: give s3://BUCKET/PREFIX or a directory every "
                                 "machine of the team mounts at the same path")
        else:
            location = str(Path(data).resolve())
        database = open_database(db)
        applied = database.catalog.create(location)
        typer.echo(f"team database {database.url}: catalog in PostgreSQL (DuckLake), data at "
                   f"{location}; " + ("made" if applied else "exists, left as it was"))
