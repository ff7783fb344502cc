"""``attnbase sql``: read-only SQL over the catalog, printed as a table, CSV or JSON."""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import db_option, open_database

FORMATS = ("table", "csv", "json")
#: Default time limit of one ``attnbase sql`` query (the service's is its settings' own).
SQL_TIMEOUT_MS = 60_000
#: the query process's memory and the largest result of `attnbase sql` (its own limits: the
#: light client has no service settings)
SQL_MEMORY_MB = 512
SQL_MAX_BYTES = 256 << 20


def _cell(name: str, v) -> str:
    """A value as the service's /sql page writes it (NULL for missing), with 6 digits; a p- or
    q-value column's 0 as a bound, never "0" (:func:`attnbase.formatting.fmt_cell`)."""
    from attnbase.formatting import fmt_cell

    return fmt_cell(name, v, 6, style="plain")


def _print_table(df) -> None:
    """Values are data, never markup: every header and cell is a plain ``rich.text.Text`` (no
    ``[red]`` styling, no ``:smile:`` emoji codes), printed by a console with emoji off."""
    from rich.table import Table
    from rich.text import Text

    table = Table(show_lines=False)
    for name in df.columns:
        table.add_column(Text(name))
    for row in df.iter_rows():
        table.add_row(*(Text(_cell(name, v)) for name, v in zip(df.columns, row)))
    from attnbase.commands.output import console as wide_console

    console = wide_console(emoji=False, markup=False, highlight=False)  # full values when piped
    console.print(table)
    console.print(f"{df.height} row{'s' if df.height != 1 else ''}", style="dim")


def register(app: typer.Typer) -> None:
    @app.command("sql")
    def sql(
        query: str = typer.Argument(..., help="a SELECT / WITH / EXPLAIN query"),
        db: str = db_option(),
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json"),
        timeout_ms: int = typer.Option(SQL_TIMEOUT_MS, "--timeout-ms", min=1,
                                       help="stop the query after this many milliseconds"),
        memory_mb: int = typer.Option(
            SQL_MEMORY_MB, "--memory-mb", min=64,
            help="memory of the query's own process: stopped when its resident set passes "
                 "this; its DuckDB's memory_limit is 3/4 of it, without spilling"),
        max_bytes: int = typer.Option(SQL_MAX_BYTES, "--max-bytes", min=1,
                                      help="largest result (Arrow bytes); a larger one is "
                                           "refused"),
    ) -> None:
        """Run a read-only query against DIR/catalog.duckdb (writes are refused).

        The query runs in its own process, stopped at --timeout-ms or --memory-mb (exit 2) or
        on Ctrl-C (within a second, exit 130)."""
        import polars as pl

        from attnbase.errors import AttnbaseError, QueryLimitError
        from attnbase.warehouse.sandbox.sql import user_query
        from attnbase.warehouse.sandbox.sqlproc import Limits

        if fmt not in FORMATS:
            raise AttnbaseError(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}")
        limits = Limits(time_s=timeout_ms / 1000, memory_mb=memory_mb, max_bytes=max_bytes,
                        threads=2, nice=0)
        result = user_query(open_database(db), query, limits)
        if result.truncated:
            raise QueryLimitError(f"the result exceeds --max-bytes {max_bytes}; narrow the "
                                  "query (WHERE, fewer columns, LIMIT) or raise --max-bytes")
        df = pl.from_arrow(result.table) if result.table.num_columns else pl.DataFrame()
        if fmt in ("csv", "json"):
            from attnbase.commands.output import write_frame

            write_frame(df, fmt)  # nested values as JSON text in csv; never a traceback
        else:
            _print_table(df)
