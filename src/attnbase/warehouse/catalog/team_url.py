"""A team database's address: ``postgresql://USER@HOST:PORT/DBNAME`` (the catalog's PostgreSQL).

The address names no password: libpq finds it (``PGPASSWORD``, ``~/.pgpass``), so the
address can appear in any output, log, page, error, report or run provenance. An address
that carries one is refused in one line that does not repeat it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from attnbase.errors import WarehouseError

SCHEMES = ("postgresql://", "postgres://")


def is_team_url(text: object) -> bool:
    """Whether ``text`` names a team database (a PostgreSQL URL) rather than a directory."""
    return isinstance(text, str) and text.lower().startswith(SCHEMES)


@dataclass(frozen=True)
class TeamURL:
    """A parsed team-database address (no password: see the module doc)."""

    user: str
    host: str
    port: int
    dbname: str

    @classmethod
    def parse(cls, text: str) -> "TeamURL":
        try:
            parts = urlsplit(text)
            port = parts.port or 5432
        except ValueError:
            raise WarehouseError(
                "--db: not a PostgreSQL address; give postgresql://USER@HOST:PORT/DBNAME") from None
        if parts.password is not None:
            raise WarehouseError(
                "--db: the address holds a password; remove it and give it the libpq way "
                "(PGPASSWORD or ~/.pgpass)")
        dbname = unquote(parts.path.lstrip("/"))
        if not parts.hostname or not dbname or "/" in dbname or parts.query or parts.fragment:
            raise WarehouseError(
                "--db: not a PostgreSQL address; give postgresql://USER@HOST:PORT/DBNAME")
        return cls(user=unquote(parts.username or "postgres"), host=parts.hostname, port=port,
                   dbname=dbname)

    def __str__(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"

    def conninfo(self) -> str:
        """libpq's ``key=value`` form (what DuckDB's postgres extension and psycopg take)."""
        def q(v: object) -> str:
            s = str(v).replace("\\", "\\\\").replace("'", "\\'")
            return f"'{s}'" if (not s or any(c in s for c in " '\\")) else s

        return (f"dbname={q(self.dbname)} host={q(self.host)} port={self.port} "
                f"user={q(self.user)}")
