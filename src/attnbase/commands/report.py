"""``attnbase report``: the HTML + PDF report of a run, optionally compared with other runs."""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import db_option, open_database


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        db: str = db_option(),
        run: str = typer.Option(..., "--run", help="run id to report on"),
        compare: list[str] = typer.Option(
            [], "--compare",
            help="run id(s) to show side by side; repeat the option or separate ids by commas",
        ),
        out: Path | None = typer.Option(
            None, "--out", help="output directory (default DB/reports/<run>/)"
        ),
    ) -> None:
        """Write report.html and report.pdf for a run from the catalog tables; print their paths."""
        from attnbase.reports import build_report  # heavy (matplotlib, weasyprint): import late

        others = tuple(r for item in compare for r in item.split(",") if r.strip())
        paths = build_report(open_database(db), run, compare=tuple(r.strip() for r in others),
                             out_dir=out)
        for w in paths.warnings:
            typer.echo(f"warning: {w}", err=True)
        typer.echo(str(paths.html))
        typer.echo(str(paths.pdf))
