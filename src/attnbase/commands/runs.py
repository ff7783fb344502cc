"""``attnbase runs``: the runs of a database with their status and ledger progress."""

from __future__ import annotations

from pathlib import Path

import typer


def runs_frame(database):
    """The runs as printed: ``kind`` is ``weights`` for a weights-only run (no corpus, no
    batches), else ``extraction``."""
    import polars as pl

    from attnbase.commands.weights import WEIGHTS_CORPUS

    df = database.list_runs()
    if df.height == 0:
        return df
    with database.connect(read_only=True) as con:
        corpus = dict(con.execute("SELECT run_id, corpus FROM runs").fetchall())
    kind = ["weights" if corpus.get(r) == WEIGHTS_CORPUS else "extraction" for r in df["run_id"]]
    return df.with_columns(pl.Series("kind", kind)).select(
        "run_id", "model", "family", "kind", "status", "batches_done", "batches_total", "n_seqs",
        "seq_len", "dtype", "created_at", "finished_at")


def register(app: typer.Typer) -> None:
    @app.command("runs")
    def runs(
        db: Path = typer.Option(Path("attnbase-db"), "--db", help="database directory"),
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json"),
    ) -> None:
        """List the runs of the --db database: model, kind, status, batches done/total."""
        from rich.table import Table

        from attnbase.commands.output import check_format, console, write_frame
        from attnbase.errors import WarehouseError
        from attnbase.warehouse import Database

        check_format(fmt)
        database = Database(db)
        if not database.exists():
            raise WarehouseError(f"no attnbase database at {db} (no catalog.duckdb); "
                                 f"create one with `attnbase extract --db {db} ...`")
        df = runs_frame(database)
        if fmt != "table":
            write_frame(df, fmt)
            return
        out = console()
        if df.height == 0:
            out.print(f"no runs in {db}")
            return
        table = Table(title=f"runs in {db}")
        for col in ("run", "model", "family", "status", "batches", "seqs x len", "dtype", "created"):
            table.add_column(col, no_wrap=True)
        colour = {"complete": "green", "running": "yellow", "failed": "red"}
        for r in df.iter_rows(named=True):
            st = r["status"]
            weights = r["kind"] == "weights"
            table.add_row(r["run_id"], r["model"], r["family"],
                          f"[{colour.get(st, 'white')}]{'weights only' if weights else st}[/]",
                          "—" if weights else f"{r['batches_done']}/{r['batches_total']}",
                          "—" if weights else f"{r['n_seqs']} x {r['seq_len']}", r["dtype"],
                          str(r["created_at"])[:19])
        out.print(table)
