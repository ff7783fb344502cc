"""``attnbase verify``: every chunk against its checksum and the catalog against the stores."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnbase.commands.dbopt import db_option, open_database

#: Exit status when verification found problems (2 stays "the command could not run").
EXIT_PROBLEMS = 1


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify(
        db: str = db_option(),
        run: Optional[str] = typer.Option(None, "--run", "-r", help="one run (default: every run)"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="print problems only"),
    ) -> None:
        """Check every chunk's crc32c, array shapes and chunk counts against the catalog, the
        ledger against the stores and row_stats counts against the ledger.

        Prints one line per problem (run, array, chunk, file, batch) and exits 1 when there is
        any; `attnbase extract ... --run RUN --repair` rewrites the broken batches."""
        from attnbase.warehouse.runs.verify import BATCH_KINDS, verify as verify_db

        result = verify_db(open_database(db), run)
        for note in result.notes:
            typer.echo(f"note: {note}")
        for problem in result.problems:
            typer.echo(str(problem))
        n = len(result.problems)
        runs = ", ".join(result.runs) or "no runs"
        if n == 0:
            if not quiet:
                typer.echo(f"ok: {len(result.runs)} run(s) ({runs}), {result.chunks_checked} "
                           f"chunks checked, {result.rows_checked} rows' statistics recomputed "
                           "from the logits, catalog and stores agree")
            return
        if any(p.kind == "catalog" for p in result.problems):
            typer.echo(f"{n} problem(s) in the catalog; restore catalog.duckdb from a copy of "
                       "the file (the runs were not checked)", err=True)
            raise typer.Exit(EXIT_PROBLEMS)
        bad = sorted({p.run_id for p in result.problems})
        fixable = all(p.kind in BATCH_KINDS for p in result.problems)
        hint = ("repair with `attnbase extract ... --run RUN --repair`" if fixable else
                "some need `attnbase extract ... --run RUN --overwrite`")
        typer.echo(f"{n} problem(s) in run(s) {', '.join(bad)} ({result.chunks_checked} chunks "
                   f"checked); {hint}", err=True)
        raise typer.Exit(EXIT_PROBLEMS)
