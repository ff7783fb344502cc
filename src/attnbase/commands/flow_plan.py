"""``attnbase flow run --dry-run``: print a pipeline's plan (:mod:`attnbase.flows.plan`)."""

from __future__ import annotations

from pathlib import Path

import typer


def print_plan(config: Path, db: Path | None, strict: bool = False) -> None:
    """Validate ``config``, print one line per shard and a ``missing:`` section (inputs a real
    run needs that are not here: a corpus file, a hub model not cached, with how to get each);
    exit 2 naming the first shard that would fail its preflight (a too-long seq_len), or with
    ``strict`` when anything is missing."""
    from rich.console import Console
    from rich.table import Table

    from attnbase.flows.serving import prepare_environment

    prepare_environment(server=False)  # parsing imports the flows package (Prefect settings)
    from attnbase.flows.config import load_pipeline_config, pipeline_database
    from attnbase.flows.plan import pipeline_plan
    from attnbase.formatting import fmt_bytes

    cfg = load_pipeline_config(config)
    pipeline_database(cfg, db)  # the database as the real run resolves it
    rows = pipeline_plan(cfg)
    tab = Table(title_justify="left",
                title=f"plan of {cfg.source}: {len(rows)} run(s) into {db or cfg.db} "
                      f"(dry run: no model loaded, no network)")
    for c in ("run", "model", "layers x heads (kv) x d_head", "shape from", "settings",
              "corpus", "stored bytes", "check"):
        tab.add_column(c, justify="right" if c == "stored bytes" else "left", no_wrap=True)
    for r in rows:
        check = ("fails (below)" if r["check"] != "ok" else
                 "needs inputs (missing:)" if r["missing"] else "ok")
        tab.add_row(r["run"], r["model"], r["shape"], r["source"], r["settings"], r["corpus"],
                    fmt_bytes(r["bytes"]), check)
    known = [r["bytes"] for r in rows if r["bytes"] is not None]
    Console(width=max(400, Console().width)).print(tab)  # never cut a value
    typer.echo(f"stored bytes (raw arrays, before compression; causal logits compress ~2x): "
               f"{fmt_bytes(sum(known))} for {len(known)} of {len(rows)} run(s)"
               + (", the rest known at load" if len(known) < len(rows) else "")
               + f"; then analyze: {'yes' if cfg.analyze else 'no'}, "
                 f"report: {'yes' if cfg.report else 'no'}")
    needs: dict[str, list[str]] = {}
    for r in rows:
        for m in r["missing"]:
            needs.setdefault(m, []).append(r["run"])
    hub = list(dict.fromkeys(r["uncached"] for r in rows if r["uncached"]))
    if needs or hub:
        typer.echo("missing: what a real run needs that is not here")
        for m, runs in needs.items():
            typer.echo(f"  {m} [needed by {len(runs)} run(s)]")
        if hub:
            typer.echo(f"  {len(hub)} hub model(s) not in the local HF cache ({', '.join(hub)}): "
                       "downloaded on first use with network, or `hf download REPO --local-dir "
                       "DIR` on a machine with network, then --model DIR")
            needs.update({m: [] for m in hub})
    bad = [r for r in rows if r["check"] != "ok"]
    if strict and needs and not bad:
        typer.echo(f"error: {len(needs)} input(s) missing (--strict); see missing: above",
                   err=True)
        raise typer.Exit(2)
    if bad:
        problems = sorted({r["check"] for r in bad})
        typer.echo(f"error: {len(bad)} of {len(rows)} run(s) would fail before extracting "
                   f"({bad[0]['run']}{', ...' if len(bad) > 1 else ''}): {problems[0]}"
                   + (f" (and {len(problems) - 1} other problem(s))" if len(problems) > 1 else ""),
                   err=True)
        raise typer.Exit(2)
