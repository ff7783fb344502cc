"""Report sections for depth and weights (docs/metrics.md §6-7): rank collapse per ablation variant,
attention path products, routing vs filtering per layer and the spectral cascade.

Only catalog rows are read (``layer_metrics``, ``head_metrics``, ``studies``/``study_results``,
``runs``); the arithmetic is selection and plain means over heads, named in each caption.
Sibling runs (the same model's other ablation variants and initialisations, and its weights-only
run) are found through ``runs.model``, the base of ``runs.model_revision`` and ``runs.config``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from markupsafe import Markup

from attnbase.contract import WEIGHTS_CORPUS
from attnbase.formatting import fmt
from attnbase.metrics import N, S
from attnbase.reports import figures as F
from attnbase.reports.blocks import Block, Context, Fig, Grid, Note, Section, Table, register_section
from attnbase.reports.data import RunData, read_catalog

if TYPE_CHECKING:
    from attnbase.warehouse import Database

RANK_COLLAPSE, RANK_COLLAPSE_SD = N.rank_collapse, N.rank_collapse_sd
VARIANT_ORDER = ("full", "no-mlp", "no-skip", "attention-only")
#: float32 rounding floor of a composite-norm ratio (the ratio of a fully collapsed stream)
LOG_FLOOR = 1e-8


def _base_revision(rev) -> str:
    return str(rev or "").split("+random-init")[0]


def _has_config_column(db: Database) -> bool:
    cols = read_catalog(db, "SELECT column_name FROM information_schema.columns "
                            "WHERE table_name = 'runs'")
    return "config" in set(cols["column_name"].to_list())


def _variant_of(config) -> tuple[str, str]:
    try:
        c = json.loads(config) if config else {}
    except (TypeError, ValueError):
        c = {}
    return str(c.get("variant", "full")), str(c.get("init", "pretrained"))


def _collapse_curves(ctx: Context, metric: str = RANK_COLLAPSE
                     ) -> list[tuple[str, str, str, np.ndarray, np.ndarray, np.ndarray]]:
    """``(run_id, variant, init, layers, mean, sd)`` of ``metric`` (and ``<metric>_sd``) for the
    runs this figure draws: the report's run, the runs it is compared with, and its ablation
    siblings: runs of the same model, base revision and corpus whose (variant, init) differs
    from the run's own. Another run of the same variant and init (a re-extraction, another
    study's run) is not a sibling and is not drawn unless asked for with ``--compare``."""
    metric_sd = f"{metric}_sd"
    run = ctx.run
    own = _variant_of(run.run.get("config"))
    ids = {run.run_id: own}
    for other in ctx.compare:
        ids.setdefault(other.run_id, _variant_of(other.run.get("config")))
    if ctx.db is not None and _has_config_column(ctx.db):
        df = read_catalog(ctx.db, "SELECT run_id, model_revision, config FROM runs "
                                  "WHERE model = ? AND corpus = ? AND run_id <> ? "
                                  "ORDER BY run_id",
                          [run.run.get("model"), run.run.get("corpus"), run.run_id])
        base = _base_revision(run.run.get("model_revision"))
        for rid, rev, config in df.iter_rows():
            variant = _variant_of(config)
            if _base_revision(rev) == base and variant != own:
                ids.setdefault(rid, variant)
    rows = read_catalog(
        ctx.db, "SELECT run_id, layer, metric, value FROM layer_metrics WHERE metric IN "
                "(?, ?) AND list_contains(?, run_id) ORDER BY run_id, layer",
        [metric, metric_sd, list(ids)]) if ctx.db is not None else run.layer_metrics.filter(
        pl.col("metric").is_in([metric, metric_sd])).with_columns(
        pl.lit(run.run_id).alias("run_id"))
    out = []
    for rid, (variant, init) in ids.items():
        d = rows.filter(pl.col("run_id") == rid)
        m = d.filter(pl.col("metric") == metric).sort("layer")
        if m.height == 0:
            continue
        sd = dict(d.filter(pl.col("metric") == metric_sd).select("layer", "value").iter_rows())
        layers = m["layer"].to_numpy()
        out.append((rid, variant, init, layers, m["value"].to_numpy().astype(float),
                    np.array([np.nan if sd.get(int(x)) is None else sd[int(x)] for x in layers])))
    key = {v: i for i, v in enumerate(VARIANT_ORDER)}
    return sorted(out, key=lambda c: (c[2] != "pretrained", key.get(c[1], 99), c[0]))


def curve_label(run_id: str, variant: str, init: str) -> str:
    """A curve's legend entry: its run, then its variant and init (``"r1: full, pretrained"``),
    so that two runs of the same variant stay apart."""
    return f"{run_id}: {variant}, {init}"


def _has_collapse(ctx: Context) -> bool:
    return ctx.run.has_layer_metric(RANK_COLLAPSE)


def _collapse_figure(curves, title: str, ylabel: str) -> str:
    import matplotlib

    colour = {v: F.PALETTE[i % len(F.PALETTE)] for i, v in enumerate(VARIANT_ORDER)}
    with matplotlib.rc_context(F.RC):
        fig, ax = F.new_figure((7.0, 3.8))
        for rid, variant, init, layers, mean, sd in curves:
            c = colour.get(variant, "#555555")
            ls = "-" if init == "pretrained" else "--"
            y = np.clip(mean, LOG_FLOOR, None)
            lo = np.clip(mean - np.nan_to_num(sd), LOG_FLOOR, None)
            hi = np.clip(mean + np.nan_to_num(sd), LOG_FLOOR, None)
            ax.fill_between(layers, lo, hi, color=c, alpha=0.12, linewidth=0)
            ax.plot(layers, y, color=c, linestyle=ls, marker="o", markersize=3,
                    label=curve_label(rid, variant, init))
        ax.set_yscale("log")
        _plain_log_ticks(ax)
        ax.set_xlabel("hidden state index (0 = embeddings, l = after layer l)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        F.legend_outside(ax, width=0.62)
        return F.to_svg(fig)


def _plain_log_ticks(ax) -> None:
    """Log axes over less than ~1.5 decades (e.g. 0.6-1.0) tick plain decimals ("0.7"), not
    "7x10^-1"; wider ones keep matplotlib's decade labels."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo < 10 ** 1.5:
        plain = FuncFormatter(lambda v, _: fmt(float(v), 2, style="plain"))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())


def _collapse(ctx: Context) -> list[Block]:
    curves = _collapse_curves(ctx)
    svg = _collapse_figure(curves, "Rank collapse across depth per ablation variant (§6)",
                           "‖res(H)‖₁,∞ / ‖H‖₁,∞ (ratio, log scale)")
    runs = ", ".join(f"{rid} ({v}, {i})" for rid, v, i, *_ in curves)
    random_init = any(i != "pretrained" for _, _, i, *_ in curves)
    style = ("solid: pretrained weights, dashed: random initialisation" if random_init else
             "every run drawn has pretrained weights (no random-initialisation run of this "
             "model in the catalog)")
    contrast = (", and how the dashed curves differ from the solid ones" if random_init else "")
    blocks: list[Block] = [Fig(svg, Markup(
        "Mean over sequences of the composite-norm ratio of the residual after removing the "
        "token mean, per hidden state (§6); shaded bands are ± 1 sd over sequences, cut at the "
        "axis floor {} where they reach zero or below. Colour: ablation variant; {}. Runs "
        "drawn: {}. <b>Look for</b> which curves fall toward the floor with depth and which "
        "stay level{}.").format(LOG_FLOOR, style, runs, contrast))]
    excl = _collapse_curves(ctx, N.rank_collapse_excl_sink)
    if excl and ctx.run.run.get("causal"):
        blocks.append(Fig(_collapse_figure(
            excl, "Rank collapse without token 0 (§6)",
            "‖res(H₁..)‖₁,∞ / ‖H₁..‖₁,∞ (ratio, log scale)"), Markup(
            "As above, computed over tokens 1.. only (the BOS/sink token left out), for the same "
            "runs. <b>Look for</b> curves that differ from the figure above: there the sink "
            "token's activation dominates both norms.")))
    n = max(len(c[3]) for c in curves)
    headers = ["Run", "Variant", "Init"] + [f"H{i}" for i in range(n)]
    rows = [[rid, v, i] + [f"{fmt(m)} ± {fmt(s)}" for m, s in zip(mean, sd)]
            + ["-"] * (n - len(mean))  # a shallower run compared: no such hidden state
            for rid, v, i, _, mean, sd in curves]
    blocks.append(Table(headers, rows, keys=3, caption="The values of the first figure: mean ± sd over "
                                               "sequences per hidden state H0 (embeddings), "
                                               "H1, ... (after layer l)."))
    if len(curves) == 1:
        blocks.append(Note("no ablation-variant runs of this model in the catalog; extract them "
                           "with `attnbase extract --variant no-skip|no-mlp|attention-only "
                           "[--init random]` and analyse them"))
    return blocks


# --- path products ------------------------------------------------------------------------------
def _path_studies(run: RunData) -> dict[str, tuple[dict, dict[int, dict[str, float]]]]:
    s = run.studies.filter(pl.col("kind") == "paths")
    out: dict[str, tuple[dict, dict[int, dict[str, float]]]] = {}
    for sid, _kind, params, key, value in s.iter_rows():
        stat, _, length = key.partition("/")
        if not length.isdigit():
            continue
        p, per = out.setdefault(sid, (json.loads(params) if params else {}, {}))
        per.setdefault(int(length), {})[stat] = value
    return out


def _has_paths(ctx: Context) -> bool:
    return bool(_path_studies(ctx.run))


def _paths(ctx: Context) -> list[Block]:
    import matplotlib

    studies = _path_studies(ctx.run)
    width = 0.8 / len(studies)
    with matplotlib.rc_context(F.RC):
        fig, ax = F.new_figure((7.0, 3.6))
        handles = []
        for i, (sid, (params, per)) in enumerate(sorted(studies.items())):
            lengths = sorted(per)
            P = S.paths
            stats = [{"med": per[k][P.ratio_median], "q1": per[k][P.ratio_q25],
                      "q3": per[k][P.ratio_q75], "whislo": per[k][P.ratio_q05],
                      "whishi": per[k][P.ratio_q95], "label": str(k)} for k in lengths]
            pos = np.array(lengths) + (i - (len(studies) - 1) / 2) * width
            c = F.PALETTE[i % len(F.PALETTE)]
            b = ax.bxp(stats, positions=pos, widths=width * 0.9, showfliers=False,
                       patch_artist=True, boxprops={"facecolor": c, "alpha": 0.35, "edgecolor": c},
                       medianprops={"color": c}, whiskerprops={"color": c}, capprops={"color": c},
                       manage_ticks=False)
            b["boxes"][0].set_label(f"{params.get('order', '?')} order ({sid})")
            handles.append(b["boxes"][0])
        ax.set_yscale("log")
        ax.set_xticks(sorted({k for _, per in studies.values() for k in per}))
        ax.set_xlabel("path length (number of attention matrices multiplied)")
        ax.set_ylabel("‖P − P₁‖₁,∞ / ‖P‖₁,∞ (ratio, log scale)")
        ax.set_title("Rank-1 residual of attention path products (§6)")
        _plain_log_ticks(ax)
        F.legend_outside(ax)
        svg = F.to_svg(fig)
    desc = "; ".join(f"{sid}: {p.get('draws')} paths per length and sequence, "
                     f"{p.get('seqs')} sequences, seed {p.get('seed')}"
                     for sid, (p, _) in sorted(studies.items()))
    return [Fig(svg, Markup(
        "Per path length: box from the 25th to the 75th percentile, line at the median, "
        "whiskers at the 5th and 95th percentiles of the ratio over all sampled paths and "
        "sequences (study_results). P multiplies the softmax of the captured logits of one "
        "random head per layer over distinct layers; P₁ is its best rank-1 approximation. "
        "Forward order is A_lk ⋯ A_l1, ascending order A_l1 ⋯ A_lk. Studies: {}. <b>Look for</b> "
        "how fast the boxes fall with path length.").format(desc))]


# --- weights: routing vs filtering ---------------------------------------------------------------
#: Human headers of the per-layer S-D table (head_metrics names as stored -> column header).
SD_HEADERS = {N.routing_fraction: "Routing fraction", N.routing_erank: "Routing eff. rank",
              N.routing_erank_pr: "Routing eff. rank (PR)", N.filtering_erank: "Filtering eff. rank",
              N.n_unstable: "Unstable eigenvalues", N.max_real_eig: "Largest real part"}
def _weights_head_metrics(ctx: Context) -> tuple[str, pl.DataFrame] | None:
    run = ctx.run
    if run.has_head_metric(N.routing_fraction):
        return run.run_id, run.head_metrics
    if ctx.db is None:
        return None
    df = read_catalog(ctx.db, "SELECT run_id FROM runs WHERE corpus = ? AND model_revision = ? "
                              "ORDER BY run_id LIMIT 1",
                      [WEIGHTS_CORPUS, run.run.get("model_revision")])
    if df.height == 0:
        return None
    rid = df["run_id"][0]
    return rid, read_catalog(ctx.db, "SELECT layer, head, metric, value FROM head_metrics "
                                     "WHERE run_id = ?", [rid])


def _has_spectral(ctx: Context) -> bool:
    return _weights_head_metrics(ctx) is not None


def _per_layer(hm: pl.DataFrame, metric: str, n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean over heads per layer, and the [layer, head] matrix."""
    d = hm.filter(pl.col("metric") == metric)
    n_heads = int(d["head"].max()) + 1 if d.height else 0
    mat = np.full((n_layers, n_heads), np.nan)
    for layer, head, value in d.select("layer", "head", "value").iter_rows():
        if layer < n_layers and value is not None:
            mat[layer, head] = value
    with np.errstate(all="ignore"):
        return np.nanmean(mat, axis=1) if n_heads else np.full(n_layers, np.nan), mat


def _spectral(ctx: Context) -> list[Block]:
    import matplotlib

    rid, hm = _weights_head_metrics(ctx)
    L = ctx.run.n_layers or (int(hm["layer"].max()) + 1)
    layers = np.arange(L)
    have = set(hm["metric"].unique().to_list())
    blocks: list[Block] = []
    src = "this run" if rid == ctx.run.run_id else f"the weights-only run {rid} of the same model revision"
    if ctx.run.run.get("rotary"):
        blocks.append(Note("rotary model: M = W_Q W_Kᵀ is the bilinear form before the rotary "
                           "position rotation is applied to queries and keys"))
    if ctx.run.run.get("family") == "gemma3":
        blocks.append(Note("QK-norm model: the q_norm/k_norm gains are folded into W_Q and W_K; "
                           "the form ignores the per-token RMS normalisation of queries and keys"))
    rf, rf_mat = _per_layer(hm, N.routing_fraction, L)
    with matplotlib.rc_context(F.RC):
        fig, ax = F.new_figure()
        ax.bar(layers, rf, color=F.PALETTE[1], label="routing ‖A‖²_F / ‖M‖²_F")
        ax.bar(layers, 1 - rf, bottom=rf, color=F.PALETTE[0], alpha=0.6,
               label="filtering ‖S‖²_F / ‖M‖²_F")
        ax.set_ylim(0, 1)
        ax.set_xlabel("layer (0-based index)")
        ax.set_ylabel("share of ‖M‖²_F (fraction)")
        ax.set_title("Routing vs filtering per layer (§7)")
        F.legend_outside(ax)
        svg = F.to_svg(fig)
    blocks.append(Fig(svg, Markup(
        "Mean over the heads of each layer of the routing fraction ‖A‖²_F/‖M‖²_F (red) and "
        "its complement, the filtering fraction ‖S‖²_F/‖M‖²_F (blue), of M = W_Q W_Kᵀ with "
        "S, A its symmetric and antisymmetric parts (§7); from {}. <b>Look for</b> layers where "
        "the red share departs from the others.").format(src)))
    if N.routing_erank in have:
        re_mean, re_mat = _per_layer(hm, N.routing_erank, L)
        fe_mean, _ = _per_layer(hm, N.filtering_erank, L) if N.filtering_erank in have else (None, None)
        d_head = ctx.run.run.get("d_head")
        with matplotlib.rc_context(F.RC):
            fig, ax = F.new_figure()
            for h in range(re_mat.shape[1]):
                ax.scatter(layers, re_mat[:, h], s=6, color=F.PALETTE[1], alpha=0.3,
                           label="routing, one head" if h == 0 else None)
            ax.plot(layers, re_mean, color=F.PALETTE[1], marker="o", label="routing, mean over heads")
            if fe_mean is not None:
                ax.plot(layers, fe_mean, color=F.PALETTE[0], marker="s",
                        label="filtering, mean over heads")
            ax.axhline(2.0, color="#555555", linestyle=":", linewidth=1,
                       label="2 (one rotation plane)")
            if d_head:
                ax.axhline(2 * float(d_head), color="#555555", linestyle="--", linewidth=1,
                           label="2 d_head (rank bound of A)")
            ax.set_xlabel("layer (0-based index)")
            ax.set_ylabel("effective rank (Roy-Vetterli, dimensions)")
            ax.set_title("Spectral cascade: effective ranks per layer (§7)")
            F.legend_outside(ax)
            svg = F.to_svg(fig)
        blocks.append(Fig(svg, Markup(
            "Effective rank exp(−Σ p_r ln p_r), p_r = σ_r/Σσ, of the routing part A (red: dots "
            "per head, line the mean over heads) and the filtering part S (blue, mean over "
            "heads) per layer; dotted line at 2, dashed at 2·d_head; from {}. <b>Look for</b> a "
            "trend of the routing rank with depth (a cascade) and where it sits between the "
            "two lines.").format(src)))
    if rf_mat.size:
        blocks.append(Grid([Fig(F.heatmap(rf_mat, title="Routing fraction (§7)",
                                          cbar_label="‖A‖²_F / ‖M‖²_F (fraction)",
                                          cmap="plasma", vmin=0, vmax=1),
                                "routing fraction", "Routing fraction")],
                           Markup("Routing fraction ‖A‖²_F/‖M‖²_F of every head. <b>Look "
                                  "for</b> heads far from their layer's mean.")))
    cols = [m for m in (N.routing_fraction, N.routing_erank, N.routing_erank_pr,
                        N.filtering_erank, N.n_unstable, N.max_real_eig) if m in have]
    per = {m: _per_layer(hm, m, L) for m in cols}
    rows = []
    for layer in layers:
        row = [int(layer)] + [fmt(float(per[m][0][layer])) for m in cols]
        if N.n_unstable in have:
            mat = per[N.n_unstable][1][layer]
            row.append(fmt(float(np.mean(mat[np.isfinite(mat)] > 0))))
        rows.append(row)
    headers = ["Layer"] + [SD_HEADERS.get(m, m) for m in cols] + (
        ["Share of heads with an unstable eigenvalue"] if N.n_unstable in have else [])
    blocks.append(Table(headers, rows, caption=f"Means over the heads of each layer ({src}) of "
                        "the routing fraction ‖A‖²_F/‖M‖²_F, the effective ranks of A (Roy-"
                        "Vetterli; participation ratio) and of S, the number of eigenvalues of "
                        "W_Kᵀ W_Q with positive real part (unstable) and the largest real part; "
                        "the last column is the share of heads with at least one."))
    return blocks


SECTIONS_DEPTH = (
    Section(N.rank_collapse, "Rank collapse across depth", _has_collapse, _collapse,
            what="rank-collapse curve (layer_metrics rank_collapse)", command="attnbase analyze",
            metrics_ref="§6"),
    Section("paths", "Attention path products", _has_paths, _paths,
            what="path study", command="attnbase study paths",
            metrics_ref="§6"),
    Section("spectral", "Routing vs filtering and the spectral cascade", _has_spectral, _spectral,
            what="routing/spectral metrics (a weights-only run holds them; report that run)",
            command="attnbase weights --db {db} --model {model} --run {run}-weights",
            metrics_ref="§7"),
)


def register() -> None:
    """Register the depth and weights sections (called by :mod:`attnbase.reports.sections`)."""
    for s in SECTIONS_DEPTH:
        register_section(s)
