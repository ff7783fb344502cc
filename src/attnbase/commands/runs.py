"""``attnbase runs``: the runs of a database with their status and ledger progress."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("runs")
    def runs(db: Path = typer.Option(Path("attnbase-db"), "--db", help="database directory")) -> None:
        """List the runs of DIR: model, status, batches done/total."""
        from rich.console import Console
        from rich.table import Table

        from attnbase.errors import WarehouseError
        from attnbase.warehouse import Database

        database = Database(db)
        if not database.exists():
            raise WarehouseError(f"no attnbase database at {db} (no catalog.duckdb); "
                                 f"create one with `attnbase extract --db {db} ...`")
        df = database.list_runs()
        console = Console()
        if df.height == 0:
            console.print(f"no runs in {db}")
            return
        table = Table(title=f"runs in {db}")
        for col in ("run", "model", "family", "status", "batches", "seqs x len", "dtype", "created"):
            table.add_column(col)
        colour = {"complete": "green", "running": "yellow", "failed": "red"}
        for r in df.iter_rows(named=True):
            st = r["status"]
            table.add_row(r["run_id"], r["model"], r["family"],
                          f"[{colour.get(st, 'white')}]{st}[/]",
                          f"{r['batches_done']}/{r['batches_total']}",
                          f"{r['n_seqs']} x {r['seq_len']}", r["dtype"],
                          str(r["created_at"])[:19])
        console.print(table)
