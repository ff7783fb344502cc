"""Convention dependence of head comparisons: reversal rate, clustering ARI, MDS, redundancy.

METRICS.md §5; Papamichalis & Ruane, "Attention Rows as Compositional Data" (17-47% of head
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

__all__ = [
    "ReversalResult",
    "reversal_rate",
    "n_triplets",
    "ClusterResult",
    "cluster_agreement",
    "mds_coordinates",
    "redundancy",
]

#: Exact enumeration when the triplet count is at most this (METRICS.md §5).
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
    """Share of triplets whose verdict ``sign(D(a,b) - D(a,c))`` flips between two matrices."""

    rate: float
    ci_low: float
    ci_high: float
    flips: int
    triplets: int  #: triplets evaluated (all of them when ``exact``)
    exact: bool


def _exact_flips(d1: np.ndarray, d2: np.ndarray) -> tuple[int, int]:
    n = d1.shape[0]
    flips = total = 0
    iu = np.triu_indices(n - 1, 1)
    for a in range(n):
        others = np.delete(np.arange(n), a)
        x, y = d1[a, others], d2[a, others]
        s1 = np.sign(x[iu[0]] - x[iu[1]])
        s2 = np.sign(y[iu[0]] - y[iu[1]])
        flips += int(np.count_nonzero(s1 * s2 < 0))  # ties count as no flip
        total += s1.size
    return flips, total


def reversal_rate(d_with, d_drop, *, draws: int = 50_000, seed: int = 0,
                  exact_limit: int = EXACT_LIMIT, force_sampled: bool = False) -> ReversalResult:
    """Reversal rate between two head distance matrices (METRICS.md §5).

    A triplet ``(a, {b, c})`` flips when ``sign(D1(a,b) - D1(a,c))`` and
    ``sign(D2(a,b) - D2(a,c))`` are both non-zero and differ. All ``n(n-1)(n-2)/2`` triplets are
    enumerated when that count is ``<= exact_limit`` (the CI is then the point value); otherwise
    ``draws`` seeded uniform triplets give the rate with a Clopper-Pearson 95% CI
    (``scipy.stats.binomtest``).

    Examples
    --------
    >>> d1 = np.array([[0, 1, 2], [1, 0, 3], [2, 3, 0]], float)
    >>> d2 = np.array([[0, 2, 1], [2, 0, 3], [1, 3, 0]], float)
    >>> r = reversal_rate(d1, d2)   # anchor 0 flips; anchors 1 and 2 keep their verdicts
    >>> round(r.rate, 6), r.triplets, r.exact
    (0.333333, 3, True)
    """
    from scipy.stats import binomtest

    d1, d2 = _check(d_with, "d_with"), _check(d_drop, "d_drop")
    if d1.shape != d2.shape:
        raise StatsError(f"the two distance matrices differ in shape: {d1.shape} vs {d2.shape}")
    n = d1.shape[0]
    if n < 3:
        raise StatsError(f"a reversal rate needs >= 3 heads; got {n}")
    total = n_triplets(n)
    if total <= exact_limit and not force_sampled:
        flips, total = _exact_flips(d1, d2)
        rate = flips / total
        return ReversalResult(rate, rate, rate, flips, total, True)
    rng = np.random.default_rng(seed)
    a = rng.integers(0, n, size=draws)
    i = rng.integers(0, n - 1, size=draws)
    j = rng.integers(0, n - 2, size=draws)
    j = j + (j >= i)  # two distinct indices among the n - 1 others
    b, c = i + (i >= a), j + (j >= a)  # skip the anchor
    s1 = np.sign(d1[a, b] - d1[a, c])
    s2 = np.sign(d2[a, b] - d2[a, c])
    flips = int(np.count_nonzero(s1 * s2 < 0))
    ci = binomtest(flips, draws).proportion_ci(0.95)
    return ReversalResult(flips / draws, float(ci.low), float(ci.high), flips, draws, False)


@dataclass(frozen=True)
class ClusterResult:
    """Agglomerative clusterings of heads under two matrices and their agreement."""

    k: int
    silhouette: float  #: best silhouette under the first matrix (the one that chose k)
    ari: float
    ari_p: float  #: permutation p-value (1 + #{null >= ari}) / (1 + draws)
    ari_p_normal: float  #: normal fit to the permutation null (METRICS.md §8)
    ari_null_mean: float
    ari_null_sd: float
    draws: int
    p_at_floor: bool
    labels_with: np.ndarray
    labels_drop: np.ndarray


def _cluster(d: np.ndarray, k: int) -> np.ndarray:
    from sklearn.cluster import AgglomerativeClustering

    model = AgglomerativeClustering(n_clusters=k, metric="precomputed", linkage="average")
    return model.fit_predict(d)


def cluster_agreement(d_with, d_drop, *, k_max: int = 12, draws: int = 999,
                      seed: int = 0) -> ClusterResult:
    """Average-linkage clusterings under both conventions and their ARI (METRICS.md §5).

    ``k`` maximises ``sklearn.metrics.silhouette_score`` (precomputed) over ``2..min(k_max, n-1)``
    under ``d_with``; the same ``k`` is used under ``d_drop``. The ARI's null permutes the
    ``drop_sink`` labels (``draws`` seeded draws); the p-value is the one-sided empirical one and,
    beside it, a normal fit to the null draws.

    Examples
    --------
    >>> x = np.array([0.0, 0.1, 0.2, 5.0, 5.1, 5.2])
    >>> d = np.abs(x[:, None] - x[None, :])
    >>> r = cluster_agreement(d, d, draws=99)
    >>> r.k, r.ari
    (2, 1.0)
    """
    from scipy.stats import norm
    from sklearn.metrics import adjusted_rand_score, silhouette_score

    d1, d2 = _check(d_with, "d_with"), _check(d_drop, "d_drop")
    n = d1.shape[0]
    if n < 3:
        raise StatsError(f"clustering heads needs >= 3 heads; got {n}")
    best_k, best_s, best_labels = 2, -np.inf, None
    for k in range(2, min(k_max, n - 1) + 1):
        labels = _cluster(d1, k)
        if len(set(labels)) < 2:
            continue
        s = float(silhouette_score(d1, labels, metric="precomputed"))
        if s > best_s:
            best_k, best_s, best_labels = k, s, labels
    if best_labels is None:
        raise StatsError("no clustering with >= 2 clusters exists for these distances "
                         "(all heads identical?)")
    labels2 = _cluster(d2, best_k)
    ari = float(adjusted_rand_score(best_labels, labels2))
    rng = np.random.default_rng(seed)
    null = np.array([adjusted_rand_score(best_labels, rng.permutation(labels2))
                     for _ in range(draws)])
    p_emp = (1 + int(np.count_nonzero(null >= ari))) / (1 + draws)
    mu, sd = float(null.mean()), float(null.std(ddof=1))
    p_norm = float(norm.sf(ari, loc=mu, scale=sd)) if sd > 0 else float(ari <= mu)
    return ClusterResult(best_k, best_s, ari, p_emp, p_norm, mu, sd, draws,
                         p_emp <= 1 / (1 + draws), best_labels, labels2)


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
    """Redundancy of each head: its distance to the nearest other head (METRICS.md §5) -> ``(head,)``.

    Examples
    --------
    >>> redundancy(np.array([[0, 1, 4], [1, 0, 2], [4, 2, 0]], float)).tolist()
    [1.0, 1.0, 2.0]
    """
    d = _check(d, "distance matrix").copy()
    np.fill_diagonal(d, np.inf)
    return d.min(axis=1)
