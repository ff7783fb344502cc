"""``attnbase extract``: capture a model's attention over a corpus into a run of the database."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnbase.commands.dbopt import db_option

from attnbase.contract import DEFAULT_CAPTURE



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
        model: str = typer.Option(..., "--model", "-m", help="alias (minilm, smollm2-135m, gemma3-270m, "
                                  "tiny-gpt2, tiny-neox, tiny-llama, tiny-gemma3), local HF model "
                                  "directory, or hub id (needs network)"),
        revision: Optional[str] = typer.Option(None, "--revision",
                                               help="hub branch, tag or commit of a hub id (e.g. a "
                                               "Pythia checkpoint 'step1000'); recorded as MODEL@REV"),
        run: str = typer.Option(..., "--run", "-r", help="run name (letters, digits, . _ -)"),
        db: str = db_option(),
        store: Optional[str] = typer.Option(
            None, "--store", help="s3://bucket/prefix: put the run's arrays and statistics files "
            "under <prefix>/<run>/ (endpoint and credentials from AWS_ENDPOINT_URL, "
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION); default: under --db"),
        corpus: str = typer.Option("default", "--corpus", "-c",
                                   help="'default', a .txt/.jsonl/.parquet file or a directory of "
                                   ".txt; probes: 'probe:repeat-random', 'probe:random', "
                                   "'probe:repeat-token'; images: 'images:sample' or a directory "
                                   "of PNG/JPEG"),
        seqs: int = typer.Option(8, "--seqs", "-n", help="number of token windows"),
        seq_len: Optional[int] = typer.Option(
            None, "--seq-len", "-t", help="tokens per window (default 64; images: the model's)"),
        batch_size: int = typer.Option(4, "--batch-size", "-b", help="windows per forward pass"),
        dtype: str = typer.Option("float32", "--dtype",
                                  help="the model's compute dtype: float32 | float16 | bfloat16"),
        store_dtype: Optional[str] = typer.Option(
            None, "--store-dtype",
            help="what the float arrays are written in: float32 | float16 | bfloat16 (default: "
                 "float32; float16 for a float16 model); statistics always come from the "
                 "float32 logits"),
        device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N"),
        capture: str = typer.Option(
            ",".join(DEFAULT_CAPTURE), "--capture",
            help="comma-separated subset of keys,queries,logits,hidden; attn_logits are derived "
                 "from queries and keys on read where the family allows (float32), stored "
                 "otherwise; add logits to store them always"),
        seed: int = typer.Option(0, "--seed", help="seed for choosing windows"),
        variant: str = typer.Option("full", "--variant",
                                    help="ablation: full | no-mlp | no-skip | attention-only"),
        init: str = typer.Option("pretrained", "--init",
                                 help="pretrained | random (seeded re-init of the architecture)"),
        init_seed: int = typer.Option(0, "--init-seed", help="seed of --init random"),
        bos: str = typer.Option("auto", "--bos", help="auto: prepend the tokenizer's BOS where it "
                                "declares one (causal LMs); none: nothing, position 0 is text"),
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
        from attnbase.warehouse import Database
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
        database = Database(db)
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
