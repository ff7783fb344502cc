"""Routing vs filtering in the weights: the S-D structure of ``M = W_Q W_K^T`` (docs/metrics.md §7).

"The Routing and Filtering Structure of Attention": the bilinear form of a head,
``score(x_i, x_j) = x_i M x_j^T`` (times the model's scale), splits into a symmetric *filtering*
part ``S = (M + M^T)/2`` and a skew-symmetric *routing* part ``A = (M - M^T)/2`` with
``||M||_F^2 = ||S||_F^2 + ||A||_F^2`` (they are orthogonal in the Frobenius inner product).

Shapes: ``w_q``/``w_k`` are ``(..., d_model, d_head)`` in the convention ``q = x @ w_q + b_q``
(one matrix per query head; GQA callers pass each query head with its kv head's ``w_k``).
Every result is ``(...)``: one value per head.

Nothing here forms a ``d_model x d_model`` matrix: with the reduced QR ``[W_Q, W_K] = U R``
(``U`` of shape ``(d_model, 2 d_head)``, orthonormal columns) ``M = U (R_q R_k^T) U^T``, so the
Frobenius norms, singular values and nonzero eigenvalues of ``M``, ``S`` and ``A`` are those of the
``2 d_head x 2 d_head`` core ``m = R_q R_k^T`` and its parts. The nonzero eigenvalues of ``M``
also equal those of ``W_K^T W_Q`` (``d_head x d_head``; eig(AB) = eig(BA) up to zeros), which is
how instability is counted. :func:`sd_metrics_dense` is the dense reference the tests compare to.

>>> w = np.zeros((4, 1)); w_q = w.copy(); w_k = w.copy()
>>> w_q[0, 0] = 1.0; w_k[1, 0] = 1.0          # M = e_0 e_1^T: half routing, half filtering
>>> r = sd_metrics(w_q, w_k)
>>> float(r["routing_fraction"]), float(r["routing_erank"])
(0.5, 2.0)
"""

from __future__ import annotations

import numpy as np

from attnbase.errors import StatsError
from attnbase.metrics import N, names
from attnbase.stats.depth import effective_rank

__all__ = [
    "SD_HEAD_METRICS",
    "span_core",
    "sd_parts",
    "sd_metrics",
    "routing_fraction",
    "sd_metrics_dense",
    "unstable_eigenvalues",
    "bilinear_logits",
    "cascade",
    "sd_tables",
    "SD_LAYER_METRICS",
]

#: head_metrics written for a weights run, in order (attnbase/metrics.py §7): routing_fraction
#: ||A||_F^2 / ||M||_F^2; routing_erank the Roy-Vetterli effective rank of A's singular values
#: (pairs: >= 2 if A != 0), routing_erank_pr its participation-ratio variant; the same of S;
#: form_norm ||M||_F (unscaled: multiply by the model's scale for logit units); n_unstable the
#: eigenvalues of M with positive real part (of the d_head nonzero ones), max_real_eig the
#: largest real part among them.
SD_HEAD_METRICS = names("spectral", "head")


def _check(w_q, w_k) -> tuple[np.ndarray, np.ndarray]:
    w_q = np.asarray(w_q, dtype=np.float64)
    w_k = np.asarray(w_k, dtype=np.float64)
    if w_q.ndim < 2 or w_q.shape != w_k.shape:
        raise StatsError(f"w_q and w_k must both be (..., d_model, d_head); got {w_q.shape} "
                         f"and {w_k.shape}")
    return w_q, w_k


def span_core(w_q, w_k) -> np.ndarray:
    """The core ``m = R_q R_k^T`` ``(..., r, r)``, ``r = min(2 d_head, d_model)``, with
    ``M = U m U^T``, from the reduced QR of ``[W_Q, W_K]`` ``(..., d_model, 2 d_head)``."""
    w_q, w_k = _check(w_q, w_k)
    d = w_q.shape[-1]
    _, r = np.linalg.qr(np.concatenate([w_q, w_k], axis=-1))  # r: (..., 2d, 2d)
    r_q, r_k = r[..., :, :d], r[..., :, d:]
    return r_q @ np.swapaxes(r_k, -1, -2)


def sd_parts(m) -> tuple[np.ndarray, np.ndarray]:
    """``(S, A) = ((m + m^T)/2, (m - m^T)/2)`` of square ``(..., n, n)`` matrices."""
    m = np.asarray(m, dtype=np.float64)
    mt = np.swapaxes(m, -1, -2)
    return (m + mt) / 2, (m - mt) / 2


def unstable_eigenvalues(w_q, w_k) -> tuple[np.ndarray, np.ndarray]:
    """``(count, max_real)`` over the eigenvalues of ``W_K^T W_Q`` ``(..., d_head, d_head)``
    (the nonzero eigenvalues of ``M``): how many have a positive real part, and the largest
    real part (of all ``d_head``)."""
    w_q, w_k = _check(w_q, w_k)
    ev = np.linalg.eigvals(np.swapaxes(w_k, -1, -2) @ w_q)
    return (ev.real > 0).sum(axis=-1), ev.real.max(axis=-1)


def _metrics_from_parts(s: np.ndarray, a: np.ndarray) -> dict[str, np.ndarray]:
    sv_s = np.linalg.svd(s, compute_uv=False)
    sv_a = np.linalg.svd(a, compute_uv=False)
    ns, na = (sv_s ** 2).sum(-1), (sv_a ** 2).sum(-1)
    tot = ns + na
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(tot > 0, na / np.where(tot > 0, tot, 1.0), np.nan)
    return {
        "routing_fraction": frac,
        "routing_erank": effective_rank(sv_a),
        "routing_erank_pr": effective_rank(sv_a, "participation"),
        "filtering_erank": effective_rank(sv_s),
        "filtering_erank_pr": effective_rank(sv_s, "participation"),
        "form_norm": np.sqrt(tot),
    }


def routing_fraction(w_q, w_k) -> np.ndarray:
    """``||A||_F^2 / ||M||_F^2`` per head ``(...)``: the share of the bilinear form that routes.

    Examples
    --------
    >>> w = np.eye(4)[:, :2]                       # W_Q = W_K: M symmetric, nothing routes
    >>> float(routing_fraction(w, w))
    0.0
    >>> float(routing_fraction(w, w[:, ::-1] * [1, -1]).round(12))   # M skew: all routing
    1.0
    """
    s, a = sd_parts(span_core(w_q, w_k))
    return _metrics_from_parts(s, a)["routing_fraction"]


def sd_metrics(w_q, w_k) -> dict[str, np.ndarray]:
    """Every :data:`SD_HEAD_METRICS` value per head, computed in the ``2 d_head`` span.

    ``w_q``, ``w_k``: ``(..., d_model, d_head)``; returns metric -> ``(...)``.
    """
    s, a = sd_parts(span_core(w_q, w_k))
    out = _metrics_from_parts(s, a)
    out["n_unstable"], out["max_real_eig"] = unstable_eigenvalues(w_q, w_k)
    return out


def sd_metrics_dense(w_q, w_k) -> dict[str, np.ndarray]:
    """Reference: the same metrics from the dense ``d_model x d_model`` ``M`` (tests, small
    ``d_model`` only). Instability from ``eig(M)`` itself, ignoring its ``d_model - d_head``
    structural zeros (``|lambda| <= 1e-9 ||M||``)."""
    w_q, w_k = _check(w_q, w_k)
    m = w_q @ np.swapaxes(w_k, -1, -2)
    s, a = sd_parts(m)
    out = _metrics_from_parts(s, a)
    ev = np.linalg.eigvals(m)
    scale = np.linalg.norm(m, axis=(-2, -1))[..., None]
    nz = np.abs(ev) > 1e-9 * np.maximum(scale, 1e-300)
    out["n_unstable"] = ((ev.real > 0) & nz).sum(-1)
    out["max_real_eig"] = np.where(nz, ev.real, -np.inf).max(-1)
    return out


def bilinear_logits(x, w_q, w_k, b_q=None, b_k=None, scale: float = 1.0) -> np.ndarray:
    """Logits of one head from its weights: ``(x W_Q + b_q)(x W_K + b_k)^T * scale`` expanded as
    ``x M x^T + x W_Q b_k^T + b_q W_K^T x^T + b_q b_k^T`` (the bias terms of the form).

    ``x``: ``(..., pos, d_model)`` attention inputs; ``w_q``/``w_k`` ``(d_model, d_head)``;
    biases ``(d_head,)``. Returns ``(..., pos, pos)``; uses ``x W_Q`` and ``x W_K`` so no
    ``d_model x d_model`` matrix is formed.
    """
    x = np.asarray(x, dtype=np.float64)
    qx, kx = x @ np.asarray(w_q, np.float64), x @ np.asarray(w_k, np.float64)
    z = qx @ np.swapaxes(kx, -1, -2)
    if b_k is not None:
        z = z + (qx @ np.asarray(b_k, np.float64))[..., :, None]
    if b_q is not None:
        z = z + (kx @ np.asarray(b_q, np.float64))[..., None, :]
    if b_q is not None and b_k is not None:
        z = z + float(np.asarray(b_q, np.float64) @ np.asarray(b_k, np.float64))
    return z * scale


def cascade(head_values, layers) -> tuple[np.ndarray, np.ndarray]:
    """Layer profile of a head metric (the "spectral cascade", docs/metrics.md §7).

    ``head_values`` ``(n,)`` with their ``layers`` ``(n,)`` -> ``(layer_ids, mean per layer)``.
    """
    v = np.asarray(head_values, dtype=np.float64)
    lay = np.asarray(layers)
    ids = np.unique(lay)
    return ids, np.array([np.nanmean(v[lay == i]) for i in ids])


#: layer_metrics of a weights run (means over the layer's query heads; share_unstable = the
#: fraction of heads with at least one eigenvalue of positive real part).
SD_LAYER_METRICS = (N.routing_fraction, N.routing_erank, N.routing_erank_pr, N.filtering_erank,
                    N.share_unstable, N.n_unstable)


def sd_tables(layers: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
    """Catalog rows of a weights run from ``[(w_q, w_k), ...]`` per layer, each
    ``(head, d_model, d_head)`` (query heads paired with their kv heads).

    Returns ``{"head_metrics": {layer, head, metric, value}, "layer_metrics": {...},
    "run_metrics": {metric, value}}``; the layer profile of ``routing_erank`` is the cascade.
    """
    head: dict[str, list] = {"layer": [], "head": [], "metric": [], "value": []}
    lay: dict[str, list] = {"layer": [], "metric": [], "value": []}
    per_head: dict[str, list] = {m: [] for m in SD_HEAD_METRICS}
    for layer, (w_q, w_k) in enumerate(layers):
        r = sd_metrics(w_q, w_k)
        H = w_q.shape[0]
        for m in SD_HEAD_METRICS:
            v = np.asarray(r[m], dtype=np.float64)
            head["layer"] += [layer] * H
            head["head"] += list(range(H))
            head["metric"] += [m] * H
            head["value"] += v.tolist()
            per_head[m].append(v)
        unstable = np.asarray(r[N.n_unstable]) > 0
        lv = {**{m: float(np.nanmean(r[m])) for m in SD_LAYER_METRICS if m in r},
              N.share_unstable: float(unstable.mean())}
        for m in SD_LAYER_METRICS:
            lay["layer"].append(layer)
            lay["metric"].append(m)
            lay["value"].append(lv[m])
    allv = {m: np.concatenate(v) for m, v in per_head.items()}
    run = {N.routing_fraction: float(np.nanmean(allv[N.routing_fraction])),
           N.routing_erank: float(np.nanmean(allv[N.routing_erank])),
           N.filtering_erank: float(np.nanmean(allv[N.filtering_erank])),
           N.share_heads_unstable: float(np.mean(allv[N.n_unstable] > 0)),
           N.max_real_eig: float(np.max(allv[N.max_real_eig]))}
    as_np = lambda d: {k: np.asarray(v) for k, v in d.items()}  # noqa: E731
    return {"head_metrics": as_np(head), "layer_metrics": as_np(lay),
            "run_metrics": {"metric": np.asarray(list(run)), "value": np.asarray(list(run.values()))}}
