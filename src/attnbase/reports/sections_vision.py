"""The report's high-norm patch tokens and registers (docs/metrics.md §6c; Darcet et al. 2024,
"Vision Transformers Need Registers"): per hidden state of every image run of the report (the
run and those it is compared with), the share of high-norm patch tokens and the attention
[CLS] pays them against uniform attention, side by side, with each run's extra tokens (its
registers) named. Reads ``layer_metrics`` only (the ``high_norm_*`` rows the analysis stored).
"""

from __future__ import annotations

import numpy as np
from markupsafe import Markup

from attnbase.contract import image_extra_tokens, sink_set
from attnbase.formatting import fmt
from attnbase.metrics import HIGH_NORM_RATIO, N
from attnbase.reports import figures as F
from attnbase.reports.blocks import Block, Context, Fig, Section, Table, register_section
from attnbase.reports.data import RunData


def high_norm_rows(run: RunData) -> dict[str, np.ndarray]:
    """``{metric: values [hidden state]}`` of the run's ``high_norm_*`` layer rows (NaN where a
    hidden state has none: the [CLS] attention of the last)."""
    return run.layer_family("high_norm_")


def extra_tokens(run: RunData) -> str:
    """The tokens of an image run before its patches besides [CLS]: "4 registers", "[DIST]",
    or "none" (:func:`attnbase.contract.image_extra_tokens`)."""
    r = run.run
    return image_extra_tokens(str(r.get("family") or ""),
                              len(sink_set(r.get("sink_positions")))) or "none"


def _runs(ctx: Context) -> list[tuple[RunData, dict[str, np.ndarray]]]:
    return [(r, t) for r in ctx.all_runs if (t := high_norm_rows(r))]


def _has_high_norm(ctx: Context) -> bool:
    return bool(high_norm_rows(ctx.run))


def _figure(runs: list[tuple[RunData, dict[str, np.ndarray]]]) -> str:
    import matplotlib

    with matplotlib.rc_context(F.RC):
        fig, ax = F.new_figure((7.0, 3.8))
        for i, (run, t) in enumerate(runs):
            c = F.PALETTE[i % len(F.PALETTE)]
            name = f"{run.run_id} ({extra_tokens(run)})"
            x = np.arange(len(t[N.high_norm_frac]))
            ax.plot(x, t[N.high_norm_frac], color=c, marker="o", markersize=3,
                    label=f"{name}: share of high-norm patches")
            if N.high_norm_cls_attn in t:
                ax.plot(x, t[N.high_norm_cls_attn], color=c, marker="s", markersize=3,
                        linestyle="--", label=f"{name}: [CLS] attention on them")
                ax.plot(x, t[N.high_norm_cls_uniform], color=c, linestyle=":",
                        label=f"{name}: the same if uniform")
        ax.set_xlabel("hidden state index (0 = embeddings, l = after layer l)")
        ax.set_ylabel("fraction")
        ax.set_ylim(bottom=0.0)  # a share: all-zero curves must not open a negative axis
        F.integer_x(ax)
        ax.set_title(f"High-norm patch tokens (norm > {fmt(HIGH_NORM_RATIO)} x the image's "
                     "median; §6c)")
        F.legend_outside(ax, width=0.5)
        return F.to_svg(fig)


def _high_norm(ctx: Context) -> list[Block]:
    runs = _runs(ctx)
    drawn = ", ".join(f"{r.run_id} ({extra_tokens(r)})" for r, _ in runs)
    blocks: list[Block] = [Fig(_figure(runs), Markup(
        "Per hidden state, the share of patch tokens whose residual-stream norm exceeds {} x "
        "the median patch norm of their image (solid; Darcet et al. 2024's high-norm tokens), "
        "the softmax mass the [CLS] query of the block reading that hidden state puts on them "
        "(dashed, mean over heads and images) and its value under uniform attention (dotted). "
        "Runs drawn, with the tokens each has before its patches: {}. <b>Look for</b> a run "
        "without registers whose share rises in the later layers, with [CLS] attention well "
        "above uniform, and the same model with registers near 0. Seeded tiny random models "
        "show neither: the phenomenon emerges in training.").format(fmt(HIGH_NORM_RATIO), drawn))]
    rows = []
    for run, t in runs:
        for layer in range(len(t[N.high_norm_frac])):
            v = {name: t[name][layer] for name in t}
            rows.append([run.run_id, extra_tokens(run), f"H{layer}",
                         fmt(v[N.high_norm_frac]), fmt(v[N.high_norm_max_ratio]),
                         fmt(v.get(N.high_norm_cls_attn, np.nan)),
                         fmt(v.get(N.high_norm_cls_uniform, np.nan))])
    blocks.append(Table(
        ["Run", "Before the patches", "Hidden state", "High-norm share", "Largest norm / median",
         "[CLS] attention on them", "Uniform"], rows, keys=3,
        caption="The values of the figure, run by run (layer_metrics high_norm_*): compare a "
                "run with registers against one without (--compare). The last hidden state "
                "feeds no attention block: no [CLS] values."))
    return blocks


def register() -> None:
    """Register the section (called by :mod:`attnbase.reports.sections`)."""
    register_section(Section("high_norm", "High-norm patch tokens and registers",
                             _has_high_norm, _high_norm,
                             what="high-norm patch tokens (layer_metrics high_norm_*; an image "
                                  "run that captured hidden states)",
                             command="attnbase analyze", metrics_ref="§6c",
                             note_when_missing=False))
