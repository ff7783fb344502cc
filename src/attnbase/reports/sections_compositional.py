"""Report sections of the compositional studies (docs/metrics.md §4-5): reversal rates and clustering
agreement with the with-sink vs drop-sink MDS scatter, pruning curves, entropy-change bars.

They read ``studies`` / ``study_results`` (already loaded per run as ``RunData.studies``) and
``head_clusters`` / ``entropy_change``; the only arithmetic is selection and sorting. The latest
study of each kind that includes the report's run is shown.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
from markupsafe import Markup

from attnbase.formatting import fmt, fmt_p
from attnbase.metrics import N, S, label
from attnbase.reports import figures as F
from attnbase.reports.blocks import Block, Context, Fig, Grid, Note, Section, Table, register_section
from attnbase.reports.data import catalog_tables, read_catalog

DISSIMILARITY_ORDER = ("cosine", "js", "euclidean", "aitchison")
#: The study results each section reads (attnbase/metrics.py).
R, C, PR, E, SC = S.reversal, S.clusters, S.prune, S.entropy_change, S.scaling
#: The source of the reference bands of §4-5.
PAPER = "Papamichalis & Ruane (2026), Attention Rows as Compositional Data"


def _latest(ctx: Context, kind: str) -> tuple[str, dict, dict[str, float]] | None:
    s = ctx.run.studies
    if s.height == 0:
        return None
    s = s.filter(pl.col("kind") == kind)
    if s.height == 0:
        return None
    ids = sorted(set(s["study_id"].to_list()))
    sid = ids[-1]
    if len(ids) > 1:  # several studies of this kind: the newest one
        newest = read_catalog(ctx.db, "SELECT study_id FROM studies WHERE list_contains(?, "
                              "study_id) ORDER BY created_at DESC LIMIT 1", [ids])
        sid = newest["study_id"][0] if newest.height else sid
    rows = s.filter(pl.col("study_id") == sid)
    params = rows["params"][0]
    params = json.loads(params) if isinstance(params, str) else (params or {})
    return sid, params, dict(zip(rows["key"].to_list(), rows["value"].to_list()))


def cluster_sizes(res: dict, d: str, prefix: str = C.cluster_size) -> str:
    """``"30+24+18"``: a clusters study's sizes of ``d`` (largest first), "—" when none;
    ``prefix`` :data:`C` ``.cluster_size`` (with the sink) or ``.cluster_size_drop``."""
    sizes, i = [], 1
    key = getattr(C, prefix)
    while key(d, i) in res:
        sizes.append(str(int(res[key(d, i)])))
        i += 1
    return "+".join(sizes) or "—"


# --- conventions: reversal, ARI, MDS -------------------------------------------------------------
def _has_conventions(ctx: Context) -> bool:
    return _latest(ctx, "reversal") is not None or _latest(ctx, "clusters") is not None


def _reversal_blocks(ctx: Context) -> list[Block]:
    got = _latest(ctx, "reversal")
    if got is None:
        return [Note("no reversal study for this run; run `attnbase study reversal`")]
    sid, params, res = got
    names = [d for d in DISSIMILARITY_ORDER if R.reversal_rate(d) in res]
    rows = [[d, fmt(res[R.reversal_rate(d)], 3), fmt(res[R.reversal_ci_low(d)], 3),
             fmt(res[R.reversal_ci_high(d)], 3), f"{int(res[R.reversal_triplets(d)]):,}",
             "exact" if res.get(R.reversal_exact(d)) else "sampled"] for d in names]
    fig, ax = F.new_figure()
    rate = np.array([res[R.reversal_rate(d)] for d in names])
    lo = rate - np.array([res[R.reversal_ci_low(d)] for d in names])
    hi = np.array([res[R.reversal_ci_high(d)] for d in names]) - rate
    # the published band behind the bars (zorder), so a bar keeps one colour across it
    ax.axhspan(0.17, 0.47, color=F.PALETTE[1], alpha=0.15, zorder=0, linewidth=0,
               label="published: 17-47%")
    ax.bar(names, rate, yerr=[lo, hi], color=F.PALETTE[0], capsize=4, zorder=2,
           label="reversal rate (95% CI)")
    ax.set_xlabel("dissimilarity (with_sink vs drop_sink)")
    ax.set_ylabel("share of triplets that flip (fraction)")
    ax.set_title("Reversal rate: with_sink vs drop_sink (§5)")
    F.legend_outside(ax)
    boot, units = params.get("boot"), params.get("bootstrap_units")
    return [Table(["Dissimilarity", "Reversal rate", "95% CI low", "95% CI high", "Triplets",
                   "Method"], rows,
                  caption=f"Study {sid} ({params.get('rows')} shared rows, seed "
                          f"{params.get('seed')}): share of head triplets (a; b, c) whose verdict "
                          "sign(D(a,b) − D(a,c)) flips between with_sink and drop_sink; "
                          "aitchison compares d_A with d_A_perp. Ties count as no flip. The 95% CI "
                          f"treats the text as the sample: {boot} bootstrap resamples of the run's "
                          f"{units} sequences (percentile interval, widened by the replicates' "
                          "bias and, where sampled, the triplet-sampling error)."),
            Fig(F.to_svg(fig), Markup(
                "Reversal rate per dissimilarity (bars) with its 95% CI over the text "
                "(whiskers). The shaded band behind them: {paper}, 17-47% for the classical "
                "dissimilarities across ten models. "
                "<b>Look for</b> classical dissimilarities (cosine, JS, Euclidean) whose verdicts "
                "depend on the sink column, as the paper reports.").format(paper=PAPER))]


def _scatter(xy: np.ndarray, labels: np.ndarray, layers: np.ndarray, title: str) -> str:
    fig, ax = F.new_figure(size=(4.2, 3.8), rect=(0.14, 0.12, 0.82, 0.78))
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    for c in np.unique(labels):
        sel = labels == c
        ax.scatter(xy[sel, 0], xy[sel, 1], s=18, color=cmap(int(c) % 10), label=f"cluster {c}")
    for (x, y), l in zip(xy, layers):
        # beside the dot, dark and large enough to read in the PDF (two scatters per row: 8 pt
        # here prints at ~6.5 pt)
        ax.annotate(str(int(l)), (x, y), xytext=(2.5, 2.5), textcoords="offset points",
                    fontsize=8, color="0.15")
    ax.set_xlabel("MDS 1 (distance units; numbers: layer, 0-based index)")
    ax.set_ylabel("MDS 2 (distance units)")
    ax.set_title(title)
    return F.to_svg(fig)


def _cluster_blocks(ctx: Context) -> list[Block]:
    got = _latest(ctx, "clusters")
    if got is None:
        return [Note("no clusters study for this run; run `attnbase study clusters`")]
    sid, params, res = got
    names = [d for d in DISSIMILARITY_ORDER if C.k(d) in res]
    rows = []
    for d in names:
        if res[C.k(d)] is None:
            rows.append([d, "none", "—", "—", "—", "—", "—", "—"])
            continue
        distinct = res.get(C.ari_null_distinct(d))
        p_perm = (fmt_p(res[C.ari_p(d)], draws=params.get("draws"),
                        at_floor=bool(res.get(C.ari_p_at_floor(d))))
                  + (f"; {int(distinct)} values" if distinct is not None else ""))
        ci = (f"{fmt(res[C.ari_ci_low(d)], 3)} to {fmt(res[C.ari_ci_high(d)], 3)}"
              if res.get(C.ari_ci_low(d)) is not None else "—")
        rows.append([d, str(int(res[C.k(d)])), cluster_sizes(res, d),
                     fmt(res[C.silhouette(d)], 3), fmt(res[C.ari(d)], 3), ci, p_perm,
                     fmt_p(res.get(C.ari_p_normal(d)))])
    refused = [d for d in names if res[C.k(d)] is None]
    rule = params.get("normal_fit_rule") or {}
    m = params.get("min_cluster")
    note = (f" For {', '.join(refused)} no k in 2..{params.get('k_max')} gives every cluster "
            f"≥ {m} heads: there is no clustering to compare and no ARI." if refused else "")
    blocks: list[Block] = [Table(
        ["Dissimilarity", "k", "Cluster sizes", "Silhouette", "ARI", "ARI 95% CI",
         "p (permutation; null values)", "p (normal fit)"], rows,
        caption=f"Study {sid} ({params.get('draws')} permutation draws): average-linkage "
                "clustering of heads, k chosen by silhouette under with_sink among partitions "
                f"whose smallest cluster holds ≥ {m} heads (max(2, "
                f"{params.get('min_cluster_share', 0.05):.0%} of the heads)) and reused under "
                "drop_sink; ARI 1 = identical clusterings. ARI 95% CI: "
                f"{params.get('boot')} resamples of the run's sequences. The normal-fit p is "
                f"shown only where the permutation null took ≥ {rule.get('min_distinct', '?')} "
                f"distinct values, none holding > {rule.get('max_tie', float('nan')):.0%} of the "
                f"draws. {PAPER}: ARI 0.01-0.05 (BERT, Llama).{note}")]
    # the MDS figure shows a dissimilarity whose clustering qualified (js first), else js alone
    qualified = [x for x in ("js", *names) if x in names and res.get(C.k(x)) is not None]
    d = qualified[0] if qualified else ("js" if "js" in names else (names[0] if names else None))
    clustered = bool(qualified)
    if d is None or "head_clusters" not in catalog_tables(ctx.db):
        return blocks
    hc = read_catalog(ctx.db, "SELECT convention, layer, head, cluster, mds_x, mds_y FROM "
                      "head_clusters WHERE study_id = ? AND dissimilarity = ? ORDER BY layer, head",
                      [sid, d])
    figs = []
    for conv in ("with_sink", "drop_sink"):
        part = hc.filter(pl.col("convention") == conv)
        if part.height:
            figs.append(Fig(_scatter(part.select("mds_x", "mds_y").to_numpy(),
                                     part["cluster"].to_numpy(), part["layer"].to_numpy(),
                                     f"{d}, {conv}"), ""))
    if figs:
        colour = (Markup("coloured by their k = {k} clusters").format(k=int(res[C.k(d)]))
                  if clustered else "in one colour (no partition of any dissimilarity qualified)")
        blocks.append(Grid(figs, Markup(
            "Heads in 2-D metric MDS of the {d} head distances, {colour}, with the "
            "sink (left) and without it (right); numbers are layers. <b>Look for</b> groups "
            "that split or merge when the sink column is dropped.").format(d=d, colour=colour)))
    return blocks


def _conventions(ctx: Context) -> list[Block]:
    return [*_reversal_blocks(ctx), *_cluster_blocks(ctx)]


# --- pruning -------------------------------------------------------------------------------------
def _has_prune(ctx: Context) -> bool:
    return _latest(ctx, "prune") is not None


def _prune(ctx: Context) -> list[Block]:
    sid, params, res = _latest(ctx, "prune")
    # perplexity (causal LMs), top-1 agreement (image classifiers), embedding cosine (encoders)
    key = next((k for k in (PR.ppl, PR.top1) if k("none") in res), PR.cos)
    sd_key = getattr(PR, f"{key}_sd")
    fracs = [float(f) for f in params.get("fractions", [])]
    names = [*params.get("rankings", []), "random"]
    fig, ax = F.new_figure()
    rows = []
    for i, name in enumerate(dict.fromkeys(names)):
        ys = np.array([res.get(key(name, f"{f:g}"), np.nan) for f in fracs])
        if np.all(np.isnan(ys)):
            continue
        sd = np.array([res.get(sd_key(name, f"{f:g}"), np.nan) for f in fracs])
        ax.plot(fracs, ys, marker="o", color=F.PALETTE[i % len(F.PALETTE)], label=name)
        if not np.all(np.isnan(sd)):
            ax.fill_between(fracs, ys - sd, ys + sd, color=F.PALETTE[i % len(F.PALETTE)],
                            alpha=0.2, linewidth=0)
        rows.append([name, *(fmt(y, 4) + (f" ± {fmt(s, 2)}" if s == s else "")
                             for y, s in zip(ys, sd))])
    ax.axhline(res[key("none")], color="0.4", linestyle="--", label="unpruned")
    ax.set_xlabel("heads masked (fraction of all heads)")
    metric = params.get("metric", key)
    ax.set_ylabel(metric)
    if key == PR.ppl:
        ax.set_yscale("log")
    ax.set_title("Pruning by redundancy (§5)")
    F.legend_outside(ax)
    return [Table(["Ranking", *[f"{f:.0%} masked" for f in fracs]], rows,
                  caption=f"Study {sid}: {metric} on {params.get('eval_seqs')} held-out windows "
                          f"(never used to rank heads) with the most redundant heads masked; "
                          f"unpruned {fmt(res[key('none')], 4)}. random: mean ± sd over "
                          f"{params.get('random_seeds')} seeds."),
            Fig(F.to_svg(fig), Markup(
                "Pruning curves per ranking. <b>Look for</b> rankings that break the model "
                "faster than random ({paper}: JS-ranked pruning of Llama-3.2-1B reaches "
                "perplexity 2094 from 15.3; d_A_perp stays stable).").format(paper=PAPER))]


# --- entropy change --------------------------------------------------------------------------------
def _has_entropy_change(ctx: Context) -> bool:
    return _latest(ctx, "entropy_change") is not None


def _entropy_change(ctx: Context) -> list[Block]:
    sid, params, res = _latest(ctx, "entropy_change")
    labels = sorted({k.split("/")[1] for k in res if k.startswith(E.d_entropy("L"))},
                    key=lambda s: int(s[1:]))
    sink = np.array([res[E.sink_part(lab)] for lab in labels])
    content = np.array([res[E.content_part(lab)] for lab in labels])
    dh = np.array([res[E.d_entropy(lab)] for lab in labels])
    x = np.arange(len(labels))
    fig, ax = F.new_figure()
    # stacked as they add: the content part starts where the sink part ends, so its far end
    # is at dH (the diamond), whatever the signs
    ax.bar(x, sink, width=0.6, color=F.PALETTE[0], label="sink part")
    ax.bar(x, content, width=0.6, bottom=sink, color=F.PALETTE[1], label="content part")
    ax.scatter(x, dh, marker="D", color="k", zorder=3, label="dH")
    ax.axhline(0, color="0.5", linewidth=0.8)
    ax.set_xticks(x, labels)
    ax.set_xlabel("layer (0-based index)")
    ax.set_ylabel("entropy change (nats)")
    ax.set_title("Entropy change: sink vs content (§4)")
    F.legend_outside(ax)
    what = (f"runs {' → '.join(params['runs'])}" if "runs" in params
            else f"layer {params['layers'][0]} → {params['layers'][1]}")
    rows = [[lab, fmt(res[E.d_entropy(lab)], 3), fmt(res[E.sink_part(lab)], 3),
             fmt(res[E.content_part(lab)], 3), fmt(res[E.sink_share(lab)], 3)]
            for lab in [*labels, "all"]]
    return [Fig(F.to_svg(fig), Markup(
        "Exact split of the mean entropy change ({what}, study {sid}): sink part "
        "dH_b + mean H(π)·d(1−s) (from 0) and content part mean(1−s)·dH(π) (stacked from the "
        "sink part's end) add up to dH (diamond). "
        "<b>Look for</b> a change carried by the sink ({paper}: 95% of Pythia-1B's training "
        "entropy drop).").format(what=what, sid=sid, paper=PAPER)),
            Table(["Layer", "dH", "Sink part", "Content part", "Sink share"], rows,
                  caption="Per layer (mean over heads) and overall; sink share = sink part / dH.")]


# --- scaling --------------------------------------------------------------------------------------
def _has_scaling(ctx: Context) -> bool:
    return _latest(ctx, "scaling") is not None


def scaling_points(params: dict, res: dict[str, float]) -> list[tuple[str, float, float]]:
    """``(run, n_params, sink_mass)`` of a scaling study, in its run order."""
    return [(r, res[SC.n_params(r)], res[SC.sink_mass(r)]) for r in params.get("runs", [])
            if SC.n_params(r) in res and SC.sink_mass(r) in res]


def scaling_figure(params: dict, res: dict[str, float], highlight: str | None = None) -> str:
    """SVG: each run's mean sink mass against its parameter count (log axis) and the study's
    least-squares line on log10(n_params)."""
    pts = scaling_points(params, res)
    fig, ax = F.new_figure()
    xs = np.array([p[1] for p in pts])
    ax.scatter(xs, [p[2] for p in pts], color=F.PALETTE[0], zorder=3)
    for run, x, y in pts:
        ax.annotate(run, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points",
                    fontweight="bold" if run == highlight else "normal")
    grid = np.geomspace(xs.min(), xs.max(), 50)
    ax.plot(grid, res[SC.intercept] + res[SC.slope] * np.log10(grid), color=F.PALETTE[1],
            label=f"fit: {fmt(res[SC.slope], 3, signed=True)} per decade")
    ax.set_xscale("log")
    ax.set_xlabel("parameters (runs.n_params)")
    ax.set_ylabel("mean sink mass")
    ax.set_title("Sink mass against parameter count (§5)")
    F.legend_outside(ax)
    return F.to_svg(fig)


def _scaling(ctx: Context) -> list[Block]:
    sid, params, res = _latest(ctx, "scaling")
    rows = [[r + (" (this run)" if r == ctx.run.run_id else ""), f"{int(n):,}", fmt(s, 4),
             fmt(res.get(f"{N.max_share}/{r}"), 4), fmt(res.get(f"{N.key_norm_cv}/{r}"), 4)]
            for r, n, s in scaling_points(params, res)]
    caption = (f"Study {sid}: OLS of each run's mean sink mass on log10 of its parameter count: "
               f"slope {fmt(res[SC.slope], 4)} per decade (95% CI {fmt(res[SC.slope_ci_low], 4)} "
               f"to {fmt(res[SC.slope_ci_high], 4)}), r = {fmt(res[SC.r], 3)}, p = "
               f"{fmt(res[SC.p], 3)}; {len(rows)} runs of {', '.join(params.get('families', []))}.")
    return [Table(["Run", "Parameters", "Sink mass", label(N.max_share), label(N.key_norm_cv)], rows,
                  caption=caption),
            Fig(scaling_figure(params, res, ctx.run.run_id), Markup(
                "Each run's mean sink mass against its parameter count. <b>Look for</b> a slope "
                "whose CI excludes 0 ({paper}: sink mass against parameter count).")
                .format(paper=PAPER))]


def register_compositional_sections(before: str | None = None) -> None:
    """Register the sections (called from :mod:`attnbase.reports.sections`)."""
    register_section(Section("conventions", "Convention dependence: reversal rates and ARI",
                             _has_conventions, _conventions, what="reversal or clusters study",
                             command="attnbase study distances --db {db} --run {run} (then "
                                     "study reversal and study clusters, same --db --run)",
                             metrics_ref="§5"), before=before)
    register_section(Section("pruning", "Pruning by head redundancy", _has_prune, _prune,
                             what="prune study",
                             command="attnbase study prune --db {db} --run {run}",
                             metrics_ref="§5"), before=before)
    # a study across runs: shown where this run is in one, never asked for by one run's report
    register_section(Section("scaling", "Sink mass against parameter count", _has_scaling,
                             _scaling, what="scaling study", note_when_missing=False,
                             metrics_ref="§5"), before=before)
    register_section(Section("entropy_change", "Entropy change: sink vs content",
                             _has_entropy_change, _entropy_change, what="entropy-change study",
                             command="attnbase study entropy --db {db} --run {run} --layers 0,1 (or "
                                     "--runs A,B: two checkpoints on the same windows)",
                             metrics_ref="§4"), before=before)
