"""``attnbase study r-conventions``: r(key-norm CV, max share) under every convention of the
paper's Table 1 (:mod:`attnbase.stats.r_conventions`; docs/metrics.md §1, §3, §3a)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from attnbase.commands.dbopt import db_option, open_database
from attnbase.formatting import fmt, fmt_p


def register(study_app: typer.Typer) -> None:
    @study_app.command("r-conventions")
    def r_conventions(
        db: str = db_option(),
        run: str = typer.Option(..., "--run", help="run id (needs stored keys and attn_logits)"),
        seed: int = typer.Option(0, "--seed", min=0, help="seed of the bootstrap CIs"),
        n_boot: int = typer.Option(2000, "--n-boot", min=100, help="bootstrap resamples per CI"),
        min_query: int = typer.Option(4, "--min-query", min=1,
                                      help="first query row of the *_q4 and row_max_share variants"),
    ) -> None:
        """r(CV, share) for every norm-CV variant x share variant (x GQA pairing) -> study_results."""
        from rich.console import Console
        from rich.table import Table

        from attnbase.stats.r_conventions import r_conventions_study

        t0 = time.perf_counter()
        database = open_database(db)
        sid, table = r_conventions_study(database, run, n_boot=n_boot, seed=seed,
                                         min_query=min_query)
        info = database.run_info(run)
        tab = Table(title=f"r(CV, share) of run {run} ({info['model']}, position 0: "
                          f"{info['sink_token'] or '-'}) under every convention")
        for c in ("norm-CV", "share", "pairing", "n", "r", "95% CI", "p", "Spearman"):
            tab.add_column(c, justify="left" if c in ("norm-CV", "share", "pairing") else "right")
        for (cv, share, pairing), s in table.items():
            tab.add_row(cv, share, pairing, str(int(s["n"])), fmt(s["r"], 3, signed=True),
                        f"[{fmt(s['ci_low'], 3, signed=True)}, "
                        f"{fmt(s['ci_high'], 3, signed=True)}]", fmt_p(s["p"]),
                        fmt(s["spearman"], 3, signed=True))
        Console(width=max(120, Console().width)).print(tab)
        typer.echo(f"study {sid}: {len(table)} combinations in {time.perf_counter() - t0:.1f} s "
                   "(max_share_excl_sink* not renormalised; *_q4: queries i >= "
                   f"{min_query}; CI: BCa bootstrap over (layer, head) pairs)")
