"""Attention concentration and the onset of collapse (docs/metrics.md §3).

"All Routes Lead to Collapse", Table 1, columns *onset* and (through ``max_share``) *r_cv,sh*.
These are the numpy reference implementations over attention probabilities; the catalog computes
the same aggregates in SQL from ``row_stats`` / ``col_stats`` (:mod:`attnbase.stats.queries`),
and tests hold the two to parity.

Shapes: attention ``(..., seq, query, key)``, rows summing to 1 over their unmasked keys (masked
entries 0; a causal row ``i`` has ``i + 1`` keys, an encoder row all ``T``); statistics reduce
``seq, query, key`` and return ``(...)``, e.g. ``(layer, head)`` for a full tensor.
Key 0 is the sink position.
"""

from __future__ import annotations

import numpy as np

from attnbase.contract import DEFAULT_SINK, sink_keys, sink_set
from attnbase.errors import StatsError

__all__ = [
    "sink_mass",
    "mean_sink_mass",
    "max_share",
    "max_share_excl_sink",
    "max_share_q4",
    "max_share_excl_sink_q4",
    "row_max_share",
    "onset_layer",
    "onset_depth",
]


def _as_attn(attn) -> np.ndarray:
    a = np.asarray(attn, dtype=np.float64)
    if a.ndim < 3:
        raise StatsError(
            f"attention must have shape (..., seq, query, key), got shape {a.shape}; "
            "add a leading seq axis with attn[None] for a single sequence"
        )
    return a


def sink_mass(attn, sink=DEFAULT_SINK) -> np.ndarray:
    """Attention each row gives the sink, ``A[i, 0]`` (docs/metrics.md §3), or with a sink set
    S (docs/metrics.md "Sink sets") ``sum_{j in S} A[i, j]``.

    Parameters
    ----------
    attn : array_like, shape (..., query, key)

    Returns
    -------
    ndarray, shape (..., query)

    Examples
    --------
    >>> sink_mass([[1.0, 0.0], [0.5, 0.5]]).tolist()
    [1.0, 0.5]

    [CLS] and two registers (positions 0, 1, 2) of a row:

    >>> sink_mass([[0.4, 0.1, 0.2, 0.3]], sink=(0, 1, 2)).round(12).tolist()
    [0.7]
    """
    a = np.asarray(attn, dtype=np.float64)
    if sink_set(sink) != DEFAULT_SINK:
        return a[..., sink_keys(sink, a.shape[-1])].sum(-1)
    return a[..., 0]


def mean_sink_mass(attn, sink=DEFAULT_SINK) -> np.ndarray:
    """Mean of :func:`sink_mass` over sequences and every query row (causal row 0 included).

    Parameters
    ----------
    attn : array_like, shape (..., seq, query, key)

    Returns
    -------
    ndarray, shape (...)
        In [0, 1].

    Examples
    --------
    >>> float(mean_sink_mass([[[1.0, 0.0], [0.5, 0.5]]]))
    0.75
    """
    return sink_mass(_as_attn(attn), sink).mean(axis=(-2, -1))


def max_share(attn) -> np.ndarray:
    """Column share of the most-attended key position (docs/metrics.md §3, the default ``max_share``).

    ``max_j mean_{s,i} A[s, i, j]``: the share of all attention (every query row of every
    sequence) received by the single most-attended position. "All Routes Lead to Collapse" uses
    its layer mean for the onset of collapse. In the catalog: ``max_key sum_seq received /
    sum_seq n_query_rows`` over ``col_stats`` / ``row_stats``.

    Parameters
    ----------
    attn : array_like, shape (..., seq, query, key)

    Returns
    -------
    ndarray, shape (...)
        In [1/T, 1] for T keys (encoders) and [H_T / T, 1] for causal rows.

    Examples
    --------
    Uniform causal attention over T = 128 tokens: key 0 receives ``sum_i 1/(i+1) = H_128`` of the
    128 rows, ``H_128 / 128 = 0.04245`` (docs/metrics.md §3):

    >>> T = 128
    >>> A = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    >>> round(float(max_share(A[None])), 5)
    0.04245
    """
    a = _as_attn(attn)
    return a.mean(axis=(-3, -2)).max(axis=-1)


def _column_share(a: np.ndarray, first_key: int, min_query: int) -> np.ndarray:
    if not 0 <= min_query < a.shape[-2]:
        raise StatsError(
            f"min_query={min_query} leaves no query rows of {a.shape[-2]}; use 0 <= min_query < T"
        )
    if a.shape[-1] <= first_key:
        raise StatsError(f"attention has {a.shape[-1]} keys; this statistic needs > {first_key}")
    return a[..., min_query:, :].mean(axis=(-3, -2))[..., first_key:].max(axis=-1)


def max_share_excl_sink(attn) -> np.ndarray:
    """:func:`max_share` over key positions ``j >= 1`` only (the sink left out; docs/metrics.md §3).

    ``max_{j>=1} mean_{s,i} A[s, i, j]``, **not renormalised**: the share of *all* attention
    (every row still sums to 1 over every key, sink included) that the most-attended non-sink
    position receives. A head parking most attention on key 0 therefore gets a small value,
    as it would from a reader who ignores the sink column of the attention map.

    Parameters
    ----------
    attn : array_like, shape (..., seq, query, key), key >= 2

    Returns
    -------
    ndarray, shape (...)
        In [0, 1].

    Examples
    --------
    Every row puts 0.9 on the sink and 0.1 on key 1: the sink column is left out.

    >>> A = np.array([[[1.0, 0.0], [0.9, 0.1]]])
    >>> float(max_share(A)), round(float(max_share_excl_sink(A)), 6)
    (0.95, 0.05)
    """
    return _column_share(_as_attn(attn), 1, 0)


def max_share_q4(attn, min_query: int = 4) -> np.ndarray:
    """:func:`max_share` over query rows ``i >= min_query`` only (docs/metrics.md §3 variant).

    ``max_j mean_{s, i >= min_query} A[s, i, j]``: the first causal rows, which have at most
    ``min_query`` keys and so must concentrate, do not enter the mean.

    Parameters
    ----------
    attn : array_like, shape (..., seq, query, key)
    min_query : int, default 4

    Returns
    -------
    ndarray, shape (...)
        In [0, 1]. Uniform causal attention at T = 128: ``(H_128 - H_4) / 124 = 0.027015``.

    Examples
    --------
    >>> T = 128
    >>> A = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    >>> round(float(max_share_q4(A[None])), 6)
    0.027015
    """
    return _column_share(_as_attn(attn), 0, min_query)


def max_share_excl_sink_q4(attn, min_query: int = 4) -> np.ndarray:
    """Both conventions at once: keys ``j >= 1`` (not renormalised) of query rows
    ``i >= min_query`` (:func:`max_share_excl_sink`, :func:`max_share_q4`; docs/metrics.md §3).

    Examples
    --------
    Uniform causal attention: key 1 receives ``sum_{i>=4} 1/(i+1)`` of the 124 rows, as key 0.

    >>> T = 128
    >>> A = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    >>> round(float(max_share_excl_sink_q4(A[None])), 6)
    0.027015
    """
    return _column_share(_as_attn(attn), 1, min_query)


def row_max_share(attn, min_query: int = 4) -> np.ndarray:
    """Mean over query rows ``i >= min_query`` of the row maximum ``max_j A[i, j]`` (§3 variant).

    Parameters
    ----------
    attn : array_like, shape (..., seq, query, key)
    min_query : int, default 4
        First query row that counts (docs/metrics.md: "over queries i >= 4 only"); early causal rows
        have so few keys that their maximum is large whatever the head does.

    Returns
    -------
    ndarray, shape (...)
        In (0, 1].

    Notes
    -----
    docs/metrics.md §3 states that uniform causal attention at T = 128 gives 0.04245 "under both"
    definitions. That holds for ``max_share`` and for ``row_max_share`` with ``min_query=0``
    (``H_128 / 128``), but not for the spec's own default ``min_query=4``: rows ``i = 4..127``
    have maximum ``1 / (i + 1)``, so the value is ``(H_128 - H_4) / 124 = 0.027015`` (the brief of this stage quoted 0.02702;
    the exact value rounds to 0.02701). This function
    implements the definition (default ``min_query=4``); the tests check both closed forms.

    Examples
    --------
    >>> T = 128
    >>> A = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    >>> round(float(row_max_share(A[None])), 6), round(float(row_max_share(A[None], 0)), 6)
    (0.027015, 0.042446)
    """
    a = _as_attn(attn)
    if not 0 <= min_query < a.shape[-2]:
        raise StatsError(
            f"min_query={min_query} leaves no query rows of {a.shape[-2]}; use 0 <= min_query < T"
        )
    return a[..., min_query:, :].max(axis=-1).mean(axis=(-2, -1))


def onset_layer(profile, threshold: float = 0.20) -> int | None:
    """First layer whose mean-over-heads ``max_share`` exceeds ``threshold`` (docs/metrics.md §3).

    "All Routes Lead to Collapse", Table 1, column *onset* (GPT-2 small: layer 2 of 12).

    Parameters
    ----------
    profile : array_like, shape (layer,) or (layer, head)
        ``max_share`` per layer, or per (layer, head) (then averaged over heads).
    threshold : float, default 0.20
        Strict: a layer at exactly the threshold is not an onset.

    Returns
    -------
    int or None
        0-based layer index; None when no layer exceeds the threshold.

    Examples
    --------
    >>> onset_layer([0.05, 0.1, 0.35, 0.5])
    2
    >>> onset_layer([0.05, 0.2]) is None
    True
    """
    p = np.asarray(profile, dtype=np.float64)
    if p.ndim == 2:
        p = p.mean(axis=1)
    if p.ndim != 1:
        raise StatsError(f"profile must have shape (layer,) or (layer, head), got {p.shape}")
    hits = np.flatnonzero(p > threshold)
    return int(hits[0]) if hits.size else None


def onset_depth(layer: int | None, n_layers: int) -> float | None:
    """Onset as a fraction of depth, ``onset_layer / n_layers`` (None stays None).

    Examples
    --------
    >>> round(onset_depth(2, 12), 3)
    0.167
    """
    if n_layers < 1:
        raise StatsError(f"n_layers must be positive, got {n_layers!r}")
    return None if layer is None else layer / n_layers
