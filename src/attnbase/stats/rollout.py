"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers";
docs/metrics.md §6c): how much of each input token flows into each output token through the
attention of every layer, the residual connection counted as half of each layer's mixing.

For one window with attention probabilities ``A_l`` ``(head, query, key)`` of layers
``l = 0 .. L-1``: ``Ã_l = 0.5 * mean_h A_l + 0.5 * I``, each row normalised to sum 1, and
``R = Ã_{L-1} ... Ã_1 Ã_0`` (layer 0 acts first). ``R[i, j]`` is the share of output token i
that traces back to input token j; :func:`cls_rollout` is the [CLS] row (query 0) over the patch
tokens, the map drawn over an image.

The service computes it on request from the stored (or derived) logits of the one window shown:
one window's logits of every layer, ``L * H * T^2`` values, and ``L`` products of ``T x T``
matrices (benchmarks/RESULTS.md, "attention rollout").
"""

from __future__ import annotations

import numpy as np

__all__ = ["RESIDUAL", "attention_rollout", "cls_rollout"]

#: The weight of the identity (the residual path) in each layer's mixing matrix.
RESIDUAL = 0.5


def _mixing(layer: np.ndarray, residual: float) -> np.ndarray:
    """``Ã = (1 - residual) * mean_h A + residual * I``, rows normalised, of one layer's
    ``(head, T, T)``."""
    mix = (1.0 - residual) * layer.mean(axis=0, dtype=np.float64)
    mix[np.diag_indices_from(mix)] += residual
    return mix / mix.sum(axis=-1, keepdims=True)


def _check(attn, residual: float) -> np.ndarray:
    a = np.asarray(attn)
    if a.ndim != 4 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"attention must be (layer, head, T, T), got shape {a.shape}")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    return a


def attention_rollout(attn, residual: float = RESIDUAL) -> np.ndarray:
    """The rollout ``R`` ``(T, T)`` of one window's attention ``(layer, head, T, T)``
    (probabilities; module docstring).

    Examples
    --------
    One layer, one head, all attention on token 0: half of every token stays, half goes to 0.

    >>> a = np.zeros((1, 1, 2, 2)); a[..., 0] = 1.0
    >>> attention_rollout(a).tolist()
    [[1.0, 0.0], [0.5, 0.5]]
    """
    a = _check(attn, residual)
    out = np.eye(a.shape[-1])
    for layer in a:
        out = _mixing(layer, residual) @ out
    return out


def cls_rollout(attn, first_patch: int, residual: float = RESIDUAL) -> np.ndarray:
    """The [CLS] row (query 0) of :func:`attention_rollout` over the patch tokens (positions
    ``first_patch`` on): ``(n_patch,)``, in the patches' raster order. Computed as the row
    vector ``e_0^T Ã_{L-1} ... Ã_0`` from the last layer down: ``L`` vector-matrix products,
    not ``L`` matrix products."""
    a = _check(attn, residual)
    v = np.zeros(a.shape[-1])
    v[0] = 1.0
    for layer in a[::-1]:
        v = v @ _mixing(layer, residual)
    return v[first_patch:]
