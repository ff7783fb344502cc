"""``attnbase weights --model M --run NAME``: a weights-only run with the S-D metrics
(:mod:`attnbase.studies.weights`; docs/metrics.md §7)."""

from __future__ import annotations

from pathlib import Path

import typer

from attnbase.commands.dbopt import db_option, open_database
from attnbase.metrics import METRICS, N


def register(app: typer.Typer) -> None:
    @app.command("weights")
    def weights(
        model: str = typer.Option(..., "--model", "-m", help="alias, local HF model directory or hub id"),
        run: str = typer.Option(..., "--run", "-r", help="run name (letters, digits, . _ -)"),
        db: str = db_option(),
        init: str = typer.Option("pretrained", "--init", help="pretrained | random (seeded re-init)"),
        seed: int = typer.Option(0, "--seed", help="seed of --init random"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing run"),
    ) -> None:
        """Routing/filtering (S-D) spectra of every head's W_Q W_K^T; a weights-only run."""
        from attnbase.studies.weights import weights_run

        out = weights_run(open_database(db), run, model, init=init, seed=seed, overwrite=overwrite)
        typer.echo(f"run {run!r}: " + ", ".join(
            f"{name} {METRICS[name].format(out[name])}"
            for name in (N.routing_fraction, N.routing_erank, N.share_heads_unstable)))
