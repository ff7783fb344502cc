"""``attnbase models``: every model type, how it is served, what a run captures, its proof."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("models")
    def models(
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json | markdown"),
        served: bool = typer.Option(False, "--served", help="only the model types attnbase serves"),
        proven: bool = typer.Option(False, "--proven", help="only the model types a test proves"),
    ) -> None:
        """List the HF model types: served by an adapter or the generic capture (or not, and
        why), what a run captures, and whether a parity test proves it (docs/models.md)."""
        from attnbase.commands.output import check_format, console, write_frame
        from attnbase.extract.registry import markdown, model_rows, rows_as_dicts

        if fmt not in ("table", "csv", "json", "markdown"):
            from attnbase.errors import AttnbaseError

            raise AttnbaseError(f"unknown --format {fmt!r}; use one of table, csv, json, markdown")
        rows = model_rows()
        if served:
            rows = [r for r in rows if r.served != "no"]
        if proven:
            rows = [r for r in rows if r.proven]
        if fmt == "markdown":
            typer.echo(markdown(rows), nl=False)
            return
        check_format(fmt)
        if fmt != "table":
            import polars as pl

            write_frame(pl.DataFrame(rows_as_dicts(rows)), fmt)
            return
        from rich.table import Table

        table = Table("model type", "served", "captures", "proven", "notes")
        for r in rows:
            table.add_row(r.model_type, r.served, r.captures, "yes" if r.proven else "", r.note)
        out = console()
        out.print(table)
        out.print(f"{len(rows)} model types; {sum(1 for r in rows if r.served != 'no')} served, "
                  f"{sum(1 for r in rows if r.proven)} proven")
