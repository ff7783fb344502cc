"""The report's massive activations (docs/metrics.md §6b; Sun et al. 2024): per hidden state,
the largest residual magnitudes against the median, where the largest sits and whether it is on
a sink position. Reads ``layer_metrics`` only (the ``massive_*`` rows the analysis stored)."""

from __future__ import annotations

import numpy as np
from markupsafe import Markup

from attnbase.formatting import fmt
from attnbase.metrics import MASSIVE_MIN_ABS as MIN_ABS, MASSIVE_MIN_RATIO as MIN_RATIO, N
from attnbase.reports import figures as F
from attnbase.reports.blocks import Block, Context, Fig, Section, Table, register_section
from attnbase.reports.data import RunData
from attnbase.tokentext import token_at


def massive_table(run: RunData) -> dict[str, np.ndarray]:
    """``{metric: values [hidden state]}`` of the run's ``massive_*`` layer rows."""
    return run.layer_family("massive_")


def _has_massive(ctx: Context) -> bool:
    return bool(massive_table(ctx.run))


def _figure(runs: list[tuple[str, dict[str, np.ndarray]]]) -> str:
    import matplotlib

    with matplotlib.rc_context(F.RC):
        fig, ax = F.new_figure((7.0, 3.8))
        for i, (rid, t) in enumerate(runs):
            c = F.PALETTE[i % len(F.PALETTE)]
            x = np.arange(len(t[N.massive_top1]))
            ax.plot(x, t[N.massive_top1], color=c, marker="o", markersize=3,
                    label=f"{rid}: largest |h|")
            for k, name in ((2, N.massive_top2), (3, N.massive_top3)):
                if name in t:
                    ax.plot(x, t[name], color=c, linestyle="none", marker="_", markersize=6,
                            label=f"{rid}: 2nd and 3rd largest" if k == 2 else None)
            ax.plot(x, t[N.massive_median], color=c, linestyle="--", label=f"{rid}: median |h|")
            flagged = t.get(N.massive_flag, np.zeros_like(x, dtype=float)) == 1
            if flagged.any():
                ax.scatter(x[flagged], t[N.massive_top1][flagged], s=60, facecolors="none",
                           edgecolors=c, linewidths=1.4, label=f"{rid}: massive (Sun et al.)")
        ax.axhline(MIN_ABS, color="0.5", linestyle=":", linewidth=1.0, label=f"|h| = {MIN_ABS:g}")
        ax.set_yscale("log")
        F.integer_x(ax)
        ax.set_xlabel("hidden state index (0 = embeddings, l = after layer l)")
        ax.set_ylabel("|activation| (residual stream units, log scale)")
        ax.set_title("Massive activations per hidden state (§6b)")
        F.legend_outside(ax, width=0.58)
        return F.to_svg(fig)


def _massive(ctx: Context) -> list[Block]:
    runs = [(r.run_id, massive_table(r)) for r in ctx.all_runs]
    runs = [(rid, t) for rid, t in runs if t]
    svg = _figure(runs)
    drawn = ", ".join(rid for rid, _ in runs)
    blocks: list[Block] = [Fig(svg, Markup(
        "Per hidden state, the largest magnitude of any residual-stream entry over the run's "
        "sequences (solid, with the 2nd and 3rd largest as ticks) and the median magnitude "
        "(dashed); circled: a massive activation, above {} and {} x the median (Sun et al. "
        "2024). Runs drawn: {}. <b>Look for</b> a gap of three or more decades between the "
        "solid and dashed curves, opening after the first layers.").format(
            fmt(MIN_ABS), fmt(MIN_RATIO), drawn))]
    run, t = ctx.run, runs[0][1] if runs and runs[0][0] == ctx.run.run_id else {}
    if t:
        rows = []
        for layer in range(len(t[N.massive_top1])):
            v = {name: t[name][layer] for name in t}
            token = token_at(run.run, v.get(N.massive_token), v.get(N.massive_pos))
            where = ("—" if not np.isfinite(v.get(N.massive_pos, np.nan)) else
                     f"({int(v[N.massive_seq])}, {int(v[N.massive_pos])}, {int(v[N.massive_dim])})")
            rows.append([f"H{layer}", fmt(v[N.massive_top1]), fmt(v[N.massive_median]),
                         fmt(v[N.massive_ratio]), where, token or "—",
                         fmt(v.get(N.massive_sink_share)),
                         "yes" if v.get(N.massive_flag) == 1 else "no"])
        blocks.append(Table(
            ["Hidden state", "Largest |h|", "Median |h|", "Ratio", "At (seq, pos, dim)",
             "Token", "Sequences peaking at a sink", "Massive"], rows,
            caption=f"Run {run.run_id}: the values of the figure (layer_metrics massive_*): "
                    "where the largest entry sits and the share of sequences whose own largest "
                    "entry is at a sink position (runs.sink_positions)."))
    return blocks


def register() -> None:
    """Register the section (called by :mod:`attnbase.reports.sections`)."""
    register_section(Section("massive", "Massive activations", _has_massive, _massive,
                             what="massive activations (layer_metrics massive_*; the run "
                                  "must have captured hidden states, as the default capture "
                                  "does)",
                             command="attnbase analyze", metrics_ref="§6b"))
