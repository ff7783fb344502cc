"""``--db``: the one declaration of every command's database option, and where the CLI turns it
into the :class:`~attnbase.warehouse.Database` every library function takes (:func:`open_database`).

A directory (the embedded database, made on first write) or a team database's address,
``postgresql://USER@HOST:PORT/DBNAME`` (made by ``attnbase init``). ``ATTNBASE_DB`` sets the
default for every command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from attnbase.options import DB_DEFAULT, DB_ENV

if TYPE_CHECKING:
    from attnbase.warehouse import Database

DB_HELP = ("the database: a directory (catalog.duckdb + runs/), or a team database's "
           f"postgresql://USER@HOST:PORT/DBNAME; default ${DB_ENV}, else {DB_DEFAULT}")


def db_option(help: str = DB_HELP, default: str | None = DB_DEFAULT):
    """The ``--db`` option (a string: a directory or an address)."""
    return typer.Option(default, "--db", envvar=DB_ENV, help=help, show_envvar=False)


def open_database(db: str | Path) -> Database:
    """``--db`` (a directory or a team database's address) as the :class:`Database` a command
    passes on; the library below the commands takes nothing else. Opens nothing yet."""
    from attnbase.warehouse import Database

    return Database(db)


def directory_db(db: str, command: str):
    """``db`` as a directory, for a command that does not read a team database yet: a
    ``postgresql://`` address is refused in one line."""
    from pathlib import Path

    from attnbase.errors import WarehouseError
    from attnbase.warehouse.catalog.team_url import is_team_url

    if is_team_url(db):
        raise WarehouseError(f"attnbase {command} reads a database directory; a team database "
                             f"({db}) is not supported by it yet: give --db DIR")
    return Path(db)


def database_arg(db: str):
    """``db`` as a command that reads either kind passes it on: a directory as a ``Path``, a
    team database's address as given (checked: one line where it holds a password)."""
    from pathlib import Path

    from attnbase.warehouse.catalog.team_url import TeamURL, is_team_url

    if is_team_url(db):
        return str(TeamURL.parse(db))
    return Path(db)
