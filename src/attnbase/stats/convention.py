"""Convention dependence of head comparisons: reversal rate, clustering ARI, MDS, redundancy.

docs/metrics.md §5; Papamichalis & Ruane, "Attention Rows as Compositional Data" (17-47% of head
triplets flip between keeping and dropping the sink column across ten models; re-clusterings
agree at ARI 0.01-0.05); the ``clark`` preset follows Clark et al. 2019, "What Does BERT Look
At?" (heads clustered by Jensen-Shannon distance, drawn with 2-D MDS).

Inputs are head distance matrices ``(head, head)`` (symmetric, zero diagonal), as
:class:`attnbase.stats.head_distances.HeadDistanceAccumulator` produces and ``head_distances``
stores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnbase.errors import StatsError
from attnbase.stats.defaults import MIN_CLUSTER_SHARE

__all__ = [
    "ReversalResult",
    "reversal_rate",
    "reversal_over_text",
    "n_triplets",
    "ClusterResult",
    "cluster_agreement",
    "ari_over_text",
    "min_cluster_size",
    "null_is_continuous",
    "mds_coordinates",
    "redundancy",
]

#: Exact enumeration when the triplet count is at most this (docs/metrics.md §5).
EXACT_LIMIT = 2_000_000


def _check(d: np.ndarray, name: str) -> np.ndarray:
    d = np.asarray(d, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise StatsError(f"{name} must be a square (head, head) distance matrix; got {d.shape}")
    return d


def n_triplets(n: int) -> int:
    """Triplets (anchor a, unordered {b, c}) of distinct heads: ``n (n-1) (n-2) / 2``.

    Examples
    --------
    >>> n_triplets(72)
    178920
    """
    return n * (n - 1) * (n - 2) // 2


@dataclass(frozen=True)
class ReversalResult:
    """Share of triplets whose verdict ``sign(D(a,b) - D(a,c))`` flips between two matrices.

    ``ci_low``/``ci_high``: the 95% CI over the text (:func:`reversal_over_text`); from
    :func:`reversal_rate` (two matrices, no text to resample) the triplet-sampling interval of
    sampled triplets, NaN when exact."""

    rate: float
    ci_low: float
    ci_high: float
    flips: int
    triplets: int  #: triplets evaluated (all of them when ``exact``)
    exact: bool
    triplet_se: float = 0.0  #: binomial standard error of sampled triplets (0 when exact)
    boot_mean: float = float("nan")  #: mean of the bootstrap replicates' rates
    boot_sd: float = float("nan")
    units: int = 0  #: bootstrap units (sequences) resampled
    ci_floor: bool = False  #: every replicate gave the same rate: the CI is Clopper-Pearson


def _exact_flips(d1: np.ndarray, d2: np.ndarray) -> tuple[int, int]:
    n = d1.shape[0]
    iu = np.triu_indices(n - 1, 1)
    # others[a] = the n - 1 heads other than a, ascending
    others = np.arange(n - 1)[None, :] + (np.arange(n - 1)[None, :] >= np.arange(n)[:, None])
    rows = np.arange(n)[:, None]
    x, y = d1[rows, others], d2[rows, others]
    s1 = np.sign(x[:, iu[0]] - x[:, iu[1]])
    s2 = np.sign(y[:, iu[0]] - y[:, iu[1]])
    return int(np.count_nonzero(s1 * s2 < 0)), int(s1.size)  # ties count as no flip


def _triplets(n: int, draws: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``draws`` seeded uniform triplets (anchor a, b != c, both != a)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, n, size=draws)
    i = rng.integers(0, n - 1, size=draws)
    j = rng.integers(0, n - 2, size=draws)
    j = j + (j >= i)  # two distinct indices among the n - 1 others
    return a, i + (i >= a), j + (j >= a)  # skip the anchor


def _sampled_flips(d1, d2, trip) -> int:
    a, b, c = trip
    s1 = np.sign(d1[a, b] - d1[a, c])
    s2 = np.sign(d2[a, b] - d2[a, c])
    return int(np.count_nonzero(s1 * s2 < 0))


def _pair(d_with, d_drop) -> tuple[np.ndarray, np.ndarray]:
    d1, d2 = _check(d_with, "d_with"), _check(d_drop, "d_drop")
    if d1.shape != d2.shape:
        raise StatsError(f"the two distance matrices differ in shape: {d1.shape} vs {d2.shape}")
    if d1.shape[0] < 3:
        raise StatsError(f"a reversal rate needs >= 3 heads; got {d1.shape[0]}")
    return d1, d2


def reversal_rate(d_with, d_drop, *, draws: int = 50_000, seed: int = 0,
                  exact_limit: int = EXACT_LIMIT, force_sampled: bool = False) -> ReversalResult:
    """Reversal rate between two head distance matrices (docs/metrics.md §5), no interval.

    A triplet ``(a, {b, c})`` flips when ``sign(D1(a,b) - D1(a,c))`` and
    ``sign(D2(a,b) - D2(a,c))`` are both non-zero and differ. All ``n(n-1)(n-2)/2`` triplets are
    enumerated when that count is ``<= exact_limit``; otherwise ``draws`` seeded uniform
    triplets, with their Clopper-Pearson 95% interval (``scipy.stats.binomtest``): the
    triplet-sampling error alone, the matrices held fixed. Two matrices hold no sample of the
    text, so an exact rate has no interval here (NaN): the interval over the text comes from
    :func:`reversal_over_text`.

    Examples
    --------
    >>> d1 = np.array([[0, 1, 2], [1, 0, 3], [2, 3, 0]], float)
    >>> d2 = np.array([[0, 2, 1], [2, 0, 3], [1, 3, 0]], float)
    >>> r = reversal_rate(d1, d2)   # anchor 0 flips; anchors 1 and 2 keep their verdicts
    >>> round(r.rate, 6), r.triplets, r.exact
    (0.333333, 3, True)
    """
    d1, d2 = _pair(d_with, d_drop)
    n = d1.shape[0]
    if n_triplets(n) <= exact_limit and not force_sampled:
        flips, total = _exact_flips(d1, d2)
        return ReversalResult(flips / total, float("nan"), float("nan"), flips, total, True)
    from scipy.stats import binomtest

    flips = _sampled_flips(d1, d2, _triplets(n, draws, seed))
    rate = flips / draws
    ci = binomtest(flips, draws).proportion_ci(0.95)
    return ReversalResult(rate, float(ci.low), float(ci.high), flips, draws, False,
                          triplet_se=float(np.sqrt(rate * (1 - rate) / draws)))


def reversal_over_text(parts, key_with, key_drop, *, draws: int = 50_000, seed: int = 0,
                       boot: int | None = None, exact_limit: int = EXACT_LIMIT,
                       force_sampled: bool = False) -> ReversalResult:
    """Reversal rate with its 95% CI over the text (docs/metrics.md §5).

    ``parts`` (:class:`~attnbase.stats.text_bootstrap.SeqParts`) holds per-sequence partial sums
    of the head distances; ``key_with``/``key_drop`` name the two matrices compared. The rate is
    that of the full-text matrices; each of ``boot`` replicates resamples the sequences (a
    weighted sum of the parts) and evaluates the *same* triplets (all of them, or the same
    ``draws`` seeded ones), so the replicates' spread is the text's. The CI is their percentile
    interval, widened in quadrature on both sides by twice the replicates' bias ``|mean(reps) -
    r|`` (noise flips near-ties, so the rate of noisy distances is biased) and, where triplets are
    sampled, by the binomial triplet-sampling error ``z sqrt(r (1 - r) / draws)``. A CI of zero width is never
    reported: where every replicate gives the same rate, the Clopper-Pearson interval of the flips
    over the triplets stands in (``ci_floor``).
    """
    from scipy.stats import binomtest

    from attnbase.stats import text_bootstrap as tb

    boot = tb.BOOT if boot is None else boot
    full = parts.matrices((key_with, key_drop))
    d1, d2 = _pair(full[key_with], full[key_drop])
    n = d1.shape[0]
    exact = n_triplets(n) <= exact_limit and not force_sampled
    trip = None if exact else _triplets(n, draws, seed)

    def rate_of(a, b) -> tuple[int, int]:
        return _exact_flips(a, b) if exact else (_sampled_flips(a, b, trip), draws)

    flips, total = rate_of(d1, d2)
    rate = flips / total
    se = 0.0 if exact else float(np.sqrt(rate * (1 - rate) / draws))
    reps = np.array([rate_of(m[key_with], m[key_drop])[0] / total
                     for m in parts.replicates((key_with, key_drop), boot, seed)])
    lo, hi = tb.percentile_interval(reps)
    # a flip rate measured on noisy distances is biased (noise flips near-ties); the replicates'
    # mean sits b from the estimate and the estimate about b from the truth, so 2|b| joins the
    # triplet-sampling error in quadrature (planted models: 94% coverage, 89% without it)
    bias = float(reps.mean()) - rate
    lo, hi = tb.widen(rate, min(lo, rate), max(hi, rate), float(np.hypot(se, 2 * bias / 1.959964)))
    floor = hi - lo <= 0
    if floor:
        ci = binomtest(flips, total).proportion_ci(0.95)
        lo, hi = float(ci.low), float(ci.high)
    return ReversalResult(rate, lo, hi, flips, total, exact, se, float(reps.mean()),
                          float(reps.std(ddof=1)), parts.n_units, floor)


#: The smallest admissible cluster holds at least :data:`MIN_CLUSTER_SHARE` of the heads
#: (:mod:`attnbase.stats.defaults`) and at least this many heads.
MIN_CLUSTER_FLOOR = 2
#: A normal fit to a permutation null is shown only where the null took at least this many
#: distinct values and no single value holds more than :data:`NORMAL_FIT_MAX_TIE` of the draws
#: (a null of a few values is not a normal distribution; its fit's tail p means nothing).
NORMAL_FIT_MIN_DISTINCT = 20
NORMAL_FIT_MAX_TIE = 0.2


def min_cluster_size(n_heads: int, share: float = MIN_CLUSTER_SHARE) -> int:
    """``max(2, ceil(share * n_heads))``: the smallest admissible cluster.

    Examples
    --------
    >>> min_cluster_size(72), min_cluster_size(270), min_cluster_size(12)
    (4, 14, 2)
    """
    return max(MIN_CLUSTER_FLOOR, int(np.ceil(share * n_heads - 1e-9)))


def null_is_continuous(null: np.ndarray) -> bool:
    """The rule for a normal-fit p (:data:`NORMAL_FIT_MIN_DISTINCT`, :data:`NORMAL_FIT_MAX_TIE`).

    Examples
    --------
    >>> null_is_continuous(np.linspace(0, 1, 999)), null_is_continuous(np.r_[np.zeros(900), np.ones(99)])
    (True, False)
    """
    _, counts = np.unique(np.asarray(null), return_counts=True)
    return bool(len(counts) >= NORMAL_FIT_MIN_DISTINCT
                and counts.max() <= NORMAL_FIT_MAX_TIE * counts.sum())


@dataclass(frozen=True)
class ClusterResult:
    """Agglomerative clusterings of heads under two matrices and their agreement.

    ``k`` is None where no partition of ``2..k_max`` clusters has its smallest cluster
    ``>= min_cluster``: then there is no clustering to compare and every ARI field is None.
    """

    k: int | None
    silhouette: float | None  #: best admissible silhouette under the first matrix
    ari: float | None
    ari_p: float | None  #: permutation p-value (1 + #{null >= ari}) / (1 + draws)
    ari_p_normal: float | None  #: normal fit to the null; None unless the null is continuous
    ari_null_mean: float | None
    ari_null_sd: float | None
    null_distinct: int  #: distinct values the permutation null took
    draws: int
    p_at_floor: bool
    labels_with: np.ndarray
    labels_drop: np.ndarray
    min_cluster: int  #: smallest admissible cluster size
    sizes_with: tuple[int, ...]  #: cluster sizes, largest first
    sizes_drop: tuple[int, ...]
    refused: tuple[int, ...] = ()  #: the k whose partitions held a cluster below min_cluster


def _cluster(d: np.ndarray, k: int) -> np.ndarray:
    from sklearn.cluster import AgglomerativeClustering

    model = AgglomerativeClustering(n_clusters=k, metric="precomputed", linkage="average")
    return model.fit_predict(d)


def _sizes(labels: np.ndarray) -> tuple[int, ...]:
    return tuple(int(c) for c in sorted(np.bincount(labels), reverse=True) if c > 0)


def cluster_agreement(d_with, d_drop, *, k_max: int = 12, draws: int = 999, seed: int = 0,
                      min_cluster: int | None = None) -> ClusterResult:
    """Average-linkage clusterings under both conventions and their ARI (docs/metrics.md §5).

    ``k`` maximises ``sklearn.metrics.silhouette_score`` (precomputed) under ``d_with`` over the
    partitions of ``2..min(k_max, n-1)`` clusters whose smallest cluster holds at least
    ``min_cluster`` heads (default :func:`min_cluster_size`); the same ``k`` is used under
    ``d_drop``. Where no ``k`` qualifies, ``k`` and every ARI field are None. The ARI's null
    permutes the ``drop_sink`` labels (``draws`` seeded draws): the one-sided empirical p, the
    number of distinct values the null took, and a normal fit only where
    :func:`null_is_continuous`.

    Examples
    --------
    >>> x = np.array([0.0, 0.1, 0.2, 5.0, 5.1, 5.2])
    >>> d = np.abs(x[:, None] - x[None, :])
    >>> r = cluster_agreement(d, d, draws=99)
    >>> r.k, r.ari, r.sizes_with
    (2, 1.0, (3, 3))
    """
    from scipy.stats import norm
    from sklearn.metrics import adjusted_rand_score, silhouette_score

    d1, d2 = _check(d_with, "d_with"), _check(d_drop, "d_drop")
    n = d1.shape[0]
    if n < 3:
        raise StatsError(f"clustering heads needs >= 3 heads; got {n}")
    m = min_cluster_size(n) if min_cluster is None else int(min_cluster)
    if m < 1:
        raise StatsError(f"min_cluster={m} must be >= 1")
    best_k, best_s, best_labels, refused = None, -np.inf, None, []
    for k in range(2, min(k_max, n - 1) + 1):
        labels = _cluster(d1, k)
        if len(set(labels)) < 2:
            continue
        if min(_sizes(labels)) < m:
            refused.append(k)
            continue
        s = float(silhouette_score(d1, labels, metric="precomputed"))
        if s > best_s:
            best_k, best_s, best_labels = k, s, labels
    if best_labels is None:
        zeros = np.zeros(n, dtype=np.int64)
        return ClusterResult(None, None, None, None, None, None, None, 0, draws, False, zeros,
                             zeros, m, (), (), tuple(refused))
    labels2 = _cluster(d2, best_k)
    ari = float(adjusted_rand_score(best_labels, labels2))
    rng = np.random.default_rng(seed)
    null = np.array([adjusted_rand_score(best_labels, rng.permutation(labels2))
                     for _ in range(draws)])
    p_emp = (1 + int(np.count_nonzero(null >= ari))) / (1 + draws)
    mu, sd = float(null.mean()), float(null.std(ddof=1)) if draws > 1 else 0.0
    p_norm = (float(norm.sf(ari, loc=mu, scale=sd))
              if sd > 0 and null_is_continuous(null) else None)
    return ClusterResult(best_k, best_s, ari, p_emp, p_norm, mu, sd, int(len(np.unique(null))),
                         draws, p_emp <= 1 / (1 + draws), best_labels, labels2, m,
                         _sizes(best_labels), _sizes(labels2), tuple(refused))


def ari_over_text(parts, key_with, key_drop, k: int, *, boot: int | None = None,
                  seed: int = 0) -> tuple[float, float, float, float]:
    """The ARI's spread over sequence resamples: each replicate re-clusters both conventions'
    resampled matrices at the chosen ``k``; ``(low, high, mean, sd)`` (95% percentile
    interval)."""
    from sklearn.metrics import adjusted_rand_score

    from attnbase.stats import text_bootstrap as tb

    reps = np.array([adjusted_rand_score(_cluster(m[key_with], k), _cluster(m[key_drop], k))
                     for m in parts.replicates((key_with, key_drop),
                                               tb.BOOT if boot is None else boot, seed)])
    lo, hi = tb.percentile_interval(reps)
    return lo, hi, float(reps.mean()), float(reps.std(ddof=1))


def mds_coordinates(d, *, seed: int = 0) -> np.ndarray:
    """2-D metric MDS (``sklearn.manifold.MDS``, SMACOF) of a distance matrix -> ``(head, 2)``.

    Examples
    --------
    >>> x = np.array([0.0, 1.0, 3.0])
    >>> xy = mds_coordinates(np.abs(x[:, None] - x[None, :]))
    >>> round(float(np.linalg.norm(xy[0] - xy[2])), 2)
    3.0
    """
    from sklearn.manifold import MDS

    d = _check(d, "distance matrix")
    mds = MDS(n_components=2, metric_mds=True, metric="precomputed", random_state=seed,
              n_init=1, init="classical_mds")
    return mds.fit_transform(d)


def redundancy(d) -> np.ndarray:
    """Redundancy of each head: its distance to the nearest other head (docs/metrics.md §5) -> ``(head,)``.

    Examples
    --------
    >>> redundancy(np.array([[0, 1, 4], [1, 0, 2], [4, 2, 0]], float)).tolist()
    [1.0, 1.0, 2.0]
    """
    d = _check(d, "distance matrix").copy()
    np.fill_diagonal(d, np.inf)
    return d.min(axis=1)
