"""``attnbase table1 --published``: the paper's nine Table-1 rows beside the database's runs.

One table in the paper's layout (a row per model): the published rows first (package data,
:mod:`attnbase.warehouse.published`, printed to the paper's digits), then every analysed run of the
database printed the same way, with what position 0 is and the run's shape, since those are
conventions the numbers depend on.
"""

from __future__ import annotations

from pathlib import Path

from attnbase.commands.dbopt import open_database
from attnbase.warehouse.published import (
    CONVENTIONS, DAGGER, PRINTED, SOURCE, position0_published, printed_row, printed_run_row,
    published_rows,
)

HEADERS = ("source", "model", "hub id / run", "L", "d_h", *(label for label, _ in PRINTED),
           "position 0", "corpus", "seqs x len")

#: The runs' side: the table1 view joined with what the runs table says of their conventions.
RUNS_SQL = """
SELECT t.*, r.sink_token, r.corpus, r.n_seqs, r.seq_len, r.causal
FROM table1 t JOIN runs r USING (run_id)
ORDER BY t.run_id
"""


def published_table_rows() -> list[list[str]]:
    """The paper's rows as printed cells (:data:`HEADERS` order)."""
    return [["paper", r["model"], r["hub_id"], str(r["n_layers"]), str(r["d_head"]),
             *printed_row(r), position0_published(r), "WikiText-103 val", "150 x 128"]
            for r in published_rows()]


def run_table_rows(db: Path) -> list[list[str]]:
    """The database's analysed runs as printed cells; [] when there is no database."""

    database = open_database(db)
    if not database.exists():
        return []
    with database.connect(read_only=True) as con:
        recs = con.sql(RUNS_SQL).pl().to_dicts()
    return [["this db", str(r["model"]), str(r["run_id"]), str(r["n_layers"]), str(r["d_head"]),
             *printed_run_row(r), r["sink_token"] or "-", Path(str(r["corpus"])).name,
             f"{r['n_seqs']} x {r['seq_len']}"]
            for r in recs]


def print_published(db: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    runs = run_table_rows(db)
    tab = Table(title="Table 1: the paper's published rows beside this database's runs",
                caption=(f"paper: {SOURCE}; {CONVENTIONS}. {DAGGER}: p >= 0.05. Onset: first "
                         "layer (0-based) whose mean max share exceeds 0.20, with its depth "
                         "fraction. this db: the table1 view, every convention of the run as "
                         "recorded (position 0 = runs.sink_token)."))
    for h in HEADERS:
        left = h in ("source", "model", "hub id / run", "position 0", "corpus")
        tab.add_column(h, justify="left" if left else "right", no_wrap=True)
    for row in published_table_rows() + runs:
        tab.add_row(*row)
    console = Console(width=max(200, Console().width))  # never fold a printed value
    console.print(tab)
    if not runs:
        console.print(f"no analysed runs in {db}; run `attnbase analyze --db {db} --run RUN`")
