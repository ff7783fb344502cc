"""``attnbase extract``: capture a model's attention over a corpus into a run of the database."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnbase.commands.dbopt import db_option, open_database
from attnbase.options import EXTRACT_OPTIONS as O


def with_revision(model: str, revision: str) -> str:
    """``MODEL@REV`` for a hub id; an alias or an existing path has no revision to choose."""
    from attnbase.errors import UnknownModelError
    from attnbase.extract.models import ALIASES

    if model in ALIASES or Path(model).expanduser().exists() or "@" in model:
        raise UnknownModelError(
            f"--revision {revision!r} applies only to a hub id, not to {model!r}; drop --revision "
            "(an alias or local directory has exactly one version)"
        )
    return f"{model}@{revision}"


def register(app: typer.Typer) -> None:
    @app.command("extract")
    def extract(
        model: str = O["model"].typer(),
        revision: Optional[str] = typer.Option(None, "--revision",
                                               help="hub branch, tag or commit of a hub id (e.g. a "
                                               "Pythia checkpoint 'step1000'); recorded as MODEL@REV"),
        run: str = typer.Option(..., "--run", "-r", help="run name (letters, digits, . _ -)"),
        db: str = db_option(),
        store: Optional[str] = typer.Option(
            None, "--store", help="s3://bucket/prefix: put the run's arrays and statistics files "
            "under <prefix>/<run>/ (endpoint and credentials from AWS_ENDPOINT_URL, "
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION); default: under --db"),
        corpus: str = O["corpus"].typer(),
        seqs: int = O["n_seqs"].typer(),
        seq_len: Optional[int] = O["seq_len"].typer(),
        batch_size: int = O["batch_size"].typer(),
        dtype: str = O["dtype"].typer(),
        store_dtype: Optional[str] = O["store_dtype"].typer(),
        device: str = O["device"].typer(),
        capture: str = O["capture"].typer(),
        seed: int = O["seed"].typer(),
        variant: str = O["variant"].typer(),
        init: str = O["init"].typer(),
        init_seed: int = O["init_seed"].typer(),
        bos: str = O["bos"].typer(),
        overwrite: bool = typer.Option(False, "--overwrite",
                                       help="replace an existing run of this name"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
        repair: bool = typer.Option(False, "--repair", help="rewrite exactly the batches "
                                    "`attnbase verify` finds broken, then resume"),
        wait: bool = typer.Option(False, "--wait", help="wait for another process writing this "
                                  "run to finish (default: refuse, naming it)"),
    ) -> None:
        """Extract attention activations into the --db database as run --run (resumes an interrupted run)."""
        from attnbase.extract.config import ExtractConfig
        from attnbase.runner import extract_run

        if revision:
            model = with_revision(model, revision)
        cfg = ExtractConfig(
            model=model, corpus=corpus, n_seqs=seqs, seq_len=seq_len, batch_size=batch_size,
            dtype=dtype, store_dtype=store_dtype, device=device, seed=seed, variant=variant,
            init=init, init_seed=init_seed, bos=bos,
            capture=tuple(c.strip() for c in capture.split(",") if c.strip()),
        )
        from attnbase.runner import preflight_run

        preflight_run(run, cfg)  # every check that needs no weights, before the model loads
        database = open_database(db)
        if repair and overwrite:
            from attnbase.errors import AttnbaseError

            raise AttnbaseError("--repair mends a run in place and --overwrite replaces it; "
                                "pass one of them")
        if repair:
            from attnbase.warehouse.runs.verify import prepare_repair

            _, marked = prepare_repair(database, run)
            typer.echo(f"run {run!r}: " + (f"rewriting broken batches {marked}" if marked else
                                           "verify found nothing broken"), err=True)
        rec = extract_run(database, run, cfg, overwrite=overwrite, progress=not quiet, store=store,
                          wait=wait)
        if rec.batches_written == 0 and rec.n_batches == rec.batches_done:
            typer.echo(f"run {run!r} is already complete ({rec.n_batches} batches, "
                       f"config {rec.config_hash}); nothing to do (--overwrite recomputes it)")
            return
        from attnbase.warehouse.runs.store import RunStore

        size = RunStore(rec.store_path, run).nbytes_stored()
        from attnbase.extract.models import resolve_device

        chosen = resolve_device(device)
        why = (f" (--device auto: {'a CUDA device is available' if chosen != 'cpu' else 'no CUDA device'})"
               if device == "auto" else "")
        typer.echo(f"run {run!r} complete: {seqs} seqs x {database.run_info(run)['seq_len']} tokens on {chosen}{why}, "
                   f"{rec.batches_written}/{rec.n_batches} batches written this time, "
                   f"{size / 2**20:.1f} MiB in {rec.store_path}")
