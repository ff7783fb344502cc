"""Rank collapse across depth (docs/metrics.md §6; Dong, Cordonnier & Loukas 2021, "Attention is not
all you need: pure attention loses rank doubly exponentially with depth", ICML).

Shapes: matrices are ``(..., n, m)`` (rows = tokens); every function is batched over the leading
axes. A layer block of ``hidden`` is ``(seq, pos, d_model)`` and gives one value per sequence.

- :func:`composite_norm` ``||X||_{1,inf} = sqrt(||X||_1 ||X||_inf)``: ``||X||_1`` is the largest
  column abs-sum, ``||X||_inf`` the largest row abs-sum (the paper's Eq. 1 norm).
- :func:`token_residual` ``res(X) = X - 1 mean_t(X)``: the distance to the rank-1 matrices whose
  rows are all equal (the paper's collapse target ``1 x^T``).
- :func:`residual_ratio` ``||res(X)||_{1,inf} / ||X||_{1,inf}`` (``rank_collapse`` per layer).
- :func:`rank1_residual` ``P - P_1`` with ``P_1`` the best rank-1 approximation (truncated SVD),
  used for products of attention matrices along paths (the paper's Fig. 2).
- :func:`effective_rank` of a spectrum: Roy & Vetterli (2007) ``exp(H(p))`` with
  ``p_r = sigma_r / sum sigma`` (default) or the participation ratio
  ``(sum sigma^2)^2 / sum sigma^4``; both are 1 for a rank-1 and ``k`` for ``k`` equal values.

>>> x = np.arange(12.0).reshape(4, 3)
>>> float(l1_norm(x)), float(linf_norm(x))
(26.0, 30.0)
>>> round(float(composite_norm(x)), 6), round(float(residual_ratio(x)), 6)
(27.92848, 0.455733)
"""

from __future__ import annotations

import os

import numpy as np

from attnbase._lazy import LazyJit
from attnbase.errors import StatsError
from attnbase.metrics import names
from attnbase.stats import geometry
from attnbase.stats.highnorm import HIGH_NORM_LAYER_METRICS
from attnbase.stats.massive import (MASSIVE_LAYER_METRICS, massive_activations, massive_values,
                                    run_tokens)

__all__ = [
    "ERANK_KINDS",
    "l1_norm",
    "linf_norm",
    "composite_norm",
    "token_residual",
    "residual_ratio",
    "rank1_residual",
    "path_residual_ratio",
    "effective_rank",
    "residual_erank",
    "hidden_layer_profile",
    "depth_layer_rows",
    "depth_values",
    "depth_table",
    "singular_values",
    "PATH_ORDERS",
    "sample_paths",
    "path_products",
    "path_ratio_draws",
]

#: Names accepted by :func:`effective_rank`'s ``kind``.
ERANK_KINDS = ("roy_vetterli", "participation")


def _matrix(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 2:
        raise StatsError(f"expected matrices (..., n, m), got shape {x.shape}")
    return x


def l1_norm(x) -> np.ndarray:
    """Induced 1-norm: the largest column abs-sum of ``(..., n, m)`` -> ``(...)``."""
    return np.abs(_matrix(x)).sum(axis=-2).max(axis=-1)


def linf_norm(x) -> np.ndarray:
    """Induced inf-norm: the largest row abs-sum of ``(..., n, m)`` -> ``(...)``."""
    return np.abs(_matrix(x)).sum(axis=-1).max(axis=-1)


def composite_norm(x) -> np.ndarray:
    """``||X||_{1,inf} = sqrt(||X||_1 ||X||_inf)`` of ``(..., n, m)`` -> ``(...)`` (docs/metrics.md §6)."""
    return np.sqrt(l1_norm(x) * linf_norm(x))


def token_residual(x) -> np.ndarray:
    """``res(X) = X - 1 mean_t(X)``: subtract the token (row) mean; ``(..., pos, d)`` kept."""
    x = _matrix(x)
    return x - x.mean(axis=-2, keepdims=True)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return out


def residual_ratio(x) -> np.ndarray:
    """``||res(X)||_{1,inf} / ||X||_{1,inf}`` of hidden states ``(..., pos, d_model)`` -> ``(...)``.

    0 when every token carries the same vector (full collapse); NaN for an all-zero ``X``.

    Examples
    --------
    >>> round(float(residual_ratio(np.arange(12.0).reshape(4, 3))), 6)   # docs/metrics.md §6
    0.455733
    """
    x = _matrix(x)
    return _ratio(composite_norm(token_residual(x)), composite_norm(x))


def rank1_residual(p) -> np.ndarray:
    """``P - sigma_1 u_1 v_1^T``: ``P`` minus its best rank-1 approximation (Eckart-Young),
    ``(..., n, m)`` kept. Zero (up to rounding) for a rank-1 ``P``."""
    p = _matrix(p)
    u, s, vt = np.linalg.svd(p, full_matrices=False)
    return p - s[..., :1, None] * u[..., :, :1] * vt[..., :1, :]


def path_residual_ratio(p) -> np.ndarray:
    """``||P - P_1||_{1,inf} / ||P||_{1,inf}`` for path products ``(..., n, n)`` -> ``(...)``."""
    p = _matrix(p)
    return _ratio(composite_norm(rank1_residual(p)), composite_norm(p))


def effective_rank(sigma, kind: str = "roy_vetterli") -> np.ndarray:
    """Effective rank of nonnegative spectra ``(..., r)`` -> ``(...)`` (docs/metrics.md §7).

    ``roy_vetterli``: ``exp(-sum p ln p)``, ``p = sigma / sum sigma`` (Roy & Vetterli 2007);
    ``participation``: ``(sum sigma^2)^2 / sum sigma^4``. NaN for an all-zero spectrum.

    >>> float(effective_rank([3.0, 3.0, 0.0]))
    2.0
    >>> float(effective_rank([1.0, 1.0, 1.0, 1.0], kind="participation"))
    4.0
    """
    if kind not in ERANK_KINDS:
        raise StatsError(f"unknown effective-rank kind {kind!r}; choose one of {', '.join(ERANK_KINDS)}")
    s = np.abs(np.asarray(sigma, dtype=np.float64))
    total = s.sum(axis=-1, keepdims=True)
    if kind == "participation":
        s2 = s * s
        return _ratio(s2.sum(-1) ** 2, (s2 * s2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        p = s / np.where(total > 0, total, 1.0)
        h = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(-1)
    return np.where(total[..., 0] > 0, np.exp(h), np.nan)


def singular_values(x) -> np.ndarray:
    """Singular values of ``(..., n, m)`` matrices, descending, ``(..., min(n, m))``.

    Through the eigenvalues of the smaller Gram matrix (``X X^T`` or ``X^T X``): less CPU than a
    batched SVD (benchmarks/RESULTS.md: "singular values via the smaller Gram matrix").
    Squaring loses the singular values
    below ~1e-8 of the largest, which carry no weight in an effective rank.
    """
    x = np.asarray(x)
    xt = np.swapaxes(x, -1, -2)
    gram = x @ xt if x.shape[-2] <= x.shape[-1] else xt @ x
    ev = np.linalg.eigvalsh(gram)[..., ::-1]
    return np.sqrt(np.clip(ev, 0.0, None))


def residual_erank(x, kind: str = "roy_vetterli") -> np.ndarray:
    """Effective rank of ``res(X)`` for hidden states ``(..., pos, d_model)`` -> ``(...)``."""
    return effective_rank(singular_values(token_residual(x)), kind)


def _profile_kernel(x, res, out):  # pragma: no cover (jitted)
    """Per sequence ``s`` of ``x`` ``(seq, pos, d)``: ``res[s] = X - mean_t X`` (float64) and
    ``out[s] = (||X||, ||res X||, ||X[1:]||, ||res X[1:]||)`` in the composite norm
    ``sqrt(max col abs-sum * max row abs-sum)``, every sum in float64 (docs/metrics.md §6)."""
    S, T, D = x.shape
    mean = np.empty(D)
    tail = np.empty(D)
    col = np.empty((4, D))
    for s in range(S):
        mean[:] = 0.0
        for t in range(T):
            for d in range(D):
                mean[d] += x[s, t, d]
        for d in range(D):
            tail[d] = (mean[d] - x[s, 0, d]) / max(T - 1, 1)
            mean[d] /= T
        col[:] = 0.0
        rmax0 = rmax1 = rmax2 = rmax3 = 0.0
        for t in range(T):
            r0 = r1 = r2 = r3 = 0.0
            for d in range(D):
                v = np.float64(x[s, t, d])
                c = v - mean[d]
                res[s, t, d] = c
                a, b = abs(v), abs(c)
                col[0, d] += a
                col[1, d] += b
                r0 += a
                r1 += b
                if t > 0:
                    e = abs(v - tail[d])
                    col[2, d] += a
                    col[3, d] += e
                    r2 += a
                    r3 += e
            rmax0, rmax1 = max(rmax0, r0), max(rmax1, r1)
            rmax2, rmax3 = max(rmax2, r2), max(rmax3, r3)
        cmax = np.zeros(4)
        for k in range(4):
            for d in range(D):
                cmax[k] = max(cmax[k], col[k, d])
        out[s, 0] = np.sqrt(cmax[0] * rmax0)
        out[s, 1] = np.sqrt(cmax[1] * rmax1)
        out[s, 2] = np.sqrt(cmax[2] * rmax2)
        out[s, 3] = np.sqrt(cmax[3] * rmax3)


numba = None  # bound by LazyJit.get()
_PROFILE = LazyJit(_profile_kernel, globals(), nogil=True, cache=True)

#: Sequences per task of :func:`hidden_layer_profile` (a float64 residual of 16 x 128 x 384
#: is 6 MiB: Gram products and eigenvalues of a task stay in cache-sized pieces).
_PROFILE_SEQS = 16


def _profile_part(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ratios with and without token 0, and the singular values of ``res(X)``, of ``(s, pos, d)``."""
    res = np.empty(x.shape)
    n = np.empty((x.shape[0], 4))
    _PROFILE.get()(x, res, n)
    excl = _ratio(n[:, 3], n[:, 2]) if x.shape[1] > 1 else np.full(x.shape[0], np.nan)
    return _ratio(n[:, 1], n[:, 0]), excl, singular_values(res)


def hidden_layer_profile(block, pool=None) -> dict[str, np.ndarray]:
    """Per-sequence depth statistics of one ``hidden`` layer block ``(seq, pos, d_model)``.

    Returns ``{"rank_collapse": (seq,), "rank_collapse_excl_sink": (seq,) (tokens 1.. only),
    "residual_erank": (seq,), "residual_erank_pr": (seq,)}``. Where the ratio is below ``10 eps`` of the block's dtype
    (float32: 1.2e-6) the residual is rounding noise of a collapsed stream, whose spectrum is
    flat: its effective rank is reported as NaN rather than as the rank of the noise.

    One compiled pass per sequence gives both composite norms with and without token 0 and the
    float64 residual (the same values as :func:`residual_ratio`, to rounding); the singular values
    follow from its Gram matrix (:func:`singular_values`). ``pool`` (an executor) runs pieces of
    :data:`_PROFILE_SEQS` sequences side by side; results do not depend on it.
    """
    block = np.asarray(block)
    floor = 10 * np.finfo(block.dtype).eps if np.issubdtype(block.dtype, np.floating) else 0.0
    if block.ndim != 3:
        raise StatsError(f"a hidden layer block is (seq, pos, d_model), got shape {block.shape}")
    x = np.ascontiguousarray(block if block.dtype in (np.float32, np.float64)
                             else block.astype(np.float64))
    parts = [x[a:a + _PROFILE_SEQS] for a in range(0, x.shape[0], _PROFILE_SEQS)]
    with geometry._one_blas_thread():  # stacks of small matrices (see geometry)
        done = list(pool.map(_profile_part, parts) if pool is not None else map(_profile_part, parts))
    ratio, excl, s = (np.concatenate([d[i] for d in done]) for i in range(3))
    noise = ~(ratio > floor)
    return {"rank_collapse": ratio,
            # without token 0: the sink/BOS token of causal LMs can carry a massive activation
            # (SmolLM2: ||h_0|| ~ 25,000 vs ~150) that dominates both composite norms
            "rank_collapse_excl_sink": excl,
            "residual_erank": np.where(noise, np.nan, effective_rank(s, "roy_vetterli")),
            "residual_erank_pr": np.where(noise, np.nan, effective_rank(s, "participation"))}


#: layer_metrics written by :func:`depth_layer_rows` (``layer`` = hidden index, 0 = embeddings):
#: the profile of :func:`depth_values`, then the massive activations (:mod:`.massive`).
DEPTH_LAYER_METRICS = names("depth", "layer")
_PROFILE_LAYER_METRICS = tuple(m for m in DEPTH_LAYER_METRICS
                               if m not in MASSIVE_LAYER_METRICS + HIGH_NORM_LAYER_METRICS)


def _mean_sd(v: np.ndarray) -> tuple[float, float]:
    """Mean and sd (ddof=1) over the finite entries; NaN where undefined (no warning: an exactly
    collapsed layer has an undefined effective rank in every sequence)."""
    v = v[np.isfinite(v)]
    mean = float(v.mean()) if v.size else float("nan")
    return mean, (float(v.std(ddof=1)) if v.size > 1 else float("nan"))


def depth_layer_rows(db, run_id: str, n_hidden: int, workers: int | None = None,
                     sink=(0,)) -> dict[str, np.ndarray]:
    """``layer_metrics`` rows of a run that captured ``hidden``, streamed one layer at a time.

    ``layer`` is the index into ``hidden`` (0 = embeddings, ``l`` = output of block ``l - 1``),
    so there are ``n_layers + 1`` layers. Means over sequences; ``*_sd`` are the standard
    deviations over sequences (ddof=1; NaN with one sequence). Layers are read one ahead of the
    computation, whose pieces run on ``workers`` threads (default: the CPU count).
    """
    from concurrent.futures import ThreadPoolExecutor

    rows: dict[str, list] = {"layer": [], "metric": [], "value": []}
    tokens = run_tokens(db.run(run_id).store())
    with geometry._one_blas_thread(), ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        profiles = [(layer, depth_values(hidden_layer_profile(block, pool))
                     + massive_values(massive_activations(block, sink, tokens)))
                    for layer, block in db.read_layers(run_id, "hidden", range(n_hidden))]
    for layer, values in profiles:
        for metric, value in values:
            rows["layer"].append(layer)
            rows["metric"].append(metric)
            rows["value"].append(value)
    return depth_table(run_id, rows)


def depth_values(prof: dict[str, np.ndarray]) -> list[tuple[str, float]]:
    """``(metric, value)`` of one hidden layer's profile (:func:`hidden_layer_profile`), in
    :data:`_PROFILE_LAYER_METRICS` order (the massive activations: :mod:`.massive`)."""
    vals = {}
    for name in ("rank_collapse", "rank_collapse_excl_sink", "residual_erank",
                 "residual_erank_pr"):
        vals[name], vals[f"{name}_sd"] = _mean_sd(prof[name])
    return [(metric, float(vals[metric])) for metric in _PROFILE_LAYER_METRICS]


def depth_table(run_id: str, rows: dict[str, list]) -> dict[str, np.ndarray]:
    """``layer_metrics`` columns of depth rows ``{"layer": [...], "metric": [...],
    "value": [...]}``."""
    return {"run_id": np.full(len(rows["layer"]), run_id, dtype=object),
            "layer": np.asarray(rows["layer"], dtype=np.int16),
            "metric": np.asarray(rows["metric"], dtype=object),
            "value": np.asarray(rows["value"], dtype=np.float64)}


#: ``forward``: ``P = A_{l_k} ... A_{l_1}`` (layer l_1 acts first, as in the network);
#: ``ascending``: ``P = A_{l_1} ... A_{l_k}`` (the peer notebook's order, ``P = P @ A_l``).
PATH_ORDERS = ("forward", "ascending")


def sample_paths(rng: np.random.Generator, n_layers: int, n_heads: int, length: int,
                 draws: int) -> tuple[np.ndarray, np.ndarray]:
    """``draws`` random paths of ``length`` distinct layers in ascending order, one uniformly
    random head per layer: ``(layers, heads)``, both ``(draws, length)``."""
    if not 1 <= length <= n_layers:
        raise StatsError(f"path length must be in 1..{n_layers}, got {length}")
    keys = rng.random((draws, n_layers))
    layers = np.sort(np.argsort(keys, axis=1)[:, :length], axis=1)
    heads = rng.integers(0, n_heads, size=(draws, length))
    return layers, heads


def path_products(attn: np.ndarray, layers: np.ndarray, heads: np.ndarray,
                  order: str = "forward") -> np.ndarray:
    """Products of attention matrices along paths, every sequence with its own paths.

    ``attn``: ``(layer, head, seq, query, key)`` row-stochastic matrices; ``layers``/``heads``:
    ``(draws, length)`` (the same paths for every sequence) or ``(seq, draws, length)`` (paths
    per sequence). Returns ``(draws, seq, query, key)`` or ``(seq, draws, query, key)``.
    """
    if order not in PATH_ORDERS:
        raise StatsError(f"unknown path order {order!r}; use one of {', '.join(PATH_ORDERS)}")
    if layers.ndim == 2:
        seq = np.arange(attn.shape[2])[None, :]
        lay, hd = layers[:, :, None], heads[:, :, None]  # (draws, length, 1)

        def pick(j):
            return attn[lay[:, j], hd[:, j], seq]  # (draws, seq, T, T)
    else:
        seq = np.arange(attn.shape[2])[:, None]

        def pick(j):
            return attn[layers[..., j], heads[..., j], seq]  # (seq, draws, T, T)
    p = pick(0).astype(np.float64)
    for j in range(1, layers.shape[-1]):
        a = pick(j)
        p = a @ p if order == "forward" else p @ a
    return p


def path_ratio_draws(attn: np.ndarray, draws: int = 100, seed: int = 0, order: str = "forward",
                     lengths=None) -> dict[int, np.ndarray]:
    """The paper's path experiment (Dong et al. 2021, Fig. 2): for each path length ``k`` in
    ``lengths`` (default ``1..L``), ``draws`` random paths per sequence and the ratio
    :func:`path_residual_ratio` of each product. ``attn`` ``(layer, head, seq, query, key)``;
    returns ``{k: (seq, draws)}``. Each sequence gets its own paths; seeded by ``(seed, k)``."""
    from threadpoolctl import threadpool_limits

    n_layers, n_heads, n_seqs = attn.shape[:3]
    out = {}
    # stacks of small matrices: BLAS threads only contend (see geometry._one_blas_thread)
    with threadpool_limits(limits=1, user_api="blas"):
        for k in (range(1, n_layers + 1) if lengths is None else lengths):
            rng = np.random.default_rng([seed, k])
            layers, heads = sample_paths(rng, n_layers, n_heads, k, draws * n_seqs)
            shape = (n_seqs, draws, k)
            p = path_products(attn, layers.reshape(shape), heads.reshape(shape), order)
            out[k] = path_residual_ratio(p)
    return out
