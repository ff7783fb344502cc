"""``attnbase study paths --run R``: the path study of :mod:`attnbase.studies.paths` (docs/metrics.md
§6), printed one row per path length.
"""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import db_option, open_database

from attnbase.metrics import S

P = S.paths


def register(study_app: typer.Typer) -> None:
    @study_app.command("paths")
    def paths(
        run: str = typer.Option(..., "--run", "-r", help="run with captured attn_logits"),
        db: str = db_option(),
        draws: int = typer.Option(100, "--draws", help="random paths per length and sequence"),
        seed: int = typer.Option(0, "--seed", help="seed of the path draws"),
        order: str = typer.Option("forward", "--order",
                                  help="forward (A_lk ... A_l1, as the network) | ascending "
                                       "(A_l1 ... A_lk, the peer notebook's order)"),
        seqs: int = typer.Option(None, "--seqs", help="use the first N sequences (default all)"),
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json"),
    ) -> None:
        """Rank-1 residual of attention products along random paths, per path length."""
        from attnbase.commands.output import check_format, write_frame

        check_format(fmt)
        from attnbase.studies.paths import paths_study

        study_id, res = paths_study(open_database(db), run, draws=draws, seed=seed, order=order,
                                    seqs=seqs)
        df = paths_frame(res)
        if fmt != "table":
            write_frame(df, fmt)
            return
        from attnbase.commands.study_compositional import _table

        _table(f"study {study_id}: residual ratio of the rank-1 fit of attention products, "
               "by path length", list(df.columns), [list(r) for r in df.iter_rows()])


def paths_frame(res: dict[str, float]):
    """The path study's results as one row per path length: ``length, n`` and the ratio's
    mean, sd and quantiles (columns in the order the study writes them)."""
    import polars as pl

    lengths = sorted({int(k.rsplit("/", 1)[1]) for k in res
                      if k.startswith(P.ratio_median(""))})
    stats = list(dict.fromkeys(k.rsplit("/", 1)[0] for k in res if k.rsplit("/", 1)[0] != P.n))
    return pl.DataFrame({"length": lengths,
                         "n": [int(res[P.n(k)]) for k in lengths],
                         **{s: [res[f"{s}/{k}"] for k in lengths] for s in stats}})
