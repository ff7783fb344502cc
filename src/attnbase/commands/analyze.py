"""``attnbase analyze`` (the collapse signature of a run) and ``attnbase table1`` (all runs)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from attnbase.commands.dbopt import db_option, open_database

from attnbase.formatting import fmt
from attnbase.metrics import HEAD_TYPES, METRICS, TABLE1, TABLE1_EXTRAS, N
from attnbase.options import ANALYSIS_OPTIONS as A

#: Row labels of ``attnbase table1`` (column -> label): the run's facts, then the Table-1
#: metrics and their extras as :mod:`attnbase.metrics` labels them.
TABLE1_ROWS = (("model", "model"), ("n_layers", "layers"), ("d_head", "d_head")) + tuple(
    (name, METRICS[name].label) for name in TABLE1 + TABLE1_EXTRAS)


def format_cell(name: str, value) -> str:
    """A Table-1 cell: a registered metric with its digits, a run's fact as it is."""
    return METRICS[name].format(value) if name in METRICS else fmt(value)


def table1_frame(db: Path):
    """The ``table1`` view as a polars DataFrame (one row per analysed run)."""

    with open_database(db).connect(read_only=True) as con:
        return con.sql("SELECT * FROM table1 ORDER BY run_id").pl()


def register(app: typer.Typer) -> None:
    @app.command("analyze")
    def analyze(
        db: str = db_option(),
        run: str = typer.Option(..., "--run", help="run id to analyse"),
        draws: int = A["draws"].typer(),
        gauss_draws: int = A["gauss_draws"].typer(),
        seq_draws: Optional[int] = A["seq_draws"].typer(),
        shuffle_seqs: Optional[int] = A["shuffle_seqs"].typer(),
        seed: int = A["seed"].typer(),
        threshold: float = A["onset_threshold"].typer(),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
        no_progress: bool = typer.Option(False, "--no-progress", hidden=True,
                                         help="old spelling of --quiet"),
        wait: bool = typer.Option(False, "--wait", help="wait for another process writing this "
                                  "run to finish (default: refuse, naming it)"),
    ) -> None:
        """Compute a run's collapse signature (norm-CV, VE@8 vs nulls, onset, r(CV, max share)).

        Writes head_metrics, null_tests, layer_metrics and run_metrics (docs/metrics.md §1-3) and
        prints the run's Table-1 row."""
        from attnbase.errors import AttnbaseError
        from attnbase.options import first_problem

        options = dict(draws=draws, gauss_draws=gauss_draws, seq_draws=seq_draws,
                       shuffle_seqs=shuffle_seqs, seed=seed, onset_threshold=threshold)
        msg = first_problem(A, options)
        if msg:  # before the statistics' imports
            raise AttnbaseError(msg)
        from attnbase.stats.analyze import analyze_run

        t0 = time.perf_counter()
        out = analyze_run(open_database(db), run, progress=not (quiet or no_progress), wait=wait,
                          **options)
        # then the head taxonomy's run means and the sink rate (docs/metrics.md §3b)
        rows = TABLE1_ROWS[3:] + tuple((name, f"{METRICS[name].label}, mean over heads")
                                       for name in HEAD_TYPES if out.get(name) is not None)
        rows += ((N.sink_rate, f"{METRICS[N.sink_rate].label} (eps "
                               f"{format_cell(N.sink_rate_eps, out.get(N.sink_rate_eps))})"),)
        width = max(len(label) for _, label in rows)
        for name, label in rows:
            typer.echo(f"{label:<{width}}  {format_cell(name, out.get(name))}")
        typer.echo(f"analysed {run} in {time.perf_counter() - t0:.1f} s "
                   f"(see `attnbase table1 --db {db}`)")

    @app.command("table1")
    def table1(
        db: str = db_option(),
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json"),
        published: bool = typer.Option(False, "--published", help="the paper's nine published "
                                       "rows (docs/metrics.md §3a) beside the database's runs"),
    ) -> None:
        """Print "All Routes Lead to Collapse" Table 1 for every analysed run, side by side."""
        from rich.table import Table

        if published:
            from attnbase.commands.table1_published import print_published

            print_published(db)
            return
        from attnbase.commands.output import check_format, console, write_frame

        check_format(fmt)
        df = table1_frame(db)
        # a weights-only run has no Table-1 value (no corpus): named below, not a column of dashes
        empty = [r["run_id"] for r in df.to_dicts()
                 if all(r.get(name) is None for name, _ in TABLE1_ROWS[3:])]
        df = df.filter(~df["run_id"].is_in(empty))
        if fmt != "table":
            write_frame(df, fmt)
            return
        out = console()
        if df.height == 0:
            out.print(f"no analysed runs in {db}; run `attnbase analyze --db {db} --run RUN`")
        else:
            tab = Table(title="Table 1: the collapse signature", show_lines=False)
            tab.add_column("", no_wrap=True)
            for run_id in df["run_id"]:
                tab.add_column(str(run_id), justify="right", no_wrap=True)
            rows = df.to_dicts()
            for name, label in TABLE1_ROWS:
                tab.add_row(label, *(format_cell(name, r.get(name)) for r in rows))
            out.print(tab)
        if empty:
            out.print(f"weights-only runs (no Table-1 row): {', '.join(empty)}")
