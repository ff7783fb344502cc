"""``attnbase study scaling --runs a,b,c``: sink mass against parameter count across runs.

docs/metrics.md §5 ("Scaling"); the study lives in :mod:`attnbase.stats.scaling`.
"""

from __future__ import annotations

import typer

from attnbase.commands.dbopt import open_database
from attnbase.commands.study_compositional import _DB, _split, _table


def register(study_app: typer.Typer) -> None:
    @study_app.command("scaling")
    def scaling(
        db: str = _DB,
        runs: str = typer.Option(..., "--runs", help="three or more runs of different sizes: a,b,c"),
    ) -> None:
        """Mean sink mass (max_share, key-norm CV where analysed) per run against log10 of its
        parameter count: OLS slope with a 95% CI, Pearson r and p."""
        from attnbase.stats import scaling as sc

        run_ids = _split(runs, "--runs")
        sid, res = sc.scaling_study(open_database(db), run_ids)
        from attnbase.metrics import N, S, label

        SC = S.scaling
        rows = [[r, int(res[SC.n_params(r)]), res[SC.sink_mass(r)],
                 res.get(SC.max_share(r)), res.get(SC.key_norm_cv(r))] for r in run_ids]
        _table("scaling: per run", ["run", "parameters", "sink mass", label(N.max_share),
                                    label(N.key_norm_cv)], rows)
        typer.echo(sc.describe(res))
        typer.echo(f"study {sid}")
