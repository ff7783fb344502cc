"""The metric registry: every metric attnbase stores, declared once.

Each :class:`Metric` names a value of the catalog's ``head_metrics``, ``layer_metrics`` or
``run_metrics`` (``metric`` column): its label and unit as people read them, its family (one of
:data:`FAMILIES`, the sections of docs/metrics.md), the levels it is stored at, and how many
digits it is shown with. The CLI tables, the report's tables, the service's pages, the SQL views
and the published-row mapping read names, labels and units from here; the statistics that
compute the per-head values are registered with their properties in
:mod:`attnbase.stats.registry`, which points back at these names.

A bottom module (it imports no stage): reports and the warehouse may read it.
:meth:`Metric.format` writes a value with the metric's digits (:func:`attnbase.formatting.fmt`,
the one number formatter). :data:`N` gives the names as attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbase.formatting import fmt

#: The eight statistic families (docs/metrics.md §1-8).
FAMILIES = ("norms", "geometry", "concentration", "compositional", "convention", "depth",
            "spectral", "inference")
#: Where a metric is stored: one value per head, per layer (head means or a layer's own value),
#: or per run.
LEVELS = ("head", "layer", "run")
TABLES = {"head": "head_metrics", "layer": "layer_metrics", "run": "run_metrics"}


@dataclass(frozen=True)
class Metric:
    """One stored metric. ``levels``: where analyze or weights writes it; ``section``: its
    definition in docs/metrics.md; ``digits``: significant digits in tables (0: an integer);
    ``parameter``: a setting the analysis recorded beside its results (draws, seeds)."""

    name: str
    label: str
    unit: str
    family: str
    levels: tuple[str, ...]
    section: str
    digits: int = 4
    parameter: bool = False

    def sql(self, level: str) -> str:
        """The query of this metric's values at ``level`` (``run_id`` [, layer [, head]], value)."""
        keys = {"head": "run_id, layer, head", "layer": "run_id, layer", "run": "run_id"}[level]
        return f"SELECT {keys}, value FROM {TABLES[level]} WHERE metric = '{self.name}'"

    def format(self, value, *, style: str = "table") -> str:
        """``value`` with this metric's digits (:func:`attnbase.formatting.fmt`)."""
        return fmt(value, self, style=style)


_H, _L, _R = ("head", "layer", "run"), ("layer", "run"), ("run",)
_HL = ("head", "layer")

METRICS: dict[str, Metric] = {m.name: m for m in (
    # §1 norms
    Metric("key_norm_cv", "key-norm CV", "dimensionless", "norms", _H, "§1"),
    # every position of the run's sink set left out (runs.sink_positions; token 0 for text)
    Metric("key_norm_cv_excl_sink", "key-norm CV without the sink positions", "dimensionless",
           "norms", _H, "§1"),
    Metric("key_norm_cv_baseline", "isotropic baseline 1/sqrt(2 d_head)", "dimensionless",
           "norms", _R, "§1"),
    # §2 geometry
    Metric("ve_at_8", "VE@8", "fraction", "geometry", _H, "§2"),
    Metric("ve_gauss", "VE@8 Gauss null", "fraction", "geometry", _H, "§2"),
    Metric("ve_shuffle", "VE@8 shuffle null", "fraction", "geometry", _H, "§2"),
    Metric("ve_k", "k of VE@k", "components", "geometry", _R, "§2", 0, parameter=True),
    # §3 concentration
    Metric("max_share", "max share", "fraction", "concentration", _H, "§3"),
    Metric("row_max_share", "row max share", "fraction", "concentration", _H, "§3"),
    Metric("mean_sink_mass", "sink mass", "fraction", "concentration", _H, "§3"),
    Metric("onset_layer", "onset layer", "layer index", "concentration", _R, "§3", 0),
    Metric("onset_depth", "onset depth", "fraction of layers", "concentration", _R, "§3"),
    Metric("onset_threshold", "onset threshold", "fraction", "concentration", _R, "§3", parameter=True),
    Metric("row_max_share_min_query", "first query of row max share", "position",
           "concentration", _R, "§3", 0, parameter=True),
    # §4 compositional: the row-level quantities live in row_stats (their statistics:
    # attnbase.stats.registry); the run's correlation of norms and shares is §1-3's r
    # §5 convention: study results (study_results), not stored per head
    # §6 depth
    Metric("rank_collapse", "rank collapse", "ratio", "depth", _L, "§6"),
    Metric("rank_collapse_sd", "rank collapse sd", "ratio", "depth", _L, "§6"),
    Metric("rank_collapse_excl_sink", "rank collapse without token 0", "ratio", "depth", _L,
           "§6"),
    Metric("rank_collapse_excl_sink_sd", "rank collapse without token 0, sd", "ratio", "depth",
           _L, "§6"),
    Metric("residual_erank", "residual effective rank", "dimensions", "depth", _L, "§6"),
    Metric("residual_erank_sd", "residual effective rank sd", "dimensions", "depth", _L, "§6"),
    Metric("residual_erank_pr", "residual participation ratio", "dimensions", "depth", _L,
           "§6"),
    # §7 spectral (weights runs)
    Metric("routing_fraction", "routing fraction", "fraction", "spectral", _H, "§7"),
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
    # §8 inference
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
)}

#: head_metrics pivoted into the ``head_summary`` view's columns, in order.
HEAD_SUMMARY = ("key_norm_cv", "key_norm_cv_excl_sink", "ve_at_8", "ve_gauss", "ve_shuffle",
                "max_share", "row_max_share", "mean_sink_mass")
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
