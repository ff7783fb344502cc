"""``attnbase runs``: the runs of a database with their status and ledger progress."""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import db_option, open_database


def runs_frame(database):
    """The runs as printed: ``kind`` is ``weights`` for a weights-only run (no corpus, no
    batches), else ``extraction``; then what computed each run
    (:data:`~attnbase.contract.COMPUTED_ON`: device, its name, store dtype, torch, CUDA,
    statistics backend; ``?`` where a run predates them)."""
    import polars as pl

    from attnbase.contract import COMPUTED_ON, WEIGHTS_CORPUS, computed_on

    df = database.list_runs()
    if df.height == 0:
        return df
    with database.connect(read_only=True) as con:
        rows = con.execute("SELECT run_id, corpus, dtype, config FROM runs").fetchall()
    corpus = {r[0]: r[1] for r in rows}
    on = {r[0]: computed_on({"dtype": r[2], "config": r[3]}) for r in rows}
    kind = ["weights" if corpus.get(r) == WEIGHTS_CORPUS else "extraction" for r in df["run_id"]]
    extra = [k for k, _ in COMPUTED_ON if k != "dtype"]
    cols = [pl.Series("kind", kind)] + [
        pl.Series(k, [on[r][k] for r in df["run_id"]], dtype=pl.String) for k in extra]
    return df.with_columns(cols).select(
        "run_id", "model", "family", "kind", "status", "batches_done", "batches_total", "n_seqs",
        "seq_len", "dtype", "created_at", "finished_at", *extra)


def register(app: typer.Typer) -> None:
    @app.command("runs")
    def runs(
        db: str = db_option(),
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json"),
    ) -> None:
        """List the runs of the --db database: model, kind, status, batches done/total."""
        from rich.table import Table

        from attnbase.commands.output import check_format, console, write_frame
        from attnbase.errors import WarehouseError

        check_format(fmt)
        database = open_database(db).require()
        df = runs_frame(database)
        if fmt != "table":
            write_frame(df, fmt)
            return
        out = console()
        if df.height == 0:
            out.print(f"no runs in {db}")
            return
        table = Table(title=f"runs in {db}")
        for col in ("run", "model", "family", "status", "batches", "seqs x len", "dtype",
                    "device", "stats", "created"):
            table.add_column(col, no_wrap=True)
        colour = {"complete": "green", "running": "yellow", "failed": "red"}
        for r in df.iter_rows(named=True):
            st = r["status"]
            weights = r["kind"] == "weights"
            table.add_row(r["run_id"], r["model"], r["family"],
                          f"[{colour.get(st, 'white')}]{'weights only' if weights else st}[/]",
                          "—" if weights else f"{r['batches_done']}/{r['batches_total']}",
                          "—" if weights else f"{r['n_seqs']} x {r['seq_len']}",
                          "—" if weights else _dtypes(r["dtype"], r["store_dtype"]),
                          "—" if weights else _device(r),
                          "—" if weights else r["stats_backend"], str(r["created_at"])[:19])
        out.print(table)


def _dtypes(compute: str, stored: str) -> str:
    """``float32``, or ``bfloat16 -> float32`` where the arrays are stored in another dtype."""
    return compute if stored in (compute, "?") else f"{compute} -> {stored}"


def _device(r: dict) -> str:
    """``cpu (torch 2.13.0)``, ``cuda:0 NVIDIA H200 (torch 2.11.0, CUDA 13.0)``: the device,
    a GPU's name, and the versions that computed the run (``?`` where not recorded)."""
    if r["device"] == "?":
        return "?"
    name = f" {r['device_name']}" if r["device"].startswith("cuda") else ""
    cuda = f", CUDA {r['cuda']}" if r["cuda"] not in ("none", "?") else ""
    return f"{r['device']}{name} (torch {r['torch']}{cuda})"
