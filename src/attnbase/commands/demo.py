"""``attnbase demo``: the main job end to end on the embedded defaults, ending in a report."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console

DEMO_RUNS = (
    # (run id, model alias, seqs, seq_len, batch size)
    ("minilm-default", "minilm", 32, 64, 8),
    ("tiny-llama-default", "tiny-llama", 32, 64, 8),
)


def run_demo(db: Path, *, console: Console | None = None) -> Path:
    """Extract, analyse and report the demo runs into ``db``; return the report's HTML path."""
    from attnbase.extract import ExtractConfig
    from attnbase.reports import build_report
    from attnbase.stats.analyze import analyze_run
    from attnbase.runner import extract_run
    from attnbase.warehouse import Database

    console = console or Console()
    database = Database(db)
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
    paths = build_report(db, first, compare=tuple(others))
    return Path(paths.html)


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(db: Path = typer.Option(Path("attnbase-db"), "--db", help="database directory")) -> None:
        """Extract MiniLM and tiny-llama on the bundled corpus, analyse, and write a report."""
        console = Console()
        t0 = time.perf_counter()
        html = run_demo(db, console=console)
        console.print(f"report: {html}")
        console.print(f"report: {html.with_suffix('.pdf')}")
        console.print(f"demo finished in {time.perf_counter() - t0:.0f} s")
