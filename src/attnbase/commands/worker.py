"""``attnbase worker``: a Prefect process worker that runs the pipeline flows a pool is sent."""

from __future__ import annotations

from typing import Optional

import typer

from attnbase.commands.dbopt import db_option, open_database


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)


def interrupted(pool: str) -> str:
    """What Ctrl-C prints before the worker exits (exit status 130)."""
    return (f"interrupted: the worker stopped, and a flow run it was running with it; every "
            f"batch the ledger counts is durable: `attnbase flow submit CONFIG --pool {pool}` "
            "again and any worker resumes the run")


def worker(
    pool: str = typer.Option(..., "--pool", help="the work pool to serve (made, of type "
                             "process, when missing)"),
    db: Optional[str] = db_option("a database to check at start: a team database's "
                                   "postgresql:// address or a directory (each submitted run "
                                   "names its own; default $ATTNBASE_DB)", default=None),
    limit: int = typer.Option(1, "--limit", min=1, help="flow runs at once on this worker"),
) -> None:
    """Serve the pipeline flows of work pool POOL on this machine until Ctrl-C."""
    from attnbase.commands.flow import stop_on_sigint

    restore = stop_on_sigint(interrupted(pool))  # first: every thread from here on blocks SIGINT
    try:
        from attnbase.flows import pool as work_pool

        work_pool.require_api()  # one line, before anything starts
        if db:  # the database's own one line where it does not exist
            open_database(db).require()
        work_pool.serve_pool(pool, limit=limit, echo=typer.echo)
    finally:
        restore()
