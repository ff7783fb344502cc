"""Attention rows as compositional data: Aitchison geometry of one row (docs/metrics.md §4).

Papamichalis & Ruane, "Attention Rows as Compositional Data"; Aitchison, *The Statistical Analysis
of Compositional Data* (1986). Every function works on the unmasked prefix of each row.

Input convention: a row is given by its scaled pre-softmax logits ``z`` of shape ``(..., key)``
with masked entries ``-inf`` (the catalog's ``attn_logits``). Key 0 is the sink. Since
``clr(softmax(z)) = z - mean(z)`` exactly on the prefix, no zero replacement is ever needed for
stored runs. Rows that exist only as probabilities (imports from other tools) go through
:func:`logits_from_probs`, which applies multiplicative replacement (Martin-Fernandez et al. 2003,
``delta = 1e-12``) and returns a per-row flag saying whether any zero was replaced.

All arithmetic is float64. Quantities undefined for short rows are NaN: the sink balance needs
``n >= 2`` unmasked keys, the content geometry (``pi = p_{1:} / (1 - p_0)``) ``n >= 3``.

Examples (the docs/metrics.md §4 reference rows p = (.6,.2,.1,.1), q = (.3,.3,.2,.2)):

>>> import numpy as np
>>> zp, zq = np.log([.6, .2, .1, .1]), np.log([.3, .3, .2, .2])
>>> round(float(sink_balance(zp)), 6), round(float(sink_balance(zq)), 6)
(1.351615, 0.234095)
>>> round(float(aitchison_distance(zp, zq)), 6), round(float(aitchison_perp_distance(zp, zq)), 6)
(1.141939, 0.234891)
>>> round(float(content_dispersion(zp)), 6), round(float(entropy(zp)), 6)
(0.565952, 1.0889)
>>> round(float(binary_entropy(0.6)), 6)
0.673012
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnbase.contract import DEFAULT_SINK, content_keys, sink_keys, sink_set
from attnbase.errors import StatsError

__all__ = [
    "closure",
    "clr",
    "multiplicative_replacement",
    "logits_from_probs",
    "clr_from_logits",
    "sink_balance",
    "content_dispersion",
    "aitchison_distance",
    "aitchison_perp_distance",
    "entropy",
    "binary_entropy",
    "content_entropy",
    "sink_mass_from_logits",
    "EntropyChange",
    "entropy_change",
]

#: Default multiplicative-replacement value for zeros in rows imported as probabilities.
DEFAULT_DELTA = 1e-12


def _logits(z) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(z float64, keep mask, n unmasked)``; NaN or +inf logits are refused."""
    z = np.asarray(z, dtype=np.float64)
    if z.ndim == 0:
        raise StatsError("a row of logits needs a key axis; got a scalar")
    if np.isnan(z).any() or np.isposinf(z).any():
        raise StatsError("logits contain NaN or +inf; masked keys must be -inf, data finite")
    keep = np.isfinite(z)
    return z, keep, keep.sum(-1)


def _masked_mean(z: np.ndarray, keep: np.ndarray) -> np.ndarray:
    n = keep.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(keep, z, 0.0).sum(-1) / n


def closure(x) -> np.ndarray:
    """Rescale positive parts ``(..., part)`` to sum to 1 (the closure operator C).

    Examples
    --------
    >>> closure([2.0, 1.0, 1.0]).tolist()
    [0.5, 0.25, 0.25]
    """
    x = np.asarray(x, dtype=np.float64)
    if (x < 0).any():
        raise StatsError("closure needs non-negative parts; got a negative entry")
    return x / x.sum(-1, keepdims=True)


def clr(p) -> np.ndarray:
    """Centred log-ratio ``clr(p)_j = ln p_j - mean_k ln p_k`` of strictly positive rows ``(..., part)``.

    Zeros have no logarithm: pass rows with zeros through :func:`multiplicative_replacement`
    first (stored runs never need it: use :func:`clr_from_logits`).

    Examples
    --------
    >>> np.round(clr([0.5, 0.25, 0.25]), 6).tolist()
    [0.462098, -0.231049, -0.231049]
    """
    p = np.asarray(p, dtype=np.float64)
    if (p <= 0).any():
        raise StatsError("clr needs strictly positive parts; replace zeros with "
                         "multiplicative_replacement(p) (rows imported as probabilities)")
    lp = np.log(p)
    return lp - lp.mean(-1, keepdims=True)


def multiplicative_replacement(p, delta: float = DEFAULT_DELTA) -> tuple[np.ndarray, np.ndarray]:
    """Replace zeros of closed rows ``(..., part)`` by ``delta`` and shrink the rest multiplicatively.

    Returns ``(replaced rows, flagged)`` where ``flagged (...)`` is True for rows that had a zero.
    Non-zero parts keep their ratios (Martin-Fernandez, Barcelo-Vidal & Pawlowsky-Glahn 2003).

    Examples
    --------
    >>> r, flag = multiplicative_replacement([0.5, 0.5, 0.0], delta=0.01)
    >>> r.tolist(), bool(flag)
    ([0.495, 0.495, 0.01], True)
    """
    p = closure(p)
    zero = p == 0
    k = zero.sum(-1, keepdims=True)
    if (k * delta >= 1).any():
        raise StatsError(f"delta={delta} times the number of zeros reaches 1; use a smaller delta")
    out = np.where(zero, delta, p * (1.0 - k * delta))
    return out, zero.any(-1)


def logits_from_probs(p, n_keys=None, delta: float = DEFAULT_DELTA) -> tuple[np.ndarray, np.ndarray]:
    """Rows given as probabilities ``(..., key)`` -> ``(logits with -inf masked, flagged (...))``.

    ``n_keys (...)`` gives each row's unmasked prefix length (default: the whole row); zeros inside
    the prefix are data zeros and get multiplicative replacement; ``flagged`` says which rows did.

    Examples
    --------
    >>> z, flag = logits_from_probs([[0.6, 0.4, 0.0]], n_keys=[2])
    >>> np.round(np.exp(z), 6).tolist(), flag.tolist()
    ([[0.6, 0.4, 0.0]], [False])
    """
    p = np.asarray(p, dtype=np.float64)
    n = p.shape[-1] if n_keys is None else np.asarray(n_keys)
    keep = np.arange(p.shape[-1]) < np.expand_dims(n, -1)
    prefix = np.where(keep, p, 0.0)
    s = prefix.sum(-1, keepdims=True)
    if (s <= 0).any():
        raise StatsError("a probability row has no mass on its unmasked prefix")
    closed = prefix / s
    zero = keep & (closed == 0)
    k = zero.sum(-1, keepdims=True)
    repl = np.where(zero, delta, closed * (1.0 - k * delta))
    with np.errstate(divide="ignore"):
        z = np.where(keep, np.log(np.where(keep, repl, 1.0)), -np.inf)
    return z, zero.any(-1)


def clr_from_logits(z) -> np.ndarray:
    """``clr(softmax(z)) = z - mean(z)`` over each row's unmasked prefix; masked entries 0.

    Zero-filling embeds every prefix in R^key, so dot products and norms of the returned rows are
    those of the clr vectors (what the head-distance Gram matrices use).

    Examples
    --------
    >>> np.round(clr_from_logits([1.0, 2.0, -np.inf]), 6).tolist()
    [-0.5, 0.5, 0.0]
    """
    z, keep, _ = _logits(z)
    mean = _masked_mean(z, keep)
    return np.where(keep, z - np.expand_dims(mean, -1), 0.0)


def sink_balance(z, sink=DEFAULT_SINK) -> np.ndarray:
    """``b(p) = sqrt((n-1)/n) (ln p_0 - mean_{j>=1} ln p_j)`` per row ``(..., key)`` -> ``(...)``.

    The isometric log-ratio balance of the sink against the content (docs/metrics.md §4); NaN for n < 2.
    With a sink set S (docs/metrics.md "Sink sets") the balance between the groups S and C:
    ``sqrt(|S||C| / (|S| + |C|)) (mean_{j in S} ln p_j - mean_{j in C} ln p_j)``.

    Examples
    --------
    >>> round(float(sink_balance(np.log([.6, .2, .1, .1]))), 6)
    1.351615

    [CLS] and one register hold 0.3 + 0.3 against a uniform content of 0.2 + 0.2:
    ``sqrt(2 * 2 / 4) * (ln 0.3 - ln 0.2)``

    >>> round(float(sink_balance(np.log([.3, .3, .2, .2]), sink=(0, 1))), 6)
    0.405465
    """
    z, keep, n = _logits(z)
    if sink_set(sink) != DEFAULT_SINK:
        si, ci = sink_keys(sink, z.shape[-1]), content_keys(sink, z.shape[-1])
        ns, nc = keep[..., si].sum(-1), keep[..., ci].sum(-1)
        mean_s = _masked_mean(z[..., si], keep[..., si])
        mean_c = _masked_mean(z[..., ci], keep[..., ci])
        with np.errstate(invalid="ignore"):
            b = np.sqrt(ns * nc / np.maximum(ns + nc, 1)) * (mean_s - mean_c)
        return np.where((ns >= 1) & (nc >= 1), b, np.nan)
    mean_c = _masked_mean(z[..., 1:], keep[..., 1:])
    with np.errstate(invalid="ignore"):
        b = np.sqrt(np.maximum(n - 1, 0) / np.maximum(n, 1)) * (z[..., 0] - mean_c)
    return np.where(n >= 2, b, np.nan)


def content_dispersion(z, sink=DEFAULT_SINK) -> np.ndarray:
    """``C_perp(p) = ||clr(pi)||_2``, pi the content composition (every key outside ``sink``);
    ``(..., key)`` -> ``(...)``, NaN for fewer than 2 content keys.

    Examples
    --------
    >>> round(float(content_dispersion(np.log([.6, .2, .1, .1]))), 6)
    0.565952
    """
    z, keep, n = _logits(z)
    ci = content_keys(sink, z.shape[-1])
    c = clr_from_logits(z[..., ci])
    return np.where(keep[..., ci].sum(-1) >= 2, np.sqrt((c * c).sum(-1)), np.nan)


def _same_support(z, w) -> tuple[np.ndarray, np.ndarray]:
    z, kz, _ = _logits(z)
    w, kw, _ = _logits(w)
    if z.shape[-1] != w.shape[-1] or not np.array_equal(*np.broadcast_arrays(kz, kw)):
        raise StatsError("Aitchison distance needs rows of equal length (the same unmasked keys); "
                         "compare rows at the same (seq, query) position")
    return z, w


def aitchison_distance(z, w) -> np.ndarray:
    """``d_A(p, q) = ||clr p - clr q||_2`` for rows of logits ``(..., key)`` -> ``(...)``.

    Examples
    --------
    >>> round(float(aitchison_distance(np.log([.6, .2, .1, .1]), np.log([.3, .3, .2, .2]))), 6)
    1.141939
    """
    z, w = _same_support(z, w)
    d = clr_from_logits(z) - clr_from_logits(w)
    return np.sqrt((d * d).sum(-1))


def aitchison_perp_distance(z, w, sink=DEFAULT_SINK) -> np.ndarray:
    """``d_A_perp(p, q) = d_A(pi_p, pi_q)``: the Aitchison distance of the content compositions.

    Invariant to the sink logit (hence to the sink mass): ``d_A^2 = (b_p - b_q)^2 + d_A_perp^2``.

    Examples
    --------
    >>> round(float(aitchison_perp_distance(np.log([.6, .2, .1, .1]), np.log([.3, .3, .2, .2]))), 6)
    0.234891
    """
    z, w = _same_support(z, w)
    ci = content_keys(sink, z.shape[-1])
    return aitchison_distance(z[..., ci], w[..., ci])


def entropy(z) -> np.ndarray:
    """Shannon entropy ``H(p)`` in nats of ``p = softmax(z)`` per row ``(..., key)`` -> ``(...)``.

    Examples
    --------
    >>> round(float(entropy(np.log([.6, .2, .1, .1]))), 6)
    1.0889
    """
    z, keep, _ = _logits(z)
    m = np.max(np.where(keep, z, -np.inf), axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):  # fully masked rows: H = 0
        logp = np.where(keep, z - m, 0.0) - np.log(np.where(keep, np.exp(z - m), 0.0)
                                                   .sum(-1, keepdims=True))
    return -np.where(keep, np.exp(logp) * logp, 0.0).sum(-1)


def binary_entropy(s) -> np.ndarray:
    """``H_b(s) = -s ln s - (1-s) ln(1-s)`` in nats (0 at s in {0, 1}).

    Examples
    --------
    >>> round(float(binary_entropy(0.5)), 6)
    0.693147
    """
    from scipy.special import xlogy

    s = np.asarray(s, dtype=np.float64)
    return -(xlogy(s, s) + xlogy(1.0 - s, 1.0 - s))


def content_entropy(z, sink=DEFAULT_SINK) -> np.ndarray:
    """``H(pi)``, pi = softmax of the content logits (keys outside ``sink``; ``z_{1:}`` for the
    default sink), per row -> ``(...)``; NaN for n < 2.

    Examples
    --------
    >>> round(float(content_entropy(np.log([.6, .2, .1, .1]))), 6)
    1.039721
    """
    z, keep, n = _logits(z)
    if sink_set(sink) != DEFAULT_SINK:
        ci = content_keys(sink, z.shape[-1])
        nc = keep[..., ci].sum(-1)
        return np.where(nc >= 1, entropy(z[..., ci]) if z[..., ci].shape[-1] else np.nan, np.nan)
    return np.where(n >= 2, entropy(z[..., 1:]) if z.shape[-1] > 1 else np.nan, np.nan)


def sink_mass_from_logits(z, sink=DEFAULT_SINK) -> np.ndarray:
    """``s = sum_{j in S} softmax(z)_j`` (``p_0`` for the default sink) per row ``(..., key)``
    -> ``(...)``.

    Examples
    --------
    >>> round(float(sink_mass_from_logits(np.log([.6, .2, .1, .1]))), 6)
    0.6
    >>> round(float(sink_mass_from_logits(np.log([.3, .2, .1, .25, .15]), sink=(0, 1))), 6)
    0.5
    """
    z, keep, _ = _logits(z)
    m = np.max(z, axis=-1, keepdims=True)
    e = np.where(keep, np.exp(z - m), 0.0)
    if sink_set(sink) != DEFAULT_SINK:
        return e[..., sink_keys(sink, z.shape[-1])].sum(-1) / e.sum(-1)
    return e[..., 0] / e.sum(-1)


@dataclass(frozen=True)
class EntropyChange:
    """The exact split of an entropy change a -> b (docs/metrics.md §4); every field has the input shape.

    ``d_entropy = d_binary + content_part + (sink_part - d_binary)``, with
    ``sink_part = dH_b + bar(H(pi)) d(1-s)`` and ``content_part = bar(1-s) dH(pi)``.
    """

    d_entropy: np.ndarray
    d_binary: np.ndarray
    sink_part: np.ndarray
    content_part: np.ndarray


def entropy_change(s_a, h_pi_a, s_b, h_pi_b) -> EntropyChange:
    """Split ``dH = H(p_b) - H(p_a)`` into its sink and content parts, exactly and symmetrically.

    ``H(p) = H_b(s) + (1 - s) H(pi)`` (chain rule), so with midpoint bars
    ``dH = dH_b + bar(1-s) dH(pi) + bar(H(pi)) d(1-s)`` holds with no remainder.
    Inputs are sink masses ``s`` and content entropies ``H(pi)`` (nats) of matching shapes.

    Examples
    --------
    >>> ch = entropy_change(0.2, 2.0, 0.8, 1.5)   # the docs/metrics.md §4 reference
    >>> round(float(ch.sink_part), 6), round(float(ch.content_part), 6)
    (-1.05, -0.25)
    >>> round(float(ch.sink_part / ch.d_entropy), 4)
    0.8077
    """
    s_a, s_b = np.asarray(s_a, dtype=np.float64), np.asarray(s_b, dtype=np.float64)
    h_a, h_b = np.asarray(h_pi_a, dtype=np.float64), np.asarray(h_pi_b, dtype=np.float64)
    d_bin = binary_entropy(s_b) - binary_entropy(s_a)
    bar_c = 1.0 - (s_a + s_b) / 2.0
    bar_h = (h_a + h_b) / 2.0
    d_c = (1.0 - s_b) - (1.0 - s_a)
    content = bar_c * (h_b - h_a)
    sink = d_bin + bar_h * d_c
    return EntropyChange(d_entropy=sink + content, d_binary=d_bin, sink_part=sink,
                         content_part=content)
