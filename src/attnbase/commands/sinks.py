"""``attnbase sinks [--published]``: every run's sink rate (Gu et al.'s Sink_1^eps), and with
``--published`` the paper's rows beside the runs of its models and setup.

The runs' side reads ``runs`` (model, corpus, window length, what position 0 is) and
``run_metrics`` (``sink_rate``, ``sink_rate_eps``); the paper's side is package data
(:mod:`attnbase.warehouse.published_sinks`). A run is paired with a published row only when
its model, input, window length and eps are the paper's; otherwise the row says which differ.
"""

from __future__ import annotations

import typer

from attnbase.commands.dbopt import db_option, open_database
from attnbase.metrics import N
from attnbase.warehouse.published_sinks import percent

#: Every run with its sink rate and eps (NULL where the run is not analysed).
RUNS_SQL = f"""
SELECT r.run_id, r.model, r.corpus, r.seq_len, r.sink_token, r.n_seqs,
       max(m.value) FILTER (WHERE m.metric = '{N.sink_rate}') AS {N.sink_rate},
       max(m.value) FILTER (WHERE m.metric = '{N.sink_rate_eps}') AS {N.sink_rate_eps}
FROM runs r LEFT JOIN run_metrics m ON m.run_id = r.run_id
GROUP BY ALL
ORDER BY r.run_id
"""


def run_rows(db: str) -> list[dict]:
    """One dict per run of ``db``: the run's facts, its sink rate and eps, and the published row
    it pairs with (``paper_*`` keys, None when unpaired) or ``not_paired`` (the reasons)."""
    from attnbase.warehouse.published_sinks import pair_run, run_input

    database = open_database(db)
    if not database.exists():
        return []
    with database.connect(read_only=True) as con:
        recs = con.sql(RUNS_SQL).pl().to_dicts()
    out = []
    for r in recs:
        row, reasons = pair_run(r["model"], r["corpus"], r["seq_len"], r[N.sink_rate_eps])
        out.append({**r, "input": run_input(r["corpus"]) or "-",
                    "paper_model": row["model"] if row else None,
                    "paper_input": row["input"] if row else None,
                    "paper_sink_rate": row["sink_rate_percent"] / 100 if row else None,
                    "not_paired": "; ".join(reasons) or None})
    return out


def print_published_rows(console) -> None:
    """The paper's rows in its layout: a row per model, a column per input."""
    from rich.table import Table

    from attnbase.warehouse.published_sinks import INPUTS, SOURCE, published_sink_rows

    rows = published_sink_rows()
    tab = Table(title="Sink_1^eps (%): the published rows",
                caption=f"{SOURCE}; eps = {rows[0]['eps']:g}, {rows[0]['seq_len']}-token windows; "
                        "random = probe:random, repeat-token = probe:repeat-token here")
    for h in ("model", "hub id", *INPUTS):
        tab.add_column(h, justify="left" if h in ("model", "hub id") else "right", no_wrap=True)
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = {r["input"]: r for r in rows if r["model"] == model}
        first = next(iter(mine.values()))
        tab.add_row(model, first["hub_id"],
                    *(f"{mine[i]['sink_rate_percent']:.2f}" if i in mine else "-" for i in INPUTS))
    console.print(tab)


def print_runs(db: str, runs: list[dict], published: bool, console) -> None:
    from rich.table import Table

    title = ("Sink_1^eps (%): this database's runs" + (", each beside the published row of its "
             "model and setup" if published else ""))
    tab = Table(title=title, caption="position 0 = runs.sink_token; eps = run_metrics."
                                     f"{N.sink_rate_eps}; seq len counts special tokens")
    heads = ["run", "model", "input", "corpus", "seq len", "eps", "position 0", "ours"]
    if published:
        heads += ["paper", "paired with / not paired because"]
    for h in heads:
        tab.add_column(h, justify="right" if h in ("seq len", "eps", "ours", "paper") else "left",
                       no_wrap=h != "paired with / not paired because")
    for r in runs:
        eps = r[N.sink_rate_eps]
        cells = [str(r["run_id"]), str(r["model"]), r["input"], str(r["corpus"]),
                 str(r["seq_len"]), "-" if eps is None else f"{eps:g}", r["sink_token"] or "-",
                 percent(r[N.sink_rate])]
        if published:
            if r["paper_model"]:
                cells += [percent(r["paper_sink_rate"]),
                          f"Gu et al. {r['paper_model']}, {r['paper_input']}"]
            else:
                cells += ["-", f"not paired: {r['not_paired']}"]
        tab.add_row(*cells)
    console.print(tab)


def register(app: typer.Typer) -> None:
    @app.command("sinks")
    def sinks(
        db: str = db_option(),
        published: bool = typer.Option(False, "--published", help="Gu et al.'s published "
                                       "Sink_1^eps rows (ICLR 2025), each run beside the row of "
                                       "its model and setup"),
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json (the runs)"),
    ) -> None:
        """Print every run's sink rate (Sink_1^eps, docs/metrics.md §3b), with --published beside
        the paper's rows: paired where model, input, window length and eps match."""
        from attnbase.commands.output import check_format, console, write_frame

        check_format(fmt)
        runs = run_rows(db)
        if fmt != "table":
            import polars as pl

            keep = [c for c in runs[0] if published or not c.startswith(("paper_", "not_"))] \
                if runs else []
            write_frame(pl.DataFrame([{c: r[c] for c in keep} for r in runs]), fmt)
            return
        out = console()
        if published:
            print_published_rows(out)
        if runs:
            print_runs(db, runs, published, out)
        else:
            out.print(f"no runs in {db}; run `attnbase extract --db {db} ...` then "
                      f"`attnbase analyze --db {db} --run RUN`")
