"""``attnbase token create|list|revoke|delete``: the API tokens of ``attnbase serve``."""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import db_option, open_database


def register(app: typer.Typer) -> None:
    token_app = typer.Typer(no_args_is_help=True, help="API tokens of attnbase serve "
                                                       "(only hashes are stored).")
    app.add_typer(token_app, name="token")

    @token_app.command("create")
    def create(
        db: str = db_option(),
        name: str = typer.Option(..., "--name", help="who or what the token is for"),
        expires_days: int | None = typer.Option(None, "--expires-days", min=1,
                                                help="days until it expires (default: never)"),
        expires_hours: int | None = typer.Option(None, "--expires-hours", min=1,
                                                 help="hours until it expires (instead of "
                                                      "--expires-days)"),
    ) -> None:
        """Create a token; it is printed once, on the last line, alone."""
        from attnbase.serve.auth import create_token

        token = create_token(open_database(db), name, expires_days, expires_hours)
        when = (f"expires in {expires_days} days" if expires_days else
                f"expires in {expires_hours} hours" if expires_hours else "does not expire")
        typer.echo(f"token {name!r} created ({when}); it is shown only now. Send it as "
                   "'Authorization: Bearer <token>':")
        typer.echo(token)

    @token_app.command("list")
    def list_(db: str = db_option()
              ) -> None:
        """Every token's name, dates and state (never the token)."""
        from attnbase.serve.auth import list_tokens

        rows = list_tokens(open_database(db))
        if not rows:
            typer.echo(f"no tokens in {db}: attnbase serve needs none on loopback")
            return
        for r in rows:
            exp = f"{r['expires_at']:%Y-%m-%d %H:%M}" if r["expires_at"] else "never"
            typer.echo(f"{r['name']}\t{r['state']}\tcreated {r['created_at']:%Y-%m-%d %H:%M}"
                       f"\texpires {exp}")

    @token_app.command("revoke")
    def revoke(
        db: str = db_option(),
        name: str = typer.Option(..., "--name", help="the token's name"),
    ) -> None:
        """Revoke a token: the service answers 401 to it from the next request on."""
        from attnbase.serve.auth import revoke_token

        left = revoke_token(open_database(db), name)
        if left:
            typer.echo(f"token {name!r} revoked ({left} active token{'s' if left != 1 else ''} "
                       "left)")
        else:
            typer.echo(f"token {name!r} revoked; it was the last active one: attnbase serve "
                       f"now answers 401 to every request until `attnbase token create --db "
                       f"{db} --name NAME`, or `attnbase token delete --db {db} --name NAME` "
                       "of every token reopens it on loopback without tokens")

    @token_app.command("delete")
    def delete(
        db: str = db_option(),
        name: str = typer.Option(..., "--name", help="the token's name"),
    ) -> None:
        """Delete a token's record; once none is left, attnbase serve needs no token on
        loopback again (and refuses other hosts)."""
        from attnbase.serve.auth import delete_token

        left = delete_token(open_database(db), name)
        if left:
            typer.echo(f"token {name!r} deleted ({left} token{'s' if left != 1 else ''} left: "
                       "see `attnbase token list`)")
        else:
            typer.echo(f"token {name!r} deleted; no tokens left: attnbase serve is open on "
                       "loopback without a token again")
