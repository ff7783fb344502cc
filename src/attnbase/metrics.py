"""The registry: every statistic and study result attnbase computes or stores, declared once.

Each :class:`Metric` is one named quantity: its label and unit as people read them, its family
(one of :data:`FAMILIES`, the sections of docs/metrics.md), the levels it lives at
(:data:`LEVELS`: a row statistic, a value of the catalog's ``head_metrics``, ``layer_metrics`` or
``run_metrics``, or a ``study_results`` key), the docs section that defines it, how many digits
it is shown with, and -- for a statistic the stats stage computes -- :class:`Compute`: the
function (a dotted reference, resolved by :mod:`attnbase.stats.registry`, so this bottom module
imports no stage), its input kind, bounds and declared invariances, which
``tests/stats/test_registry.py`` checks. A study result also names its study ``kind`` and the
parts of its key (``reversal_rate/<d>``).

Views of the one declaration: :data:`METRICS` (the stored metrics of the three metric tables,
what ``/api/metrics`` lists), :data:`STUDY_RESULTS` (``(kind, name)`` -> the study result),
:data:`N` (metric names as attributes) and :data:`S` (study keys: ``S.reversal.reversal_rate("js")
== "reversal_rate/js"``). Every writer and reader of the four tables takes names from here.
``python -m attnbase.metrics`` writes docs/metrics.md's §9 (the generated block between its
markers; ``tests/test_metric_registry.py`` checks that it is current).

A bottom module (it imports no stage): reports and the warehouse may read it.
:meth:`Metric.format` writes a value with the metric's digits (:func:`attnbase.formatting.fmt`,
the one number formatter).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbase.formatting import fmt, fmt_p

#: The eight statistic families (docs/metrics.md §1-8).
FAMILIES = ("norms", "geometry", "concentration", "compositional", "convention", "depth",
            "spectral", "inference")
#: Where a quantity lives: one value per attention row (``row_stats``; or per pair of rows, a
#: dissimilarity), per head, per layer (head means or a layer's own value), per run, or a key of
#: a study's ``study_results``.
LEVELS = ("row", "head", "layer", "run", "study")
#: The levels of the three metric tables (:data:`METRICS`).
STORED_LEVELS = ("head", "layer", "run")
TABLES = {"head": "head_metrics", "layer": "layer_metrics", "run": "run_metrics"}
#: Every level's table.
LEVEL_TABLES = {"row": "row_stats", **TABLES, "study": "study_results"}
#: The study kinds (``studies.kind``) whose results are registered.
STUDY_KINDS = ("distances", "reversal", "clusters", "prune", "entropy_change", "paths",
               "scaling", "r_conventions")
#: The invariances a statistic may declare (each checked by tests/stats/test_registry.py):
#: scale f(c x) = f(x), c > 0; rotation f(x Q) = f(x), Q orthogonal on d_head; token_permutation
#: (the pos axis) and seq_permutation (the seq axis) leave f unchanged; shift f(z + c) = f(z) for
#: a constant added to a row's logits; sink: f unchanged when the sink logit moves; symmetric
#: f(z, w) = f(w, z).
INVARIANCES = ("scale", "rotation", "token_permutation", "seq_permutation", "shift", "sink",
               "symmetric")
#: Input kinds of :class:`Compute` (their shapes: :mod:`attnbase.stats.registry`).
INPUT_KINDS = ("keys", "keys_seq", "attn", "attn_tokens", "profile", "logit_rows", "logit_row_pairs", "hidden",
               "qk", "distance_pairs")


@dataclass(frozen=True)
class Compute:
    """How the stats stage computes a statistic. ``func``: ``"module:function"`` under
    ``attnbase.stats`` (resolved on use by :mod:`attnbase.stats.registry`); ``reference``: the
    docs section and paper column; ``bounds``: closed range of every value (inf allowed);
    ``result``: the attribute of ``func``'s result that holds the value."""

    func: str
    input: str
    reference: str
    bounds: tuple[float, float] | None = None
    invariances: tuple[str, ...] = ()
    result: str | None = None


@dataclass(frozen=True)
class Metric:
    """One registered quantity. ``levels``: where it is stored (:data:`LEVELS`); ``section``: its
    definition in docs/metrics.md; ``digits``: significant digits in tables (0: an integer);
    ``parameter``: a setting the analysis recorded beside its results (draws, seeds);
    ``compute``: how stats computes it (None: assembled by a writer from other values);
    ``kind``/``key``: a study result's study kind and its key as docs/metrics.md writes it
    (``reversal_rate/<d>``; :data:`S` builds it)."""

    name: str
    label: str
    unit: str
    family: str
    levels: tuple[str, ...]
    section: str
    digits: int = 4
    parameter: bool = False
    compute: Compute | None = None
    kind: str | None = None
    key: str | None = None

    def sql(self, level: str) -> str:
        """The query of this metric's values at ``level`` (``run_id`` [, layer [, head]], value)."""
        keys = {"head": "run_id, layer, head", "layer": "run_id, layer", "run": "run_id"}[level]
        return f"SELECT {keys}, value FROM {TABLES[level]} WHERE metric = '{self.name}'"

    def format(self, value, *, style: str = "table") -> str:
        """``value`` with this metric's digits (:func:`attnbase.formatting.fmt`); a p-value
        never as "0" (:func:`attnbase.formatting.fmt_p`)."""
        if self.unit == "p-value":
            return fmt_p(value, style=style)
        return fmt(value, self, style=style)

    def public(self) -> dict:
        """What ``/api/metrics`` lists of a stored metric (:data:`API_FIELDS`)."""
        return {f: getattr(self, f) for f in API_FIELDS}


#: The fields ``/api/metrics`` gives of each stored metric (the service's contract).
API_FIELDS = ("name", "label", "unit", "family", "levels", "section", "digits", "parameter")


def _c(func: str, input: str, reference: str, bounds=None, *invariances: str,
       result: str | None = None) -> Compute:
    return Compute(f"attnbase.stats.{func}", input, f"docs/metrics.md {reference}", bounds,
                   tuple(invariances), result)


_INF = float("inf")
_UNIT, _POS = (0.0, 1.0), (0.0, _INF)
_H, _L, _R = ("head", "layer", "run"), ("layer", "run"), ("run",)
_HL, _LO = ("head", "layer"), ("layer",)
_ROW, _STUDY = ("row",), ("study",)


def _study(kind: str, family: str, section: str, parts: str, *entries) -> tuple[Metric, ...]:
    """The results of one study kind: ``(name, label, unit[, digits][, parts])`` each; ``parts``
    what the key adds after the name (an entry's own str overrides it; "" a bare name)."""
    out = []
    for e in entries:
        name, label, unit, *rest = e
        digits = next((r for r in rest if isinstance(r, int)), 4)
        p = next((r for r in rest if isinstance(r, str)), parts)
        key = f"{name}/{p}" if p else name
        out.append(Metric(name, label, unit, family, _STUDY, section, digits, kind=kind, key=key))
    return tuple(out)


#: Every registered quantity, in docs/metrics.md's order within each level.
REGISTRY: tuple[Metric, ...] = (
    # --- §1 norms ----------------------------------------------------------------------------
    Metric("key_norm_cv", "key-norm CV", "dimensionless", "norms", _H, "§1",
           compute=_c("norms:key_norm_cv", "keys", "§1; All Routes Lead to Collapse, Table 1, "
                      "norm-CV", _POS, "scale", "rotation", "token_permutation",
                      "seq_permutation")),
    # every position of the run's sink set left out (runs.sink_positions; token 0 for text)
    Metric("key_norm_cv_excl_sink", "key-norm CV without the sink positions", "dimensionless",
           "norms", _H, "§1",
           compute=_c("norms:key_norm_cv_excl_sink", "keys", "§1 (variant without the sink "
                      "positions)", _POS, "scale", "rotation", "seq_permutation")),
    Metric("key_norm_cv_baseline", "isotropic baseline 1/sqrt(2 d_head)", "dimensionless",
           "norms", _R, "§1"),
    # --- §2 geometry -------------------------------------------------------------------------
    Metric("ve_at_8", "VE@8", "fraction", "geometry", _H, "§2",
           compute=_c("geometry:ve_at_k", "keys_seq", "§2; All Routes Lead to Collapse, "
                      "Table 1, VE@8", _UNIT, "scale", "rotation", "token_permutation")),
    Metric("ve_gauss", "VE@8 Gauss null", "fraction", "geometry", _H, "§2"),
    Metric("ve_shuffle", "VE@8 shuffle null", "fraction", "geometry", _H, "§2"),
    Metric("ve_k", "k of VE@k", "components", "geometry", _R, "§2", 0, parameter=True),
    # --- §3 concentration --------------------------------------------------------------------
    Metric("max_share", "max share", "fraction", "concentration", _H, "§3",
           compute=_c("concentration:max_share", "attn", "§3 (column share); Table 1 onset and "
                      "r_cv,sh", _UNIT, "seq_permutation")),
    Metric("row_max_share", "row max share", "fraction", "concentration", _H, "§3",
           compute=_c("concentration:row_max_share", "attn", "§3 (variant: mean row maximum, "
                      "queries i >= 4)", _UNIT, "seq_permutation")),
    Metric("mean_sink_mass", "sink mass", "fraction", "concentration", _H, "§3",
           compute=_c("concentration:mean_sink_mass", "attn", "§3 (sink_mass averaged over "
                      "rows and sequences)", _UNIT, "seq_permutation")),
    Metric("onset_layer", "onset layer", "layer index", "concentration", _R, "§3", 0,
           compute=_c("concentration:onset_layer", "profile", "§3; All Routes Lead to Collapse, "
                      "Table 1, onset")),
    Metric("onset_depth", "onset depth", "fraction of layers", "concentration", _R, "§3"),
    Metric("onset_threshold", "onset threshold", "fraction", "concentration", _R, "§3", parameter=True),
    Metric("row_max_share_min_query", "first query of row max share", "position",
           "concentration", _R, "§3", 0, parameter=True),
    # §3b head taxonomy (attention pattern scores from the logits and the tokens)
    Metric("prev_token", "previous-token score", "fraction", "concentration", _H, "§3b",
           compute=_c("taxonomy:prev_token", "attn_tokens", "§3b (mean of A[i, i-1]); "
                      "TransformerLens previous_token_head", _UNIT)),
    Metric("duplicate_token", "duplicate-token score", "fraction", "concentration", _H, "§3b",
           compute=_c("taxonomy:duplicate_token", "attn_tokens", "§3b (attention on earlier "
                      "occurrences of the query's token)", _UNIT)),
    Metric("induction", "induction score", "fraction", "concentration", _H, "§3b",
           compute=_c("taxonomy:induction", "attn_tokens", "§3b (attention on the token after "
                      "an earlier occurrence); Olsson et al. 2022", _UNIT)),
    # Gu et al. 2025's Sink_1^eps over the heads' mean_sink_mass (stats/queries.py)
    Metric("sink_rate", "sink rate Sink_1^eps", "fraction of heads", "concentration", _L, "§3b"),
    Metric("sink_rate_eps", "sink-rate threshold eps", "fraction", "concentration", _R, "§3b",
           parameter=True),
    # the paper's conventions as variants: computed per head from the stored logits by the
    # r-conventions study (stats/r_conventions.py), named inside its keys
    Metric("max_share_excl_sink", "max share over keys j >= 1", "fraction", "concentration",
           _STUDY, "§3a", kind="r_conventions", key="<cv>|max_share_excl_sink|<pairing>:<statistic>",
           compute=_c("concentration:max_share_excl_sink", "attn", "§3 (variant: keys j >= 1, "
                      "not renormalised)", _UNIT, "seq_permutation")),
    Metric("max_share_q4", "max share over queries i >= 4", "fraction", "concentration",
           _STUDY, "§3a", kind="r_conventions", key="<cv>|max_share_q4|<pairing>:<statistic>",
           compute=_c("concentration:max_share_q4", "attn", "§3 (variant: column share over "
                      "queries i >= 4)", _UNIT, "seq_permutation")),
    Metric("max_share_excl_sink_q4", "max share over keys j >= 1 of queries i >= 4", "fraction",
           "concentration", _STUDY, "§3a", kind="r_conventions",
           key="<cv>|max_share_excl_sink_q4|<pairing>:<statistic>",
           compute=_c("concentration:max_share_excl_sink_q4", "attn", "§3 (variant: keys j >= 1 "
                      "of queries i >= 4, not renormalised)", _UNIT, "seq_permutation")),
    # --- §4 compositional: row statistics (row_stats columns) and the row dissimilarities ----
    Metric("sink_balance", "sink balance", "nats", "compositional", _ROW, "§4",
           compute=_c("compositional:sink_balance", "logit_rows", "§4 (ilr balance of the sink "
                      "against the content)", None, "shift")),
    Metric("content_dispersion", "content dispersion C_perp", "Aitchison units", "compositional",
           _ROW, "§4",
           compute=_c("compositional:content_dispersion", "logit_rows", "§4 (C_perp = "
                      "||clr(pi)||)", _POS, "shift", "sink")),
    Metric("entropy", "entropy", "nats", "compositional", _ROW, "§4",
           compute=_c("compositional:entropy", "logit_rows", "§4 (H(p) = H_b(s) + (1 - s) "
                      "H(pi))", _POS, "shift")),
    Metric("content_entropy", "content entropy H(pi)", "nats", "compositional", _ROW, "§4",
           compute=_c("compositional:content_entropy", "logit_rows", "§4 (H(pi), the content "
                      "part of the chain rule)", _POS, "shift", "sink")),
    Metric("aitchison", "Aitchison distance d_A", "Aitchison units", "compositional", _ROW,
           "§4-5",
           compute=_c("compositional:aitchison_distance", "logit_row_pairs", "§4-5 (d_A; "
                      "dissimilarity 'aitchison')", _POS, "shift", "symmetric")),
    Metric("aitchison_perp", "content distance d_A_perp", "Aitchison units", "compositional",
           _ROW, "§4-5",
           compute=_c("compositional:aitchison_perp_distance", "logit_row_pairs", "§4-5 "
                      "(d_A_perp; 'aitchison' under drop_sink)", _POS, "shift", "sink",
                      "symmetric")),
    # --- §6 depth ----------------------------------------------------------------------------
    Metric("rank_collapse", "rank collapse", "ratio", "depth", _L, "§6",
           compute=_c("depth:residual_ratio", "hidden", "§6; Dong, Cordonnier & Loukas 2021",
                      _POS, "scale", "token_permutation")),
    Metric("rank_collapse_sd", "rank collapse sd", "ratio", "depth", _L, "§6"),
    Metric("rank_collapse_excl_sink", "rank collapse without token 0", "ratio", "depth", _L,
           "§6"),
    Metric("rank_collapse_excl_sink_sd", "rank collapse without token 0, sd", "ratio", "depth",
           _L, "§6"),
    Metric("residual_erank", "residual effective rank", "dimensions", "depth", _L, "§6"),
    Metric("residual_erank_sd", "residual effective rank sd", "dimensions", "depth", _L, "§6"),
    Metric("residual_erank_pr", "residual participation ratio", "dimensions", "depth", _L,
           "§6"),
    # §6b massive activations (Sun et al. 2024) per hidden state (stats/massive.py)
    Metric("massive_top1", "largest |activation|", "activation units", "depth", _LO, "§6b"),
    Metric("massive_top2", "2nd largest |activation|", "activation units", "depth", _LO, "§6b"),
    Metric("massive_top3", "3rd largest |activation|", "activation units", "depth", _LO, "§6b"),
    Metric("massive_median", "median |activation|", "activation units", "depth", _LO, "§6b"),
    Metric("massive_ratio", "largest / median |activation|", "ratio", "depth", _LO, "§6b"),
    Metric("massive_seq", "sequence of the largest |activation|", "sequence index", "depth",
           _LO, "§6b", 0),
    Metric("massive_pos", "position of the largest |activation|", "position", "depth", _LO,
           "§6b", 0),
    Metric("massive_dim", "dimension of the largest |activation|", "dimension", "depth", _LO,
           "§6b", 0),
    Metric("massive_token", "token id at the largest |activation|", "token id", "depth", _LO,
           "§6b", 0),
    Metric("massive_sink_share", "share of sequences whose largest |activation| is at a sink",
           "fraction", "depth", _LO, "§6b"),
    Metric("massive_flag", "massive activation (> 100 and > 1,000 x median)", "flag", "depth",
           _LO, "§6b", 0),
    # §6c high-norm patch tokens of image runs (Darcet et al. 2024) per hidden state
    # (stats/highnorm.py; threshold HIGH_NORM_RATIO)
    Metric("high_norm_frac", "share of high-norm patch tokens", "fraction", "depth", _LO, "§6c",
           compute=_c("highnorm:high_norm_share", "hidden", "§6c (patch norm > 3 x its image's "
                      "median patch norm); Darcet et al. 2024", _UNIT, "scale", "rotation")),
    Metric("high_norm_max_ratio", "largest patch norm / its image's median", "ratio", "depth",
           _LO, "§6c"),
    Metric("high_norm_cls_attn", "[CLS] attention on high-norm patches", "fraction", "depth",
           _LO, "§6c"),
    Metric("high_norm_cls_uniform", "[CLS] attention on high-norm patches if uniform",
           "fraction", "depth", _LO, "§6c"),
    # --- §7 spectral (weights runs) ----------------------------------------------------------
    Metric("routing_fraction", "routing fraction", "fraction", "spectral", _H, "§7",
           compute=_c("spectral:routing_fraction", "qk", "§7 (||A||_F^2 / ||M||_F^2)", _UNIT,
                      "scale", "rotation")),
    Metric("routing_erank", "routing effective rank", "dimensions", "spectral", _H, "§7"),
    Metric("routing_erank_pr", "routing participation ratio", "dimensions", "spectral", _HL,
           "§7"),
    Metric("filtering_erank", "filtering effective rank", "dimensions", "spectral", _H, "§7"),
    Metric("filtering_erank_pr", "filtering participation ratio", "dimensions", "spectral",
           ("head",), "§7"),
    Metric("form_norm", "||M||_F", "weight units", "spectral", ("head",), "§7"),
    Metric("n_unstable", "unstable eigenvalues", "count", "spectral", _HL, "§7"),
    Metric("max_real_eig", "largest real eigenvalue part", "weight units", "spectral",
           ("head", "run"), "§7"),
    Metric("share_unstable", "share of unstable heads", "fraction", "spectral", ("layer",),
           "§7"),
    Metric("share_heads_unstable", "share of unstable heads", "fraction", "spectral", _R, "§7"),
    # --- §8 inference ------------------------------------------------------------------------
    Metric("r_cv_share", "r(CV, max share)", "Pearson r", "inference", _R, "§3"),
    Metric("r_cv_share_p", "p of r", "p-value", "inference", _R, "§8"),
    Metric("r_cv_share_ci_low", "r 95% CI low", "Pearson r", "inference", _R, "§8"),
    Metric("r_cv_share_ci_high", "r 95% CI high", "Pearson r", "inference", _R, "§8"),
    Metric("r_cv_share_spearman", "Spearman rho", "Spearman rho", "inference", _R, "§8"),
    Metric("r_cv_share_spearman_p", "p of Spearman rho", "p-value", "inference", _R, "§8"),
    Metric("n_head_pairs", "(CV, share) pairs", "count", "inference", _R, "§8", 0),
    Metric("frac_heads_beat_gauss", "heads beating the Gauss null", "fraction", "inference", _R,
           "§8"),
    Metric("frac_heads_beat_shuffle", "heads beating the shuffle null", "fraction",
           "inference", _R, "§8"),
    Metric("draws", "null draws", "count", "inference", _R, "§8", 0, parameter=True),
    Metric("gauss_draws", "Gauss null draws", "count", "inference", _R, "§8", 0, parameter=True),
    Metric("gauss_pool", "Gauss null pool", "count", "inference", _R, "§8", 0, parameter=True),
    Metric("shuffle_seqs", "shuffled sequences", "count", "inference", _R, "§8", 0, parameter=True),
    Metric("shuffle_seq_draws", "shuffles per sequence", "count", "inference", _R, "§8", 0, parameter=True),
    Metric("seed", "seed", "seed", "inference", _R, "§8", 0, parameter=True),
    # --- study results (study_results.key), by study kind ------------------------------------
    *_study("distances", "convention", "§5", "",
            ("n_heads", "heads", "count", 0), ("n_rows", "rows in the shared row set", "count", 0),
            ("rows_without_sink_dropped", "rows whose sink a sliding window masks", "count", 0),
            ("seconds", "wall time", "seconds"),
            ("bootstrap_units", "bootstrap units (sequences or blocks)", "count", 0)),
    Metric("reversal_rate", "reversal rate", "fraction", "convention", _STUDY, "§5",
           kind="reversal", key="reversal_rate/<d>",
           compute=_c("convention:reversal_rate", "distance_pairs", "§5 (study_results "
                      "reversal_rate/<d>)", _UNIT, "scale", "symmetric", result="rate")),
    *_study("reversal", "convention", "§5", "<d>",
            ("reversal_ci_low", "reversal rate 95% CI low", "fraction"),
            ("reversal_ci_high", "reversal rate 95% CI high", "fraction"),
            ("reversal_triplets", "triplets", "count", 0),
            ("reversal_exact", "every triplet enumerated (1) or sampled (0)", "flag", 0),
            ("reversal_triplet_se", "triplet-sampling standard error", "fraction"),
            ("reversal_boot_mean", "mean of the bootstrap replicates", "fraction"),
            ("reversal_boot_sd", "sd of the bootstrap replicates", "fraction"),
            ("reversal_ci_floor", "Clopper-Pearson interval stood in (1)", "flag", 0)),
    *_study("clusters", "convention", "§5", "<d>",
            ("k", "clusters k (null: no partition qualified)", "count", 0),
            ("qualified", "a partition qualified (1)", "flag", 0),
            ("min_cluster", "smallest cluster allowed", "heads", 0),
            ("silhouette", "silhouette at k", "silhouette"),
            ("ari", "ARI with vs without the sink", "ARI"),
            ("ari_p", "permutation p of the ARI", "p-value"),
            ("ari_p_normal", "normal-fit p of the ARI", "p-value"),
            ("ari_null_mean", "ARI null mean", "ARI"),
            ("ari_null_sd", "ARI null sd", "ARI"),
            ("ari_null_distinct", "distinct values of the ARI null", "count", 0),
            ("ari_p_at_floor", "permutation p at its floor (1)", "flag", 0),
            ("ari_ci_low", "ARI 95% CI low over the text", "ARI"),
            ("ari_ci_high", "ARI 95% CI high over the text", "ARI"),
            ("ari_boot_sd", "ARI sd over the text", "ARI"),
            ("cluster_size", "cluster size with the sink (largest first)", "heads", 0, "<d>/<i>"),
            ("cluster_size_drop", "cluster size without the sink (largest first)", "heads", 0,
             "<d>/<i>")),
    *_study("prune", "convention", "§5", "none | <ranking>/<fraction> | random/<fraction>",
            ("ppl", "perplexity (causal LMs)", "perplexity"),
            ("cos", "pooled-embedding cosine (encoders)", "cosine"),
            ("top1", "top-1 agreement (image classifiers)", "fraction"),
            ("ppl_sd", "perplexity sd over random rankings", "perplexity", "random/<fraction>"),
            ("cos_sd", "cosine sd over random rankings", "cosine", "random/<fraction>"),
            ("top1_sd", "top-1 agreement sd over random rankings", "fraction",
             "random/<fraction>")),
    *_study("entropy_change", "compositional", "§4", "L<layer> | all",
            ("split_max_residual", "largest residual of the exact split", "nats", ""),
            ("d_entropy", "entropy change dH", "nats"),
            ("sink_part", "sink part of dH", "nats"),
            ("content_part", "content part of dH", "nats"),
            ("sink_share", "sink share of dH", "fraction")),
    *_study("paths", "depth", "§6", "<path length>",
            ("ratio_mean", "path residual ratio, mean", "ratio"),
            ("ratio_sd", "path residual ratio, sd", "ratio"),
            ("ratio_q05", "path residual ratio, 5% quantile", "ratio"),
            ("ratio_q25", "path residual ratio, 25% quantile", "ratio"),
            ("ratio_median", "path residual ratio, median", "ratio"),
            ("ratio_q75", "path residual ratio, 75% quantile", "ratio"),
            ("ratio_q95", "path residual ratio, 95% quantile", "ratio"),
            ("n", "path draws", "count", 0)),
    *_study("scaling", "concentration", "§5", "<run>",
            ("n_runs", "runs fitted", "count", 0, ""),
            ("n_params", "parameters", "count", 0),
            ("sink_mass", "mean sink mass", "fraction"),
            ("max_share", "mean max share over heads", "fraction"),
            ("key_norm_cv", "key-norm CV (model figure)", "dimensionless"),
            ("slope", "slope per decade of parameters", "per decade", "[<statistic>]"),
            ("intercept", "intercept at 1 parameter", "value", "[<statistic>]"),
            ("slope_ci_low", "slope 95% CI low", "per decade", "[<statistic>]"),
            ("slope_ci_high", "slope 95% CI high", "per decade", "[<statistic>]"),
            ("r", "Pearson r of the fit", "Pearson r", "[<statistic>]"),
            ("p", "p of r", "p-value", "[<statistic>]")),
    # r_conventions keys are <cv>|<share>|<pairing>:<statistic> (stats/r_conventions.py)
    *(Metric(name, label, unit, "inference", _STUDY, "§3a", digits, kind="r_conventions",
             key=f"<cv>|<share>|<pairing>:{name}")
      for name, label, unit, digits in (
          ("n", "(CV, share) pairs", "count", 0), ("r", "Pearson r", "Pearson r", 4),
          ("ci_low", "r 95% CI low", "Pearson r", 4), ("ci_high", "r 95% CI high", "Pearson r", 4),
          ("p", "p of r", "p-value", 4), ("spearman", "Spearman rho", "Spearman rho", 4),
          ("spearman_p", "p of Spearman rho", "p-value", 4))),
)

#: The stored metrics of the three metric tables (``head_metrics``, ``layer_metrics``,
#: ``run_metrics``), by name: what ``/api/metrics`` lists.
METRICS: dict[str, Metric] = {m.name: m for m in REGISTRY
                              if set(m.levels) & set(STORED_LEVELS)}
#: The statistics the stats stage computes (a :class:`Compute` each), by name:
#: :mod:`attnbase.stats.registry` resolves their functions and tests their properties.
COMPUTED: dict[str, Metric] = {m.name: m for m in REGISTRY if m.compute is not None}
#: The study results (``study_results.key``), by ``(kind, name)``.
STUDY_RESULTS: dict[tuple[str, str], Metric] = {(m.kind, m.name): m for m in REGISTRY
                                                if "study" in m.levels}
#: head_metrics pivoted into the ``head_summary`` view's columns, in order.
HEAD_SUMMARY = ("key_norm_cv", "key_norm_cv_excl_sink", "ve_at_8", "ve_gauss", "ve_shuffle",
                "max_share", "row_max_share", "mean_sink_mass")
#: The head taxonomy scores (docs/metrics.md §3b), as the head page's "types at a glance" shows
#: them.
HEAD_TYPES = ("prev_token", "duplicate_token", "induction")
#: The Table-1 row ("All Routes Lead to Collapse", Table 1), in the paper's column order.
TABLE1 = ("key_norm_cv", "key_norm_cv_baseline", "ve_at_8", "ve_gauss", "ve_shuffle",
          "onset_layer", "onset_depth", "r_cv_share", "r_cv_share_p")
#: What this project reports beside the Table-1 row.
TABLE1_EXTRAS = ("r_cv_share_ci_low", "r_cv_share_ci_high", "r_cv_share_spearman")
#: The statistic the null tests (``null_tests.metric``) test, and the head metrics holding the
#: nulls' means, by null model.
NULL_TESTED = "ve_at_8"
NULL_MEANS = {"gauss": "ve_gauss", "shuffle": "ve_shuffle"}
#: The report's head maps (layer x head heatmaps), with their colour maps.
HEAD_MAP_CMAPS = {"max_share": "magma", "key_norm_cv": "viridis", "ve_at_8": "cividis",
                  "routing_fraction": "plasma"}
#: The per-layer profiles (layer means of head metrics) the service's run page draws; the
#: first colours its head finder when no metric is chosen.
RUN_PAGE_PROFILES = ("mean_sink_mass", "max_share", "key_norm_cv", "ve_at_8")
#: The Table-1 columns the service's list of runs (its index page) shows, in order.
RUN_LIST_COLUMNS = ("key_norm_cv", "key_norm_cv_baseline", "ve_at_8", "ve_gauss", "ve_shuffle",
                    "onset_layer", "r_cv_share")
#: Sun et al. 2024's thresholds of ``massive_flag`` (docs/metrics.md §6b): the largest |h| above
#: MASSIVE_MIN_ABS and above MASSIVE_MIN_RATIO times the median |h|.
MASSIVE_MIN_ABS, MASSIVE_MIN_RATIO = 100.0, 1000.0
#: The threshold of a high-norm patch token (docs/metrics.md §6c; Darcet et al. 2024): its
#: residual-stream norm above HIGH_NORM_RATIO times the median patch norm of its image.
HIGH_NORM_RATIO = 3.0
#: The depth profile the run page draws for a run that captured hidden states.
DEPTH_PROFILE = "rank_collapse"


def metric(name: str) -> Metric:
    """The registered metric ``name``; KeyError listing the registered names otherwise."""
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; registered: {', '.join(sorted(METRICS))}"
                       ) from None


def label(name: str) -> str:
    return metric(name).label


def names(family: str, level: str) -> tuple[str, ...]:
    """The stored metrics of ``family`` at ``level``, in registry order: what a writer of that
    family stores (``names("depth", "layer")``)."""
    return tuple(m.name for m in METRICS.values() if m.family == family and level in m.levels)


def study_result(kind: str, name: str) -> Metric:
    """The registered result ``name`` of study ``kind``; KeyError listing the kind's results."""
    try:
        return STUDY_RESULTS[(kind, name)]
    except KeyError:
        known = sorted(n for k, n in STUDY_RESULTS if k == kind)
        raise KeyError(f"unknown {kind!r} study result {name!r}; registered: "
                       f"{', '.join(known) or 'none (kinds: ' + ', '.join(STUDY_KINDS) + ')'}"
                       ) from None


def unregistered_keys(kind: str, keys) -> list[str]:
    """The keys of a ``kind`` study whose name is not a registered result of that kind (the
    name: before the first ``/``; for ``r_conventions`` after the last ``:``).

    >>> unregistered_keys("reversal", ["reversal_rate/js", "reversal_rat/js"])
    ['reversal_rat/js']
    """
    def name(key: str) -> str:
        return key.rpartition(":")[2] if kind == "r_conventions" else key.partition("/")[0]

    return [k for k in keys if (kind, name(k)) not in STUDY_RESULTS]


def uniform_max_share(seq_len: int, causal: bool) -> float:
    """``max_share`` of uniform attention over ``seq_len`` tokens (docs/metrics.md §3): causal
    H_T / T (the harmonic number over T), bidirectional 1 / T. The baseline the service's run
    page and the report draw beside the observed values.

    >>> round(uniform_max_share(128, True), 5), uniform_max_share(4, False)
    (0.04245, 0.25)
    """
    T = int(seq_len)
    return float(sum(1.0 / k for k in range(1, T + 1)) / T) if causal else 1.0 / T


class _Names:
    """``N.key_norm_cv == "key_norm_cv"`` for every registered metric; an unknown name is an
    AttributeError where it is written, not a query that silently matches nothing."""

    __slots__ = ()

    def __getattr__(self, name: str) -> str:
        if name in METRICS:
            return name
        raise AttributeError(f"unknown metric {name!r}; registered: {', '.join(sorted(METRICS))}")

    def __dir__(self):
        return sorted(METRICS)


#: The registered names as attributes: ``from attnbase.metrics import N; N.ve_shuffle``.
N = _Names()


class Key(str):
    """A study result's name (a str); called with the key's parts, the key: ``Key("k")("js")
    == "k/js"``, ``Key("cluster_size")("js", 1) == "cluster_size/js/1"``."""

    __slots__ = ()

    def __call__(self, *parts) -> str:
        return "/".join((str(self), *map(str, parts)))


class _StudyKeys:
    """The registered results of one study kind as attributes (:class:`Key`)."""

    __slots__ = ("_kind",)

    def __init__(self, kind: str):
        self._kind = kind

    def __getattr__(self, name: str) -> Key:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return Key(study_result(self._kind, name).name)
        except KeyError as e:
            raise AttributeError(e.args[0]) from None

    def __dir__(self):
        return sorted(n for k, n in STUDY_RESULTS if k == self._kind)


class _Studies:
    """``S.<kind>.<name>``: the study results by kind; an unknown kind is an AttributeError."""

    __slots__ = ()

    def __getattr__(self, kind: str) -> _StudyKeys:
        if kind not in STUDY_KINDS:
            raise AttributeError(f"unknown study kind {kind!r}; registered: "
                                 f"{', '.join(STUDY_KINDS)}")
        return _StudyKeys(kind)

    def __dir__(self):
        return list(STUDY_KINDS)


#: Study result keys: ``S.reversal.reversal_rate("js") == "reversal_rate/js"``,
#: ``S.distances.n_heads == "n_heads"``.
S = _Studies()


# --- docs/metrics.md §9, generated ------------------------------------------------------------
#: The markers of the generated block in docs/metrics.md.
DOC_BEGIN = "<!-- begin: generated by `python -m attnbase.metrics`; edit attnbase/metrics.py -->"
DOC_END = "<!-- end: generated -->"


def _table(rows: list[Metric], first: str, cell) -> list[str]:
    out = [f"| {first} | label | unit | family | section |", "|---|---|---|---|---|"]
    bar = "\\|"  # a | in a cell (||M||_F, <cv>|<share>) escaped, as GitHub's tables need
    out += [f"| `{cell(m).replace('|', bar)}` | {m.label.replace('|', bar)} | {m.unit} | "
            f"{m.family} | {m.section} |" for m in rows]
    return out


def doc_tables() -> str:
    """docs/metrics.md §9's tables: every registered name by where it is stored."""
    lines = [DOC_BEGIN, ""]
    for level in ("head", "layer", "run"):
        rows = [m for m in METRICS.values() if level in m.levels]
        lines += [f"`{TABLES[level]}.metric`" + (" (parameters of the analysis marked *)"
                                                 if any(m.parameter for m in rows) else "") + ":",
                  "", *_table(rows, "metric", lambda m: m.name + ("*" if m.parameter else "")), ""]
    rows = [m for m in REGISTRY if m.levels == _ROW]
    lines += ["Row statistics (`row_stats` columns) and row dissimilarities (`head_distances`):",
              "", *_table(rows, "name", lambda m: m.name), ""]
    for kind in STUDY_KINDS:
        rows = [m for (k, _), m in STUDY_RESULTS.items() if k == kind]
        lines += [f"`study_results.key` of a `{kind}` study:", "",
                  *_table(rows, "key", lambda m: m.key), ""]
    return "\n".join([*lines, DOC_END])


def doc_block(text: str) -> str:
    """``text`` (docs/metrics.md) with its generated block replaced by :func:`doc_tables`."""
    head, _, rest = text.partition(DOC_BEGIN)
    _, _, tail = rest.partition(DOC_END)
    if not rest:
        raise ValueError("docs/metrics.md has no generated block (its begin marker is missing)")
    return head + doc_tables() + tail


if __name__ == "__main__":  # python -m attnbase.metrics [docs/metrics.md]: rewrite the block
    import sys

    if len(sys.argv) > 1:
        from pathlib import Path

        path = Path(sys.argv[1])
        path.write_text(doc_block(path.read_text()))
    else:
        print(doc_tables())
