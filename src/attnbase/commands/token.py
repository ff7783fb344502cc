"""``attnbase token create|list|revoke``: the API tokens of ``attnbase serve``."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    token_app = typer.Typer(no_args_is_help=True, help="API tokens of attnbase serve "
                                                       "(only hashes are stored).")
    app.add_typer(token_app, name="token")

    @token_app.command("create")
    def create(
        db: Path = typer.Option(Path("attnbase-db"), "--db", help="database directory"),
        name: str = typer.Option(..., "--name", help="who or what the token is for"),
        expires_days: int | None = typer.Option(None, "--expires-days", min=1,
                                                help="days until it expires (default: never)"),
    ) -> None:
        """Create a token; it is printed once, on the last line, alone."""
        from attnbase.serve.auth import create_token

        token = create_token(db, name, expires_days)
        when = f"expires in {expires_days} days" if expires_days else "does not expire"
        typer.echo(f"token {name!r} created ({when}); it is shown only now. Send it as "
                   "'Authorization: Bearer <token>':")
        typer.echo(token)

    @token_app.command("list")
    def list_(db: Path = typer.Option(Path("attnbase-db"), "--db", help="database directory")
              ) -> None:
        """Every token's name, dates and state (never the token)."""
        from attnbase.serve.auth import list_tokens

        rows = list_tokens(db)
        if not rows:
            typer.echo(f"no tokens in {db}: attnbase serve needs none on loopback")
            return
        for r in rows:
            exp = f"{r['expires_at']:%Y-%m-%d %H:%M}" if r["expires_at"] else "never"
            typer.echo(f"{r['name']}\t{r['state']}\tcreated {r['created_at']:%Y-%m-%d %H:%M}"
                       f"\texpires {exp}")

    @token_app.command("revoke")
    def revoke(
        db: Path = typer.Option(Path("attnbase-db"), "--db", help="database directory"),
        name: str = typer.Option(..., "--name", help="the token's name"),
    ) -> None:
        """Revoke a token: the service answers 401 to it from the next request on."""
        from attnbase.serve.auth import revoke_token

        revoke_token(db, name)
        typer.echo(f"token {name!r} revoked")
