"""Report section ``sinks``: the run's sink rate (Sink_1^eps, docs/metrics.md §3b) beside Gu et
al.'s published rows.

The run's row (``run_metrics.sink_rate`` and ``sink_rate_eps``, what ``runs`` records of its
corpus, window length and position 0); the published row its model and setup pair with
(:func:`attnbase.warehouse.published_sinks.pair_run`) and the difference; a run of a published
model in another setup gets that model's rows as context, labelled so; an unpaired run a note
naming every difference. The only arithmetic is the run-minus-paper difference.
"""

from __future__ import annotations

from attnbase.metrics import N
from attnbase.reports.blocks import Block, Context, Note, Section, Table, register_section
from attnbase.warehouse.published_sinks import (
    SOURCE, model_rows, pair_run, percent, run_input,
)

_HEADERS = ["row", "model", "input", "seq len", "eps", "position 0", "Sink_1^eps (%)"]


def _has_sinks(ctx: Context) -> bool:
    return ctx.run.has_run_metric(N.sink_rate)


def _sinks(ctx: Context) -> list[Block]:
    run, metrics = ctx.run.run, ctx.run.run_metrics
    model, corpus, seq_len = run.get("model"), run.get("corpus"), run.get("seq_len")
    eps, ours = metrics.get(N.sink_rate_eps), metrics.get(N.sink_rate)
    rows = [[f"this run ({ctx.run.run_id})", str(model), f"{run_input(corpus) or '-'} ({corpus})",
             str(seq_len), "-" if eps is None else f"{eps:g}", run.get("sink_token") or "-",
             percent(ours)]]
    paired, reasons = pair_run(model, corpus, seq_len, eps)
    if paired is not None:
        rows.append(["paper: this model and setup", paired["model"], paired["input"],
                     str(paired["seq_len"]), f"{paired['eps']:g}", "-",
                     f"{paired['sink_rate_percent']:.2f}"])
        rows.append(["difference (run - paper)", "", "", "", "", "",
                     f"{100 * float(ours) - paired['sink_rate_percent']:+.2f}"])
    else:
        for pub in model_rows(model):
            rows.append([f"paper: this model, {pub['input']}", pub["model"], pub["input"],
                         str(pub["seq_len"]), f"{pub['eps']:g}", "-",
                         f"{pub['sink_rate_percent']:.2f}"])
    caption = (f"Published: {SOURCE} (64-token windows, eps = 0.3; random = probe:random, "
               "repeat-token = probe:repeat-token, natural = a text corpus). This run: the "
               "fraction of (layer, head) whose attention on position 0, averaged over windows "
               "and every query, exceeds eps (run_metrics.sink_rate); position 0 is "
               "runs.sink_token; seq len counts special tokens.")
    blocks: list[Block] = [Table(_HEADERS, rows, caption=caption)]
    if paired is None:
        blocks.append(Note("not paired with a published row: " + "; ".join(reasons)))
    return blocks


def register() -> None:
    """Register the section (called by :mod:`attnbase.reports.sections`)."""
    register_section(Section("sinks", "Sink rate beside Gu et al. (Sink_1^eps)", _has_sinks,
                             _sinks, what="sink rate (run_metrics sink_rate)",
                             command="attnbase analyze", metrics_ref="§3b"),
                     before="comparison")
