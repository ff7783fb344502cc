"""The registered sections of a run report (see :mod:`attnbase.reports.blocks`).

Each section reads values the catalog already holds; the only arithmetic here is selection,
pivoting and plain means over heads or layers, each named in the figure caption.
Section numbers (§) refer to docs/metrics.md.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from markupsafe import Markup

from attnbase.formatting import fmt, fmt_p
from attnbase.metrics import HEAD_MAP_CMAPS, METRICS, N, TABLE1 as TABLE1_METRICS
from attnbase.metrics import uniform_max_share
from attnbase.reports import figures as F
from attnbase.reports.blocks import (
    Block, Context, Fig, Grid, Note, Section, Table, register_section,
)
from attnbase.reports.data import MIN_ROW_KEYS, RunData
from attnbase.reports.sections_compositional import register_compositional_sections

#: The Table-1 row's (metric, label), as :mod:`attnbase.metrics` declares them.
TABLE1 = tuple((name, METRICS[name].label) for name in TABLE1_METRICS)
#: The head maps: (metric, title, colour-bar label, cmap); names, labels and units from the
#: registry.
HEAD_MAPS = tuple(
    (name, f"{METRICS[name].label} ({METRICS[name].section})",
     f"{METRICS[name].label} ({METRICS[name].unit})", cmap)
    for name, cmap in HEAD_MAP_CMAPS.items())
DEFAULT_ONSET_THRESHOLD = 0.20  # docs/metrics.md §3 default
Q_LEVEL = 0.05


# --- formatting --------------------------------------------------------------------------------
def _finite(x) -> bool:
    return x is not None and isinstance(x, int | float) and math.isfinite(x)


# --- selections shared by sections -------------------------------------------------------------
def layer_mean(run: RunData, metric: str) -> np.ndarray:
    """Per-layer value: ``layer_metrics[metric]`` where stored, else the mean over heads."""
    if run.has_layer_metric(metric):
        return run.layer_series(metric)
    with np.errstate(all="ignore"):
        return np.nanmean(run.head_matrix(metric), axis=1)


def null_band(run: RunData, metric: str, null: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-layer mean over heads of the stored null mean and null sd; None without rows."""
    df = run.nulls(metric, null)
    if df.height == 0:
        return None
    by = (df.group_by("layer").agg(pl.col("null_mean").mean(), pl.col("null_sd").mean())
          .sort("layer"))
    mean = np.full(run.n_layers, np.nan)
    sd = np.full(run.n_layers, np.nan)
    for layer, m, s in by.iter_rows():
        if 0 <= layer < run.n_layers:
            mean[layer], sd[layer] = m, s
    return mean, sd


def onset_layer(run: RunData) -> int | None:
    v = run.run_metrics.get(N.onset_layer)
    return int(v) if _finite(v) else None


def onset_threshold(run: RunData) -> float:
    v = run.run_metrics.get("onset_threshold")
    return float(v) if _finite(v) else DEFAULT_ONSET_THRESHOLD


def heads_beating(run: RunData, metric: str, null: str) -> tuple[int, int] | None:
    df = run.nulls(metric, null)
    if df.height == 0:
        return None
    q = df["q_value"].fill_nan(None)
    return int((q < Q_LEVEL).sum()), df.height


def table1_row(run: RunData) -> list[str]:
    return [run.run_id, str(run.run.get("model", ""))] + [
        fmt_p(run.run_metrics.get(m)) if METRICS[m].unit == "p-value"
        else fmt(run.run_metrics.get(m)) for m, _ in TABLE1
    ]


def table1_headers() -> list[str]:
    return ["run", "model"] + [label for _, label in TABLE1]


# --- sections ----------------------------------------------------------------------------------
def _run_overview(ctx: Context) -> list[Block]:
    r = ctx.run.run
    rows = [
        ["model", r.get("model")], ["model revision", r.get("model_revision")],
        ["family", r.get("family")],
        ["layers × heads (kv heads)",
         f"{r.get('n_layers')} × {r.get('n_heads')} ({r.get('n_kv_heads')})"],
        ["d_head / d_model", f"{r.get('d_head')} / {r.get('d_model')}"],
        ["sequences × tokens", f"{r.get('n_seqs')} × {r.get('seq_len')}"],
        ["corpus", r.get("corpus")], ["dtype", r.get("dtype")], ["status", r.get("status")],
    ]
    # a run that is not complete is flagged once, at the top of the report (render.py)
    return [Table(["field", "value"], [[k, fmt(v)] for k, v in rows])]


def _table1(ctx: Context) -> list[Block]:
    run = ctx.run
    blocks: list[Block] = [
        Table(table1_headers(), [table1_row(run)],
              caption="Table 1 row of this run (run_metrics) with its null baselines: compare "
                      "key-norm CV with the isotropic baseline 1/√(2 d_head) (§1) and VE@8 with "
                      "the Gauss and shuffle nulls (§2). Model figures are means over layers of "
                      "means over heads. The onset layer is 0-based; its depth is "
                      "onset_layer / n_layers (§3).")
    ] + dequantised_note([run])
    m = run.run_metrics
    extra = [(label, fmt(m.get(key))) for key, label in (
        (N.r_cv_share_ci_low, "r(CV, max share) 95% CI low"),
        (N.r_cv_share_ci_high, "r(CV, max share) 95% CI high"),
        (N.r_cv_share_spearman, "Spearman ρ(CV, max share)"),
        (N.r_cv_share_spearman_p, "p of Spearman ρ"),
        (N.n_head_pairs, "(layer, head) pairs"),
        ("onset_threshold", "onset threshold"),
    ) if key in m]
    if extra:
        blocks.append(Table(["statistic", "value"], [list(e) for e in extra],
                            caption="The correlation behind r(CV, max share) (§3): bootstrap CI "
                                    "over heads and the rank correlation alongside."))
    rows = []
    for null in ("gauss", "shuffle"):
        got = heads_beating(run, N.ve_at_8, null)
        if got is not None:
            rows.append([f"VE@8 vs {null} null", f"{got[0]} of {got[1]}"])
    if rows:
        blocks.append(Table(["test", f"heads with BH q < {Q_LEVEL}"], rows,
                            caption="Heads whose VE@8 exceeds the null (one-sided p-values "
                                    "of the mean over sequences, by the CLT on per-sequence "
                                    "null draws; Benjamini-Hochberg across heads, §2, §8)."))
    return blocks


def _has_table1(ctx: Context) -> bool:
    return any(ctx.run.has_run_metric(m) for m, _ in TABLE1)


def _norm_cv(ctx: Context) -> list[Block]:
    run = ctx.run
    base = run.run_metrics.get(N.key_norm_cv_baseline)
    refs = [F.Ref(f"isotropic Gaussian baseline 1/√(2·{run.run.get('d_head')}) = "
                  f"{fmt(base, 4, style='fixed')}", base)] if _finite(base) else []
    svg = F.layer_curve(run.head_matrix(N.key_norm_cv), layer_mean=layer_mean(run, N.key_norm_cv),
                        ylabel="key-norm CV (std / mean of ‖k‖, dimensionless)",
                        title="Key-norm stratification per layer", label="mean over heads",
                        refs=refs)
    against = ("the dashed isotropic baseline" if refs else
               "the isotropic baseline 1/√(2 d_head) (not stored for this run, so not drawn)")
    keys = "pre-RoPE key" if run.run.get("rotary") else "key"
    return [Fig(svg, Markup(
        "Coefficient of variation of {} norms per head (dots) and its mean over heads "
        "(line), pooled over sequences and tokens (§1). <b>Look for</b> heads far above "
        "{}: keys whose norms are stratified (typically the sink) rather than spread like an "
        "isotropic Gaussian.").format(keys, against))]


def _ve(ctx: Context) -> list[Block]:
    run = ctx.run
    bands = []
    for null, color in (("gauss", F.PALETTE[1]), ("shuffle", F.PALETTE[2])):
        got = null_band(run, N.ve_at_8, null)
        if got is not None:
            bands.append(F.Band(f"{null} null", got[0], got[1], color))
    svg = F.layer_curve(run.head_matrix(N.ve_at_8), layer_mean=layer_mean(run, N.ve_at_8),
                        ylabel="VE@8 (fraction of key variance)",
                        title="Key geometry: rank-8 variance explained vs nulls",
                        label="mean over heads", bands=bands, ylim=(0, 1.02))
    draws = ", ".join(
        f"{n}: {fmt(d)} draws" for n, d in
        run.null_tests.filter(pl.col("metric") == N.ve_at_8).group_by("null_model")
        .agg(pl.col("draws").max()).sort("null_model").iter_rows())
    if bands:
        nulls = " and ".join(b.label for b in bands)
        band_text = Markup("Shaded bands are the {} means ± one null sd (averaged over the "
                           "layer's heads; {}); where that sd is small, a band is no wider than "
                           "its mean's line. ").format(nulls, draws)
        look = Markup("<b>Look for</b> layers whose heads sit above the band{}: low-dimensional "
                      "key geometry that the null{} do{} not reproduce.").format(
            "s" if len(bands) > 1 else "", "s" if len(bands) > 1 else "",
            "" if len(bands) > 1 else "es")
    else:
        band_text = Markup("No null draws are stored for this run, so no null is drawn. ")
        look = Markup("<b>Look for</b> layers far above the 8 / d_head share an isotropic "
                      "cloud would give; run `attnbase analyze` for the nulls.")
    return [Fig(svg, Markup(
        "Share of centred-key variance captured by the top 8 singular values, per sequence then "
        "averaged (§2); dots are heads, the line the mean over heads. ") + band_text + look)]


def _max_share(ctx: Context) -> list[Block]:
    run = ctx.run
    onset = onset_layer(run)
    thr = onset_threshold(run)
    refs = [F.Ref(f"onset threshold {fmt(thr, 2, style='fixed')}", thr, "#000000", ":")]
    uniform = uniform_causal_max_share(run)
    if uniform is not None:
        refs.append(F.Ref(f"uniform causal attention H_T/T = {fmt(uniform, 4, style='fixed')} (T = "
                          f"{run.run.get('seq_len')})", uniform, "#555555", "--"))
    svg = F.layer_curve(run.head_matrix(N.max_share), layer_mean=layer_mean(run, N.max_share),
                        ylabel="max share (fraction of all attention)",
                        title="Attention concentration and onset", label="mean over heads",
                        refs=refs, onset=onset, ylim=(0, 1.02))
    where = (Markup("L{} (depth {:.0%}, the dash-dot line)").format(onset, onset / max(run.n_layers, 1))
             if onset is not None and 0 <= onset < run.n_layers else "not reached in this run")
    base = (Markup(" The dashed line is the max share of uniform causal attention, H_T/T (§3): "
                   "heads near it attend evenly.") if uniform is not None else "")
    return [Fig(svg, Markup(
        "Column share of the most-attended key position per head (dots; §3) and the mean over "
        "heads (line); the dotted line is the onset threshold. The onset layer, the first layer "
        "whose mean exceeds the threshold, is {}.{} <b>Look for</b> the jump at onset: from "
        "there on most heads send a large share of their attention to one position.").format(
            where, base))]


def uniform_causal_max_share(run: RunData) -> float | None:
    """max_share of uniform causal attention over T tokens, H_T / T (docs/metrics.md §3); None for
    bidirectional runs. T = 128 gives 0.04245."""
    T = run.run.get("seq_len")
    if not run.run.get("causal") or not T:
        return None
    return uniform_max_share(int(T), causal=True)


def _head_maps(ctx: Context) -> list[Block]:
    run = ctx.run
    figs = [
        Fig(F.heatmap(run.head_matrix(m), title=title, cbar_label=cbar, cmap=cmap),
            caption=title, title=title)
        for m, title, cbar, cmap in HEAD_MAPS if run.has_head_metric(m)
    ]
    return [Grid(figs, Markup(
        "One cell per (layer, head), rows are layers from the input down. <b>Look for</b> "
        "whether the heads with high max share are the heads with high key-norm CV (their "
        "correlation is r(CV, max share) in Table 1) and whether they cluster in depth."))]


#: Sink mass and max share agreeing this closely on every head draw the same picture twice.
SAME_MAP_TOL = 0.01


def _concentration(ctx: Context) -> list[Block]:
    run = ctx.run
    n_rows = int(run.row_heads["n_rows"].sum())
    sink = run.row_matrix("sink_mass")
    share = run.head_matrix(N.max_share) if run.has_head_metric(N.max_share) else None
    with np.errstate(all="ignore"):
        gap = float(np.nanmax(np.abs(sink - share))) if share is not None else np.inf
    repeats = share is not None and np.isfinite(gap) and gap < SAME_MAP_TOL
    figs = []
    if not repeats:
        figs.append(Fig(F.heatmap(sink, title="Sink mass A[i, 0] (§3)",
                                  cbar_label="attention on key 0 (fraction)", cmap="magma",
                                  vmin=0, vmax=1), "sink mass", "Sink mass"))
    figs += [
        Fig(F.heatmap(run.row_matrix("sink_balance"), title="Sink balance b(p) (§4)",
                      cbar_label="sink balance (clr units, nats)", cmap="RdBu_r", center=0.0),
            "sink balance", "Sink balance"),
        Fig(F.heatmap(run.row_matrix("max_prob"), title="Row max probability (§3)",
                      cbar_label="max_j A[i, j] (fraction)", cmap="viridis", vmin=0, vmax=1),
            "max prob", "Row max probability"),
    ]
    same = (Markup(" The sink-mass map is not drawn: it equals the max-share map of the "
                   "layer × head maps within {:.3f} on every head (key 0 is each head's "
                   "most-attended key).").format(gap) if repeats else "")
    return [Grid(figs, Markup(
        "Means over {} attention rows with at least {} unmasked keys (row_stats).{} Sink balance "
        "b(p) = √((n−1)/n)·(ln p₀ − mean ln p_j) compares key 0 with the geometric mean of the "
        "content keys; it is a log-ratio, not a share, so it can be large while the sink mass "
        "is small (when most content keys get almost nothing). <b>Look for</b> heads with high "
        "sink mass (sink heads); among the rest, the balance tells whether key 0 still "
        "outranks a typical content key (b &gt; 0) or gets less than one (b &lt; 0).").format(
            f"{n_rows:,}", MIN_ROW_KEYS, same))]


def _entropy(ctx: Context) -> list[Block]:
    rl = ctx.run.row_layers
    layers = rl["layer"].to_numpy()
    svg = F.entropy_decomposition(layers, rl["entropy"].to_numpy(), rl["sink_part"].to_numpy(),
                                  rl["content_part"].to_numpy())
    return [Fig(svg, Markup(
        "Mean over all rows with n ≥ {} keys (all heads of a layer) of H(p), the binary "
        "entropy H_b(s) of the sink mass s and (1 − s)·H(π), the content entropy weighted by "
        "the non-sink mass (§4, nats). The bars add up to the diamond exactly, row by row. "
        "<b>Look for</b> which part carries the layer-to-layer change in entropy: a falling "
        "sink part means rows committing to the sink, a falling content part means sharper "
        "content attention.").format(MIN_ROW_KEYS))]


def dequantised_note(runs: list[RunData]) -> list[Block]:
    """A note naming the runs whose weights are dequantised GGUF (model_revision says so)."""
    q = [f"{r.run_id} ({r.run.get('model_revision')})" for r in runs
         if "dequantised" in str(r.run.get("model_revision") or "")]
    return [Note("weights dequantised from 4-bit GGUF for " + "; ".join(q) + ": absolute values "
                 "(norms, perplexities) differ from the original checkpoints")] if q else []


def _compare(ctx: Context) -> list[Block]:
    runs = ctx.all_runs
    blocks: list[Block] = [
        Table(table1_headers(), [table1_row(r) for r in runs],
              caption="Table 1 rows of every compared run (run_metrics), with their own null "
                      "baselines (§1-3).")
    ] + dequantised_note(runs)

    def depth(r: RunData) -> np.ndarray:
        return np.arange(r.n_layers) / max(r.n_layers, 1)

    def od(r: RunData) -> float | None:
        v = r.run_metrics.get(N.onset_depth)
        return float(v) if _finite(v) else None

    specs = (
        (N.key_norm_cv, "key-norm CV (dimensionless)", "Key-norm CV, mean over heads (§1)",
         lambda r: r.run_metrics.get(N.key_norm_cv_baseline), "isotropic baseline", None, None),
        (N.ve_at_8, "VE@8 (fraction of key variance)", "VE@8, mean over heads (§2)",
         lambda r: r.run_metrics.get(N.ve_gauss), "Gauss null", None, None),
        (N.max_share, "max share (fraction of all attention)",
         "Max share, mean over heads (§3)", lambda r: None, None, od, "onset"),
    )
    # the sink mass is drawn dotted inside the max-share figure: where key 0 is the
    # most-attended key the two curves coincide, and a figure of its own repeated that one
    sink = {r.run_id: F.Series("sink mass A[i, 0]", depth(r),
                               np.nanmean(r.row_matrix("sink_mass"), axis=1))
            for r in runs if r.row_heads.height > 0}
    for metric, ylabel, title, ref, ref_label, marker, marker_label in specs:
        series = [
            F.Series(r.run_id, depth(r), layer_mean(r, metric),
                     ref=(float(ref(r)) if _finite(ref(r)) else None),
                     marker_x=(marker(r) if marker else None),
                     companion=sink.get(r.run_id) if metric == N.max_share else None)
            for r in runs if r.has_head_metric(metric) or r.has_layer_metric(metric)
        ]
        if series:
            svg = F.overlay(series, ylabel=ylabel, title=title, ref_label=ref_label,
                            marker_label=marker_label)
            marks = []
            if "dashed" in svg.drawn:
                marks.append(f"dashed lines are each run's own {ref_label}")
            if "dash-dot" in svg.drawn:
                marks.append(f"dash-dot lines its {marker_label} depth")
            if "dotted" in svg.drawn:
                marks.append(Markup("dotted lines its sink mass, the mean attention on key 0 "
                                    "(row_stats, rows with ≥ {} keys): where dotted and solid "
                                    "meet, the most-attended key is the sink").format(MIN_ROW_KEYS))
            blocks.append(Fig(svg, Markup(
                "{} per layer for each run, on depth fraction layer / n_layers so models of "
                "different depth line up{}. <b>Look for</b> where the curves separate.").format(
                    title, Markup("; ") + Markup(", ").join(marks) if marks else "")))
    if sink and not any(r.has_head_metric(N.max_share) or r.has_layer_metric(N.max_share)
                        for r in runs):  # no max-share figure to carry the sink curves
        blocks.append(Fig(F.overlay([F.Series(rid, s.depth, s.y) for rid, s in sink.items()],
                                    ylabel="sink mass A[i, 0] (fraction)",
                                    title="Sink mass, mean over heads and rows (§3)"), Markup(
            "Mean attention on key 0 per layer (row_stats, rows with ≥ {} keys). <b>Look for</b> "
            "the depth at which each model starts parking attention on the sink.").format(
                MIN_ROW_KEYS)))
    missing = [r.run_id for r in runs if not any(r.has_run_metric(m) for m, _ in TABLE1)]
    if missing:
        blocks.append(Note("no Table-1 metrics in the catalog for " + ", ".join(missing)
                           + "; run `attnbase analyze` to compute them"))
    return blocks


def _register_defaults() -> None:
    register_section(Section("run", "Run", lambda c: True, _run_overview, note_when_missing=False))
    register_section(Section("table1", "Collapse signature (Table 1)", _has_table1, _table1,
                             what="Table-1 metrics (run_metrics)", metrics_ref="§1-3, §8"))
    register_section(Section("comparison", "Comparison across runs",
                             lambda c: bool(c.compare), _compare, note_when_missing=False,
                             metrics_ref="§1-3"))
    register_section(Section("norm_cv", "Key-norm stratification",
                             lambda c: c.run.has_head_metric(N.key_norm_cv), _norm_cv,
                             what="key_norm_cv per head", metrics_ref="§1"))
    register_section(Section("ve", "Key geometry: VE@8 against its nulls",
                             lambda c: c.run.has_head_metric(N.ve_at_8), _ve,
                             what="ve_at_8 per head", metrics_ref="§2, §8"))
    register_section(Section(N.max_share, "Concentration and onset",
                             lambda c: c.run.has_head_metric(N.max_share), _max_share,
                             what="max_share per head", metrics_ref="§3"))
    register_section(Section("head_maps", "Layer × head maps",
                             lambda c: any(c.run.has_head_metric(m) for m, *_ in HEAD_MAPS),
                             _head_maps, what="head_metrics", metrics_ref="§1-3, §7"))
    register_section(Section("concentration", "Attention concentration (row statistics)",
                             lambda c: c.run.row_heads.height > 0, _concentration,
                             what="row_stats", command="attnbase verify --db {db} --run {run}",
                             metrics_ref="§3-4"))
    register_section(Section("entropy", "Entropy decomposition",
                             lambda c: c.run.row_layers.height > 0, _entropy,
                             what="row entropies (row_stats)",
                             command="attnbase verify --db {db} --run {run}",
                             metrics_ref="§4"))
    register_compositional_sections()  # conventions, pruning, entropy_change (§4-5)
    # depth and weights (§6-7): rank_collapse, paths, spectral
    from attnbase.reports import sections_depth

    sections_depth.register()
    from attnbase.reports import sections_massive  # massive activations (§6b)

    sections_massive.register()
    from attnbase.reports import sections_vision  # high-norm patch tokens and registers (§6c)

    sections_vision.register()
    from attnbase.reports import sections_paper  # the paper's Table 1 and r conventions (§3a)

    sections_paper.register()


_register_defaults()
