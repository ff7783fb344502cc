"""Inference conventions: null tests, multiple comparisons, correlations (docs/metrics.md §8).

Every null comparison (:class:`NullTest`) reports the statistic, the null mean and sd,
``z = (statistic - null_mean) / null_sd``, the number of null draws, the one-sided empirical
p-value ``(1 + #{null >= stat}) / (1 + draws)`` (Davison & Hinkley 1997, eq. 4.11: never 0,
exact under exchangeability) flagged where it sits at its floor ``1 / (1 + draws)``, and a
p-value ``norm.sf(z)`` that is not bounded by the draw count (``p_method``):

* ``clt_normal`` (:func:`clt_mean_test`, :func:`pooled_clt_mean_test`): the statistic is a mean
  over ``n`` independent sequences, so its null is the mean of ``n`` per-sequence nulls: mean
  ``mean_s mu_s`` and variance ``sum_s var_s / n^2`` (central limit theorem), estimated from
  per-sequence null draws;
* ``normal_fit`` (:func:`normal_fit_test`): a normal fitted to draws of the statistic itself.

``null_sd`` is the sd of ``statistic - null_mean`` under the null, i.e. it includes the
Monte-Carlo error of the estimated ``null_mean`` (a factor ``sqrt(1 + 1/D)`` for ``D`` draws per
sequence), so that ``z`` is standard normal under the null and ``p_value == norm.sf(z)``.
Corrections over heads use statsmodels'
``multipletests`` (Benjamini-Hochberg by default, Holm available); correlations use scipy.stats;
bootstrap intervals resample (layer, head) pairs with :func:`scipy.stats.bootstrap`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from attnbase.errors import StatsError

__all__ = [
    "NullTest",
    "P_METHODS",
    "clt_mean_test",
    "pooled_clt_mean_test",
    "normal_fit_test",
    "empirical_p_value",
    "adjust_p_values",
    "Correlation",
    "pearson",
    "spearman",
    "bootstrap_ci",
    "P_ADJUST_METHODS",
]

#: Names accepted by :func:`adjust_p_values` -> statsmodels ``multipletests`` method.
P_ADJUST_METHODS: dict[str, str] = {"bh": "fdr_bh", "holm": "holm"}


def empirical_p_value(statistic, null) -> np.ndarray:
    """One-sided empirical p-value ``(1 + #{null >= stat}) / (1 + draws)`` (docs/metrics.md §8).

    Parameters
    ----------
    statistic : array_like, shape (...)
    null : array_like, shape (draws, ...)
        Null draws of the same statistic, draws on axis 0.

    Returns
    -------
    ndarray, shape (...)
        In ``[1 / (1 + draws), 1]``; NaN where the statistic is NaN.

    Examples
    --------
    >>> float(empirical_p_value(0.5, [0.1, 0.2, 0.6, 0.5]))
    0.6
    >>> float(empirical_p_value(0.9, [0.1, 0.2, 0.3]))
    0.25
    """
    s = np.asarray(statistic, dtype=np.float64)
    z = np.asarray(null, dtype=np.float64)
    if z.ndim == 0 or z.shape[1:] != s.shape and z.shape[1:] != ():
        raise StatsError(
            f"null must have shape (draws,) + statistic.shape = (draws,) + {s.shape}, got {z.shape}"
        )
    draws = z.shape[0]
    if draws < 1:
        raise StatsError("null has no draws; pass at least one null draw")
    p = (1.0 + (z >= s).sum(axis=0)) / (1.0 + draws)
    return np.where(np.isnan(s), np.nan, p)


#: ``p_method`` values of :class:`NullTest`.
P_METHODS: tuple[str, ...] = ("clt_normal", "normal_fit")


@dataclass(frozen=True)
class NullTest:
    """One null comparison per element of the statistic's shape ``(...)`` (docs/metrics.md §8).

    Attributes
    ----------
    statistic, null_mean, null_sd, z, p_value, p_empirical : ndarray, shape (...)
        ``z = (statistic - null_mean) / null_sd``; ``p_value = norm.sf(z)`` (one-sided,
        statistic above the null; underflows to 0 beyond z ~ 38); ``p_empirical`` from
        ``draws`` draws of the statistic's null.
    p_at_floor : ndarray of bool, shape (...)
        ``p_empirical`` equals its floor ``1 / (1 + draws)``: no null draw reached the statistic.
    draws : int
        Null draws of the statistic behind ``p_empirical``.
    p_method : str
        How ``p_value`` was obtained, one of :data:`P_METHODS`.
    """

    statistic: np.ndarray
    null_mean: np.ndarray
    null_sd: np.ndarray
    z: np.ndarray
    p_value: np.ndarray
    p_empirical: np.ndarray
    p_at_floor: np.ndarray
    draws: int
    p_method: str


def _null_test(statistic, null_mean, null_sd, head_null, p_method: str) -> NullTest:
    """Assemble a :class:`NullTest`; ``head_null`` has shape ``(draws, ...)``."""
    s = np.asarray(statistic, dtype=np.float64)
    mean = np.broadcast_to(np.asarray(null_mean, dtype=np.float64), s.shape)
    sd = np.broadcast_to(np.asarray(null_sd, dtype=np.float64), s.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = s - mean
        # a degenerate null (sd 0, e.g. VE@k = 1 whatever the data when k >= rank): z is
        # 0 where the statistic equals the null and +-inf otherwise
        z = np.where(sd > 0, diff / sd, np.where(diff == 0, 0.0, np.sign(diff) * np.inf))
    z = np.where(np.isnan(s) | np.isnan(mean) | np.isnan(sd), np.nan, z)
    # a statistic equal to a degenerate null is no evidence against it: p = 1, not sf(0) = 0.5
    p = np.where((sd == 0) & (diff == 0), 1.0, sps.norm.sf(z))
    draws = int(np.shape(head_null)[0])
    p_emp = empirical_p_value(s, head_null)
    return NullTest(statistic=s, null_mean=np.array(mean), null_sd=np.array(sd), z=z, p_value=p,
                    p_empirical=p_emp, p_at_floor=np.isclose(p_emp, 1.0 / (1 + draws)),
                    draws=draws, p_method=p_method)


def clt_mean_test(statistic, seq_null, *, seq_observed=None, n_seqs=None, draws: int = 200,
                  seed=0) -> NullTest:
    """Test a mean over sequences against per-sequence null draws, by the CLT (``clt_normal``).

    The statistic is ``mean_s v_s`` over the ``n`` sequences whose value is finite; the null
    gives sequence ``s`` its own distribution (e.g. the shuffle null permutes *that* sequence's
    keys), with mean ``mu_s`` and variance ``var_s`` estimated from its ``D`` draws. The null of
    the mean then has mean ``mean_s mu_s`` and variance ``sum_s var_s / n^2``; with ``mu_s``
    estimated from ``D`` draws, ``statistic - null_mean`` has variance ``(1 + 1/D) sum_s var_s /
    n^2`` under the null (``v_s`` is exchangeable with the draws), which is the reported
    ``null_sd^2``. Cost: ``D`` draws per sequence serve any number of sequences; the
    number of distinct draws of the mean grows as ``(D + 1)^n``.

    The draws may cover a uniform random sample of ``m`` of the ``n`` sequences (``n_seqs = n``
    larger than ``m``; the sample's ``seq_observed`` then required): ``null_mean`` is the sample's
    mean of ``mu_s`` and ``null_sd^2 = w / n + (1 - m/n) b / m + w / (D m)``, with ``w`` the mean
    per-sequence null variance and ``b`` the between-sequence variance of ``mu_s`` (the sample
    variance of the estimated ``mu_s`` less ``w / D``, at least 0): the null's variance plus the
    errors of sampling sequences and draws. With ``m = n`` it is the formula above.

    The empirical p-value uses ``draws`` draws of the mean, each picking for every sampled
    sequence one of its ``D`` null values or, with ``seq_observed``, one of ``D + 1`` values
    including the observed one (the other sequences keep their observed value): under the null
    the observed value is exchangeable with its sequence's draws, so the statistic is itself one
    such pick and the Monte-Carlo p-value is exact (a randomisation test conditional on each
    sampled sequence's ``D + 1`` values).

    Parameters
    ----------
    statistic : array_like, shape (...)
        The mean over sequences (NaN: no test).
    seq_null : array_like, shape (..., m, D)
        Per-sequence null draws, ``D >= 2``; a sequence whose draws are NaN is left out.
    seq_observed : array_like, shape (..., m), optional
        The values of the same sequences whose mean (with the unsampled ones) is ``statistic``.
    n_seqs : int or array_like of int, shape (...), optional
        Sequences in the statistic (default: the finite sequences of ``seq_null``, ``m``).
    draws : int, default 200
        Draws of the mean for the empirical p-value.
    seed : int or numpy.random.Generator

    Returns
    -------
    NullTest
        ``p_method = "clt_normal"``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> null = rng.normal(0.0, 1.0, (400, 4))          # 400 sequences, 4 null draws each
    >>> t = clt_mean_test(0.5, null)                   # a shift of 0.5 sd per sequence
    >>> bool(t.z > 8 and t.p_value < 1e-15 and t.p_at_floor)
    True
    """
    v = np.asarray(seq_null, dtype=np.float64)
    if v.ndim < 2 or v.shape[-1] < 2:
        raise StatsError(f"seq_null must have shape (..., n_seq, D) with D >= 2 draws per "
                         f"sequence, got {v.shape}")
    if draws < 1:
        raise StatsError(f"draws must be a positive integer, got {draws!r}")
    s = np.asarray(statistic, dtype=np.float64)
    if s.shape != v.shape[:-2]:
        raise StatsError(f"seq_null must have shape statistic.shape + (n_seq, D) = {s.shape} + "
                         f"(n_seq, D), got {v.shape}")
    D = v.shape[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN heads stay NaN
        mu = np.nanmean(v, axis=-1)
        var = np.nanvar(v, axis=-1, ddof=1)
        m = np.isfinite(mu).sum(-1)
        n = m if n_seqs is None else np.broadcast_to(np.asarray(n_seqs), s.shape)
        if np.any(n < m):
            raise StatsError("n_seqs must be at least the number of sequences with null draws")
        if seq_observed is None and np.any(n > m):
            raise StatsError("seq_observed is required when the null draws cover a sample of "
                             "the sequences (n_seqs larger than the sequences of seq_null)")
        null_mean = np.nanmean(mu, axis=-1)
        w = np.nanmean(var, axis=-1)
        b = np.maximum(np.nanvar(mu, axis=-1, ddof=1) - w / D, 0.0) if v.shape[-2] > 1 else 0.0
        b = np.where(n > m, b, 0.0)
        null_sd = np.sqrt(w / n + (1.0 - m / n) * b / m + w / (D * m))
    rng = np.random.default_rng(seed) if not isinstance(seed, np.random.Generator) else seed
    if seq_observed is None:
        pick = rng.integers(0, D, size=(draws,) + v.shape[:-1])
        picked = np.take_along_axis(v[None], pick[..., None], axis=-1)[..., 0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            head_null = np.nanmean(picked, axis=-1)  # (draws, ...)
    else:
        obs = np.asarray(seq_observed, dtype=np.float64)
        if obs.shape != v.shape[:-1]:
            raise StatsError(f"seq_observed must have shape {v.shape[:-1]}, got {obs.shape}")
        choices = np.concatenate([obs[..., None], v], axis=-1)
        pick = rng.integers(0, D + 1, size=(draws,) + choices.shape[:-1])
        picked = np.take_along_axis(choices[None], pick[..., None], axis=-1)[..., 0]
        # the unsampled sequences keep their observed values: shift the statistic by the
        # sampled sequences' change
        head_null = s + np.nansum(picked - obs, axis=-1) / n
    return _null_test(s, null_mean, null_sd, head_null, "clt_normal")


def pooled_clt_mean_test(statistic, pool, n_seqs, *, draws: int = 200, seed=0) -> NullTest:
    """Test a mean over ``n_seqs`` sequences whose null is one shared per-sequence distribution.

    For a null that depends only on the shape (the Gauss null of docs/metrics.md §2), every sequence
    has the same null distribution, sampled once as ``pool`` (``M`` draws). The mean of ``n``
    sequences then has null mean ``mean(pool)`` and, counting the pool's own Monte-Carlo error,
    ``null_sd = sd(pool) sqrt(1/n + 1/M)`` (``clt_normal``). The empirical p-value uses ``draws``
    means of ``n`` values resampled from the pool.

    Parameters
    ----------
    statistic : array_like, shape (...)
    pool : array_like, shape (M,)
        Per-sequence null draws, ``M >= 2``.
    n_seqs : int or array_like of int, broadcastable to the statistic's shape
        Sequences averaged in each statistic.
    draws : int, default 200
    seed : int or numpy.random.Generator

    Returns
    -------
    NullTest
        ``p_method = "clt_normal"``.

    Examples
    --------
    A pool with mean 0.3 and sd 0.1; a mean of 100 sequences has null sd ~0.01:

    >>> t = pooled_clt_mean_test([0.3, 0.33], np.tile([0.2, 0.4], 2000), 100)
    >>> t.z.round(2).tolist()
    [0.0, 2.96]
    """
    pool = np.asarray(pool, dtype=np.float64).ravel()
    pool = pool[np.isfinite(pool)]
    if pool.size < 2:
        raise StatsError(f"pool must hold at least 2 finite null draws, got {pool.size}")
    if draws < 1:
        raise StatsError(f"draws must be a positive integer, got {draws!r}")
    s = np.asarray(statistic, dtype=np.float64)
    n = np.broadcast_to(np.asarray(n_seqs, dtype=np.int64), s.shape)
    M = pool.size
    with np.errstate(invalid="ignore", divide="ignore"):
        null_sd = pool.std(ddof=1) * np.sqrt(1.0 / n + 1.0 / M)
    rng = np.random.default_rng(seed) if not isinstance(seed, np.random.Generator) else seed
    head_null = np.full((draws,) + s.shape, np.nan)
    for m in np.unique(n[n > 0]):
        means = pool[rng.integers(0, M, size=(draws, int(m)))].mean(-1)
        head_null[:, n == m] = means[:, None]
    return _null_test(s, pool.mean(), np.where(n > 0, null_sd, np.nan), head_null, "clt_normal")


def normal_fit_test(statistic, null) -> NullTest:
    """Test a statistic against draws of its own null by a fitted normal (``normal_fit``).

    ``null_mean`` and ``sd`` are the mean and sd (ddof 1) of the ``B`` draws; ``null_sd = sd
    sqrt(1 + 1/B)`` counts the error of the estimated mean.

    Parameters
    ----------
    statistic : array_like, shape (...)
    null : array_like, shape (draws, ...)
        ``draws >= 2``.

    Returns
    -------
    NullTest

    Examples
    --------
    >>> t = normal_fit_test(3.0, np.tile([-1.0, 1.0], 500))   # mean 0, sd ~1
    >>> round(float(t.z), 3), t.p_method, bool(t.p_at_floor)
    (2.997, 'normal_fit', True)
    """
    z = np.asarray(null, dtype=np.float64)
    if z.ndim == 0 or z.shape[0] < 2:
        raise StatsError(f"null must have at least 2 draws on axis 0, got shape {z.shape}")
    B = z.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, sd = np.nanmean(z, axis=0), np.nanstd(z, axis=0, ddof=1) * np.sqrt(1.0 + 1.0 / B)
    return _null_test(statistic, mean, sd, z, "normal_fit")


def adjust_p_values(p_values, method: str = "bh") -> np.ndarray:
    """Adjust p-values for multiple comparisons across heads (docs/metrics.md §8).

    Parameters
    ----------
    p_values : array_like, any shape
        NaNs are left out of the family and stay NaN.
    method : {"bh", "holm"}, default "bh"
        Benjamini-Hochberg FDR (statsmodels ``fdr_bh``) or Holm FWER (``holm``).

    Returns
    -------
    ndarray, same shape
        Adjusted p-values (q-values for "bh").

    Examples
    --------
    >>> adjust_p_values([0.01, 0.02, 0.03, 0.5]).round(4).tolist()
    [0.04, 0.04, 0.04, 0.5]
    >>> adjust_p_values([0.01, 0.02, 0.03, 0.5], method="holm").round(4).tolist()
    [0.04, 0.06, 0.06, 0.5]
    """
    if method not in P_ADJUST_METHODS:
        raise StatsError(
            f"unknown p-value adjustment {method!r}; choose one of {sorted(P_ADJUST_METHODS)}"
        )
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method=P_ADJUST_METHODS[method])[1]
    return out


class Correlation(NamedTuple):
    """A correlation coefficient and its two-sided p-value."""

    r: float
    p_value: float


def _paired(x, y) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise StatsError(f"x and y must have the same number of values, got {a.size} and {b.size}")
    ok = np.isfinite(a) & np.isfinite(b)
    return a[ok], b[ok]


def _correlate(fn, x, y) -> Correlation:
    a, b = _paired(x, y)
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return Correlation(np.nan, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fn(a, b)
    return Correlation(float(res.statistic), float(res.pvalue))


def pearson(x, y) -> Correlation:
    """Pearson r with its two-sided p-value (:func:`scipy.stats.pearsonr`), NaN pairs dropped.

    Used for ``r_cv_share`` (docs/metrics.md §3): over all (layer, head) pairs, key-norm CV vs
    ``max_share`` ("All Routes Lead to Collapse", Table 1, column r_cv,sh).

    Parameters
    ----------
    x, y : array_like, same size (flattened)

    Returns
    -------
    Correlation
        ``(r, p_value)``; NaN when fewer than 3 finite pairs remain or either side is constant.

    Examples
    --------
    >>> pearson([1, 2, 3, 4], [2, 4, 6, 8]).r
    1.0
    """
    return _correlate(sps.pearsonr, x, y)


def spearman(x, y) -> Correlation:
    """Spearman rank correlation with its two-sided p-value (:func:`scipy.stats.spearmanr`).

    Examples
    --------
    >>> spearman([1, 2, 3, 4], [1, 8, 27, 64]).r
    1.0
    """
    return _correlate(sps.spearmanr, x, y)


def _pearson_along(x, y, axis=-1):
    xc = x - x.mean(axis=axis, keepdims=True)
    yc = y - y.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (xc * yc).sum(axis) / np.sqrt((xc * xc).sum(axis) * (yc * yc).sum(axis))


def _spearman_along(x, y, axis=-1):
    return _pearson_along(sps.rankdata(x, axis=axis), sps.rankdata(y, axis=axis), axis=axis)


_CI_STATISTICS = {"pearson": _pearson_along, "spearman": _spearman_along}


def bootstrap_ci(x, y, *, statistic: str = "pearson", confidence: float = 0.95,
                 n_resamples: int = 2000, seed: int = 0, method: str = "BCa") -> tuple[float, float]:
    """Bootstrap confidence interval of a correlation, resampling (x, y) pairs (heads).

    Wraps :func:`scipy.stats.bootstrap` with ``paired=True``: each resample draws (layer, head)
    pairs with replacement, as docs/metrics.md §3 asks of ``r_cv_share``.

    Parameters
    ----------
    x, y : array_like, same size
    statistic : {"pearson", "spearman"}, default "pearson"
    confidence : float, default 0.95
    n_resamples : int, default 2000
    seed : int, default 0
    method : {"BCa", "percentile", "basic"}, default "BCa"

    Returns
    -------
    (float, float)
        Lower and upper bound; NaN when the correlation is undefined.

    Examples
    --------
    >>> x = np.arange(20.0)
    >>> y = x + np.tile([3.0, -3.0], 10)
    >>> lo, hi = bootstrap_ci(x, y)
    >>> bool(lo < pearson(x, y).r < hi <= 1.0)
    True
    """
    if statistic not in _CI_STATISTICS:
        raise StatsError(f"unknown statistic {statistic!r}; choose one of {sorted(_CI_STATISTICS)}")
    a, b = _paired(x, y)
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return (np.nan, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sps.bootstrap((a, b), _CI_STATISTICS[statistic], paired=True, vectorized=True,
                            confidence_level=confidence, n_resamples=n_resamples,
                            method=method, rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    return (float(ci.low), float(ci.high))
