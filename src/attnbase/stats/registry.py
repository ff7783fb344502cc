"""Every statistic of the stats stage, registered once with its properties.

As scikit-learn's metric registries (``SYMMETRIC_METRICS``, ``NORMALIZED_METRICS``) drive its
common tests, :data:`STATISTICS` drives ``tests/stats/test_registry.py``: each declared property
(bounded range, scale invariance, rotation invariance, invariance to permuting tokens or
sequences) is checked on random inputs for every statistic that claims it, and a test asserts
that every public function of the family modules is registered here, listed in :data:`NULLS`, or
named in :data:`HELPERS` with the reason it is not a statistic -- a new metric cannot skip them.

Input kinds (shape vocabulary of docs/architecture.md):

``keys``
    keys ``(..., seq, pos, d_head)`` -> ``(...)``: one value per head, pooled over sequences.
``keys_seq``
    keys ``(..., pos, d_head)`` -> ``(...)``: one value per sequence (mean over seq for a head).
``attn``
    attention probabilities ``(..., seq, query, key)`` -> ``(...)``.
``attn_tokens``
    a pair: attention probabilities ``(..., seq, query, key)`` and the windows' token ids
    ``(seq, pos)`` -> ``(...)`` (the head taxonomy, :mod:`attnbase.stats.taxonomy`).
``profile``
    a layer profile ``(layer,)`` or ``(layer, head)`` -> a layer index or None.
``logit_rows``
    attention logits of rows ``(..., key)``, masked keys ``-inf`` -> ``(...)`` (one value per row).
``logit_row_pairs``
    two such arrays of rows with the same unmasked keys -> ``(...)`` (a row dissimilarity).
``hidden``
    hidden states ``(..., pos, d_model)`` -> ``(...)``: one value per sequence.
``qk``
    a pair of weights ``(w_q, w_k)``, each ``(..., d_model, d_head)`` -> ``(...)`` per head.
``distance_pairs``
    two head distance matrices ``(head, head)`` (with and without the sink) -> a scalar.

Each statistic is declared once, in :mod:`attnbase.metrics` (a bottom module every stage
reads): its name, label, unit, family, levels, docs section, and a :class:`~attnbase.metrics.Compute`
naming its function, input kind, bounds and invariances. :data:`STATISTICS` is the stats stage's
view of those declarations: the functions resolved, the invariances as the flags the tests read.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from attnbase.metrics import COMPUTED, INPUT_KINDS, Metric
from attnbase.stats import (
    compositional, concentration, convention, depth, geometry, inference, norms, spectral,
)

#: The family modules whose public names the registry must cover: all eight families.
FAMILY_MODULES = (norms, geometry, concentration, inference, compositional, convention, depth,
                  spectral)

@dataclass(frozen=True)
class Statistic:
    """A registered statistic and the properties its tests check (a view of its
    :class:`~attnbase.metrics.Metric`)."""

    name: str  #: the registered name (:mod:`attnbase.metrics`)
    func: Callable
    family: str
    input: str  #: one of :data:`INPUT_KINDS`
    reference: str  #: docs/metrics.md section and paper column
    bounds: tuple[float, float] | None = None  #: closed range of every value (inf allowed)
    scale_invariant: bool = False  #: f(c x) = f(x) for every c > 0
    rotation_invariant: bool = False  #: f(x Q) = f(x) for orthogonal Q acting on d_head
    token_permutation_invariant: bool = False  #: permuting the pos axis leaves f unchanged
    seq_permutation_invariant: bool = False  #: permuting the seq axis leaves f unchanged
    head_metric: bool = True  #: written to head_metrics by analyze_run
    shift_invariant: bool = False  #: f(z + c) = f(z) for a constant c added to a row's logits
    sink_invariant: bool = False  #: f unchanged when the sink logit z_0 (the sink mass) changes
    symmetric: bool = False  #: f(z, w) = f(w, z) (row dissimilarities)
    result: str | None = None  #: the attribute of ``func``'s result that holds the value


def resolve(ref: str) -> Callable:
    """The function ``"package.module:name"`` names (a registry's dotted reference)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


#: The family whose head metrics a weights run writes (``attnbase weights``), not analyze_run.
WEIGHTS_FAMILY = "spectral"


def _view(m: Metric) -> Statistic:
    c = m.compute
    flags = {f"{i}_invariant" if i != "symmetric" else i: True for i in c.invariances}
    return Statistic(m.name, resolve(c.func), m.family, c.input, c.reference, c.bounds,
                     head_metric="head" in m.levels and m.family != WEIGHTS_FAMILY,
                     result=c.result, **flags)


STATISTICS: dict[str, Statistic] = {name: _view(m) for name, m in COMPUTED.items()}

#: Null generators: name -> (function, what it preserves and destroys).
NULLS: dict[str, tuple[Callable, str]] = {
    "gauss": (geometry.gauss_null_ve, "i.i.d. N(0,1) keys of the same pos x d_head shape"),
    "shuffle": (geometry.shuffle_null_ve,
                "each key dimension permuted across tokens: marginals kept, joint structure lost"),
}

#: Public functions of the family modules that are not statistics, and why.
HELPERS: dict[str, str] = {
    "key_norms": "elementwise transform (the norms key_norm_cv summarises)",
    "isotropic_norm_cv": "closed-form baseline 1/sqrt(2 d_head), a function of d_head only",
    "centred_spectrum": "building block of ve_at_k (its eigenvalues)",
    "shuffle_tokens": "the shuffle null's resampling step",
    "sink_mass": "per-row quantity (row_stats column); mean_sink_mass is its statistic",
    "onset_depth": "rescales onset_layer by n_layers",
    "empirical_p_value": "inference helper (docs/metrics.md §8)",
    "adjust_p_values": "inference helper: BH / Holm via statsmodels",
    "Correlation": "result type of pearson / spearman",
    "pearson": "inference helper: scipy.stats.pearsonr (r_cv_share)",
    "spearman": "inference helper: scipy.stats.spearmanr",
    "bootstrap_ci": "inference helper: scipy.stats.bootstrap over heads",
    "P_ADJUST_METHODS": "constant: names of the p-value adjustments",
    "ve_with_shuffle_null": "ve_at_k and shuffle_null_ve of the same keys in one computation",
    "gauss_null_pool": "the Gauss null's per-sequence draws, cached per shape (gauss_null_ve)",
    "NullTest": "result type of the null tests (docs/metrics.md §8)",
    "P_METHODS": "constant: how a null test's p-value was obtained",
    "clt_mean_test": "inference helper: CLT test of a mean over sequences (per-sequence nulls)",
    "pooled_clt_mean_test": "inference helper: CLT test against one shared per-sequence null",
    "normal_fit_test": "inference helper: normal fit to draws of the statistic",
    "closure": "compositional building block (the closure operator C)",
    "clr": "compositional transform of positive rows (clr_from_logits is the stored-run path)",
    "clr_from_logits": "elementwise transform (z - mean z on the prefix) the Gram matrices use",
    "multiplicative_replacement": "zero replacement for rows imported as probabilities",
    "logits_from_probs": "import path: probabilities -> logits with multiplicative replacement",
    "binary_entropy": "closed-form term H_b(s) of the entropy chain rule",
    "sink_mass_from_logits": "per-row quantity (row_stats.sink_mass from logits)",
    "EntropyChange": "result type of entropy_change",
    "entropy_change": "exact two-state split of dH (docs/metrics.md §4); tested on its reference",
    # convention (§5)
    "ReversalResult": "result type of reversal_rate",
    "reversal_over_text": "reversal_rate with its bootstrap interval over the text's sequences",
    "n_triplets": "counting helper: head triplets of a reversal",
    "ClusterResult": "result type of cluster_agreement",
    "cluster_agreement": "clustering under both conventions and their ARI (a study, not a value "
                         "per input: tested in tests/stats/test_head_distances.py)",
    "ari_over_text": "cluster_agreement's ARI with its interval over the text",
    "min_cluster_size": "rule: the smallest cluster a qualifying partition may hold",
    "null_is_continuous": "rule: whether an ARI null is continuous enough for a normal p-value",
    "mds_coordinates": "plotting coordinates of the heads (metric MDS)",
    "redundancy": "building block of the clark preset (pairwise head redundancy)",
    # depth (§6)
    "ERANK_KINDS": "constant: names of the effective-rank variants",
    "l1_norm": "norm building block of composite_norm",
    "linf_norm": "norm building block of composite_norm",
    "composite_norm": "norm building block of residual_ratio",
    "token_residual": "res(X) = X - 1 mean_t(X), the building block of residual_ratio",
    "rank1_residual": "building block of path_residual_ratio (Eckart-Young)",
    "path_residual_ratio": "residual_ratio of path products (the paths study's value)",
    "effective_rank": "Roy-Vetterli / participation ratio of singular values (a transform)",
    "residual_erank": "effective_rank of res(H) (layer_metrics residual_erank)",
    "hidden_layer_profile": "one layer's per-sequence depth values (residual_ratio and erank)",
    "depth_layer_rows": "layer_metrics rows of a run's hidden states (reads the store)",
    "depth_values": "one layer's depth values from its profile, in DEPTH_LAYER_METRICS order",
    "depth_table": "layer_metrics columns of depth rows",
    "singular_values": "building block of residual_erank",
    "PATH_ORDERS": "constant: orders of the path products",
    "sample_paths": "the paths study's random layer/head draws",
    "path_products": "products of attention matrices along sampled paths",
    "path_ratio_draws": "path_residual_ratio over sampled paths of each length",
    # spectral (§7)
    "SD_HEAD_METRICS": "constant: head_metrics names of a weights run",
    "SD_LAYER_METRICS": "constant: layer_metrics names of a weights run",
    "span_core": "the 2 d_head span of [W_Q, W_K] (no d_model x d_model matrix)",
    "sd_parts": "the symmetric and skew parts S, A of a head's form",
    "sd_metrics": "every S-D head metric at once (routing_fraction is registered)",
    "sd_metrics_dense": "dense reference of sd_metrics for tests",
    "unstable_eigenvalues": "count and largest real part of M's eigenvalues",
    "bilinear_logits": "the logits a head's weights give (a check of the form)",
    "cascade": "layer means of a head value (the spectral cascade)",
    "sd_tables": "catalog rows of a weights run",
}


def get_statistic(name: str) -> Statistic:
    """The registered statistic ``name``; StatsError listing the valid names otherwise."""
    from attnbase.errors import StatsError

    try:
        return STATISTICS[name]
    except KeyError:
        raise StatsError(
            f"unknown statistic {name!r}; registered: {', '.join(sorted(STATISTICS))}"
        ) from None
