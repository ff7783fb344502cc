"""Norm stratification of keys (docs/metrics.md §1).

"All Routes Lead to Collapse", Table 1, column *norm-CV*: the coefficient of variation of key
norms within one (layer, head), pooled over every sequence and token, against the value an
isotropic Gaussian key of the same dimension would give, ``1 / sqrt(2 d_head)``.

Shapes: the statistics take keys ``(..., seq, pos, d_head)`` and reduce the last three axes, so a
layer's block ``(kv_head, seq, pos, d_head)`` gives one value per kv head. Keys are the pre-RoPE
keys (RoPE is a rotation, so norms are the same either way).
"""

from __future__ import annotations

import numpy as np

from attnbase.contract import DEFAULT_SINK, content_keys
from attnbase.errors import StatsError

__all__ = [
    "key_norms",
    "key_norm_cv",
    "key_norm_cv_excl_sink",
    "isotropic_norm_cv",
]


def _as_keys(keys, min_pos: int = 1) -> np.ndarray:
    k = np.asarray(keys)
    if k.ndim < 3:
        raise StatsError(
            f"keys must have shape (..., seq, pos, d_head), got shape {k.shape}; "
            "add a leading seq axis with keys[None] for a single sequence"
        )
    if k.shape[-2] < min_pos:
        raise StatsError(f"keys have {k.shape[-2]} positions; this statistic needs >= {min_pos}")
    return k


def key_norms(keys) -> np.ndarray:
    """Euclidean norm of every key vector.

    Parameters
    ----------
    keys : array_like, shape (..., d_head)

    Returns
    -------
    ndarray, shape (...)
        ``||k||_2`` in float64.

    Examples
    --------
    >>> key_norms([[3.0, 4.0], [0.0, 1.0]])
    array([5., 1.])
    """
    k = np.asarray(keys, dtype=np.float64)
    return np.sqrt(np.einsum("...d,...d->...", k, k))


def _cv(norms: np.ndarray) -> np.ndarray:
    flat = norms.reshape(norms.shape[:-2] + (-1,))
    mean = flat.mean(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return flat.std(-1) / mean


def key_norm_cv(keys) -> np.ndarray:
    """Coefficient of variation of key norms, pooled over sequences and tokens (docs/metrics.md §1).

    ``std / mean`` (population std, ``ddof=0``) of ``||k_{s,t}||_2`` over all sequences ``s`` and
    positions ``t``, token 0 included (the default of "All Routes Lead to Collapse", Table 1).

    Parameters
    ----------
    keys : array_like, shape (..., seq, pos, d_head)
        Pre-RoPE keys; e.g. one layer's block ``(kv_head, seq, pos, d_head)``.

    Returns
    -------
    ndarray, shape (...)
        One CV per leading index (per kv head for a layer block). NaN when every key is zero.

    See Also
    --------
    key_norm_cv_excl_sink : the same without the sink positions (token 0, or a sink set).
    isotropic_norm_cv : the Gaussian baseline ``1 / sqrt(2 d_head)``.

    Examples
    --------
    Norms 1, 1, 1, 3 (mean 1.5, std sqrt(0.75)):

    >>> k = [[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, 3.0]]]
    >>> round(float(key_norm_cv(k)), 6)
    0.57735
    """
    return _cv(key_norms(_as_keys(keys)))


def key_norm_cv_excl_sink(keys, sink=DEFAULT_SINK) -> np.ndarray:
    """:func:`key_norm_cv` with the sink position (token 0 of every sequence; every position of
    a sink set) left out.

    Parameters
    ----------
    keys : array_like, shape (..., seq, pos, d_head), pos >= 2

    Returns
    -------
    ndarray, shape (...)

    Examples
    --------
    A large sink key does not count:

    >>> k = [[[9.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, 1.0]]]
    >>> float(key_norm_cv_excl_sink(k))
    0.0
    """
    k = _as_keys(keys, min_pos=2)
    return _cv(key_norms(k[..., content_keys(sink, k.shape[-2]), :]))


def isotropic_norm_cv(d_head: int) -> float:
    """Key-norm CV of isotropic Gaussian keys, ``1 / sqrt(2 d_head)`` (docs/metrics.md §1).

    For ``k ~ N(0, sigma^2 I_d)``, ``||k||^2 / sigma^2`` is chi-square with ``d`` degrees of freedom,
    so ``Var ||k|| ~ sigma^2 / 2`` and ``E ||k|| ~ sigma sqrt(d)``: the CV tends to ``1 / sqrt(2 d)``
    (within 0.5% already at d = 16). The "Gauss baseline" of the norm-CV column of
    "All Routes Lead to Collapse", Table 1.

    Parameters
    ----------
    d_head : int

    Returns
    -------
    float

    Examples
    --------
    >>> round(isotropic_norm_cv(64), 4), round(isotropic_norm_cv(128), 4)
    (0.0884, 0.0625)
    """
    if d_head < 1:
        raise StatsError(f"d_head must be a positive integer, got {d_head!r}")
    return float(1.0 / np.sqrt(2.0 * d_head))
