"""Inference conventions: empirical p-values, multiple comparisons, correlations (METRICS.md §8).

Every null comparison reports the statistic, the null mean and spread, the draws, the seed and
the one-sided empirical p-value ``(1 + #{null >= stat}) / (1 + draws)`` (Davison & Hinkley 1997,
eq. 4.11: never 0, exact under exchangeability). Corrections over heads use statsmodels'
``multipletests`` (Benjamini-Hochberg by default, Holm available); correlations use scipy.stats;
bootstrap intervals resample (layer, head) pairs with :func:`scipy.stats.bootstrap`.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from attnbase.errors import StatsError

__all__ = [
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
    """One-sided empirical p-value ``(1 + #{null >= stat}) / (1 + draws)`` (METRICS.md §8).

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


def adjust_p_values(p_values, method: str = "bh") -> np.ndarray:
    """Adjust p-values for multiple comparisons across heads (METRICS.md §8).

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

    Used for ``r_cv_share`` (METRICS.md §3): over all (layer, head) pairs, key-norm CV vs
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
    pairs with replacement, as METRICS.md §3 asks of ``r_cv_share``.

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
