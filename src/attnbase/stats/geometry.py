"""Key geometry: rank-k variance explained of the key distance matrix (docs/metrics.md §2).

"All Routes Lead to Collapse", Table 1, columns *VE@8*, *Gauss* and *shuffle*. Classical MDS of the
squared Euclidean distances between the ``T`` keys of one sequence has the same eigenvalues as PCA
of the centred keys, so ``VE@k`` is computed from the spectrum of ``K - mean_t(K)``: the
eigenvalues of the smaller of the ``d_head x d_head`` covariance and the ``T x T`` Gram matrix,
batched over every leading axis with :func:`numpy.linalg.eigvalsh` (no per-matrix Python loop).

VE is per sequence (not pooled over tokens of many sequences: pooled over 19,200 Gaussian tokens,
d_head = 64 gives 0.137, not the paper's 0.294); a head's figure is the mean over sequences.

Shapes: ``(..., pos, d_head)`` in, ``(...)`` out; a layer block ``(kv_head, seq, pos, d_head)``
gives ``(kv_head, seq)``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
from threadpoolctl import threadpool_limits

from attnbase.errors import StatsError

__all__ = [
    "centred_spectrum",
    "ve_at_k",
    "shuffle_tokens",
    "gauss_null_ve",
    "shuffle_null_ve",
    "ve_with_shuffle_null",
    "gauss_null_pool",
]

#: Matrices per eigvalsh call in the null generators (bounds temporaries to a few MB).
_CHUNK = 1024


_PINNED = 0  # depth of _one_blas_thread contexts entered (threadpool_limits is not free)


@contextmanager
def _one_blas_thread():
    """BLAS/LAPACK limited to one thread: these are stacks of small matrices, where OpenBLAS's
    threads only contend (benchmarks/RESULTS.md: "BLAS limited to one thread"). Inside an outer
    context (e.g. ``analyze``'s, around its worker threads) it is a no-op."""
    global _PINNED
    if _PINNED:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        _PINNED += 1
        try:
            yield
        finally:
            _PINNED -= 1


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _ve_centred_t(xt: np.ndarray, k: int) -> np.ndarray:
    """VE@k of already-centred float32 matrices laid out ``(..., d_head, pos)`` (null fast path).

    The Gram product runs in float32 (faster than float64 for these small stacks, VE within
    1e-6; benchmarks/RESULTS.md: "float32 Gram product"); the eigenvalues in float64. With
    ``k >= min(pos, d_head)`` the result is exactly 1,
    as in :func:`ve_at_k`, so that ties with a statistic of 1 are ties.
    """
    d, t = xt.shape[-2], xt.shape[-1]
    if k >= min(d, t):
        return np.ones(xt.shape[:-2])
    gram = xt @ np.swapaxes(xt, -1, -2) if d <= t else np.swapaxes(xt, -1, -2) @ xt
    ev = np.clip(np.linalg.eigvalsh(gram.astype(np.float64))[..., ::-1], 0.0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        return ev[..., :k].sum(-1) / ev.sum(-1)


def centred_spectrum(keys) -> np.ndarray:
    """Squared singular values of the token-centred keys of each sequence, descending.

    Parameters
    ----------
    keys : array_like, shape (..., pos, d_head)

    Returns
    -------
    ndarray, shape (..., min(pos, d_head))
        ``sigma_r^2`` of ``K - mean_t(K)`` (float64, negatives from round-off clipped to 0).

    Examples
    --------
    Two points at distance 2 along the first axis: one direction, variance 2 in total.

    >>> centred_spectrum([[1.0, 0.0], [-1.0, 0.0]])
    array([2., 0.])
    """
    k = np.asarray(keys, dtype=np.float64)
    if k.ndim < 2 or k.shape[-2] < 2:
        raise StatsError(
            f"keys must have shape (..., pos, d_head) with pos >= 2, got shape {k.shape}"
        )
    kc = k - k.mean(axis=-2, keepdims=True)
    kt = np.swapaxes(kc, -1, -2)
    with _one_blas_thread():
        gram = kt @ kc if k.shape[-1] <= k.shape[-2] else kc @ kt
        ev = np.linalg.eigvalsh(gram)[..., ::-1]
    return np.clip(ev, 0.0, None)


def ve_at_k(keys, k: int = 8) -> np.ndarray:
    """Rank-k variance explained of the keys of each sequence (docs/metrics.md §2).

    ``VE@k = sum_{r<=k} sigma_r^2 / sum_r sigma_r^2`` for the singular values ``sigma_r`` of the
    token-centred key matrix (equivalently the share of the classical-MDS eigenvalues of the key
    distance matrix carried by the top k). "All Routes Lead to Collapse", Table 1, column VE@8.

    Parameters
    ----------
    keys : array_like, shape (..., pos, d_head)
        One ``T x d_head`` key matrix per leading index (pre-RoPE keys).
    k : int, default 8

    Returns
    -------
    ndarray, shape (...)
        In [0, 1]; 1 when ``k >= rank``; NaN for a sequence whose keys are all equal.

    Examples
    --------
    Rank-1 keys are fully explained by one direction:

    >>> float(ve_at_k([[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]], k=1))
    1.0
    >>> float(ve_at_k([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], k=1))
    0.5
    """
    if k < 1:
        raise StatsError(f"k must be a positive integer, got {k!r}")
    ev = centred_spectrum(keys)
    with np.errstate(invalid="ignore", divide="ignore"):
        return ev[..., :k].sum(-1) / ev.sum(-1)


def shuffle_tokens(keys, seed=0) -> np.ndarray:
    """Permute each key dimension independently across the tokens of each sequence.

    The shuffle null of docs/metrics.md §2: keeps every dimension's marginal distribution within the
    sequence and destroys the cross-dimension structure.

    Parameters
    ----------
    keys : array_like, shape (..., pos, d_head)
    seed : int or numpy.random.Generator

    Returns
    -------
    ndarray, shape (..., pos, d_head)

    Examples
    --------
    >>> x = [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]
    >>> np.sort(shuffle_tokens(x, seed=1), axis=0).tolist()
    [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]
    """
    return _rng(seed).permuted(np.asarray(keys), axis=-2)


def gauss_null_ve(n_pos: int, d_head: int, *, k: int = 8, draws: int = 200, n_seqs: int = 1,
                  seed=0) -> np.ndarray:
    """VE@k of i.i.d. N(0, 1) key matrices of shape ``n_pos x d_head`` (the Gauss null, §2).

    Reference values at ``n_pos = 128`` (docs/metrics.md §2, "All Routes Lead to Collapse", Table 1,
    column Gauss): d_head 64 -> 0.294, 80 -> 0.263, 128 -> 0.212, 256 -> 0.160.

    Parameters
    ----------
    n_pos, d_head : int
        Shape of each matrix (tokens per sequence, head dimension).
    k : int, default 8
    draws : int, default 200
        Null draws of the head statistic.
    n_seqs : int, default 1
        Sequences per draw: a head's VE is a mean over its sequences, so one draw of its null is
        ``n_seqs`` matrices; average the result over axis 1 to get that null.
    seed : int or numpy.random.Generator

    Returns
    -------
    ndarray, shape (draws, n_seqs)
        VE@k of every simulated matrix.

    Examples
    --------
    With ``d_head <= k`` every matrix is fully explained:

    >>> gauss_null_ve(16, 4, k=8, draws=3).ravel().tolist()
    [1.0, 1.0, 1.0]
    """
    if min(n_pos, d_head, draws, n_seqs) < 1 or n_pos < 2:
        raise StatsError(
            f"gauss_null_ve needs n_pos >= 2 and positive d_head, draws, n_seqs; got "
            f"n_pos={n_pos}, d_head={d_head}, draws={draws}, n_seqs={n_seqs}"
        )
    rng = _rng(seed)
    total = draws * n_seqs
    out = np.empty(total, dtype=np.float64)
    with _one_blas_thread():
        for start in range(0, total, _CHUNK):
            m = min(_CHUNK, total - start)
            # (m, d_head, pos) directly: i.i.d. entries, so the layout is immaterial
            x = rng.standard_normal((m, d_head, n_pos), dtype=np.float32)
            out[start:start + m] = _ve_centred_t(x - x.mean(-1, keepdims=True), k)
    return out.reshape(draws, n_seqs)


def _shuffle_tokens_fast(xT: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Permute every column of ``xT`` (shape ``(pos, rows)``) independently, in place.

    A Fisher-Yates shuffle vectorised over the columns (Durstenfeld 1964): step ``i`` swaps row
    ``i`` with a uniform row ``j <= i`` in every column at once, so each column gets an exactly
    uniform permutation (``j = floor(u (i + 1))`` from float64 ``u``: bias < 2^-45), independent
    across columns. Tokens on axis 0 keep each step's row contiguous; faster than
    :meth:`numpy.random.Generator.permuted`, whose per-element bounded integers dominate
    (benchmarks/RESULTS.md: "column-wise Fisher-Yates shuffle").
    """
    n_pos, rows = xT.shape
    flat = xT.reshape(-1)
    col = np.arange(rows, dtype=np.intp)
    for i in range(n_pos - 1, 0, -1):
        jj = (rng.random(rows) * (i + 1)).astype(np.intp)
        jj *= rows
        jj += col
        row_i = xT[i].copy()
        xT[i] = flat[jj]
        flat[jj] = row_i
    return xT


#: Columns (sequence x dimension pairs) shuffled together: a (pos, 4096) float32 slab stays in
#: a 1 MiB L2 cache for the random row swaps (benchmarks/RESULTS.md: "shuffle slab").
_SHUFFLE_COLUMNS = 4096


def _ve_and_shuffles(keys, k: int, draws: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
    """VE@k of each matrix of ``keys`` ``(..., pos, d_head)`` and of ``draws`` shuffles of it.

    Returns ``(ve, null)`` of shapes ``(...)`` and ``(draws, ...)`` (``draws`` may be 0). The
    matrices run in slabs of about :data:`_SHUFFLE_COLUMNS` columns, tokens first so that each
    Fisher-Yates step swaps whole contiguous rows.
    """
    x = np.asarray(keys, dtype=np.float32)
    if x.ndim < 2 or x.shape[-2] < 2:
        raise StatsError(f"keys must have shape (..., pos, d_head) with pos >= 2, got {x.shape}")
    lead, (n_pos, d) = x.shape[:-2], x.shape[-2:]
    flat = x.reshape((-1, n_pos, d))
    n = flat.shape[0]
    ve = np.empty(n, dtype=np.float64)
    null = np.empty((draws, n), dtype=np.float64)
    step = max(1, _SHUFFLE_COLUMNS // d)
    for a in range(0, n, step):
        blk = flat[a:a + step]
        # Centring commutes with a permutation of tokens, so centre once.
        xT = np.ascontiguousarray(np.moveaxis(blk - blk.mean(-2, keepdims=True), 1, 0))
        xT = xT.reshape(n_pos, -1)
        # each (d_head, pos) matrix of this view is Fortran-ordered with leading dimension
        # (matrices in the slab) * d_head, which BLAS takes as is (no transposing copy per draw)
        xt = xT.reshape(n_pos, -1, d).transpose(1, 2, 0)
        ve[a:a + step] = _ve_centred_t(xt, k)
        for b in range(draws):
            # shuffled in place, draw after draw: a uniform permutation of an already permuted
            # column is again uniform and independent of the earlier draws, so no copy is needed
            _shuffle_tokens_fast(xT, rng)
            null[b, a:a + step] = _ve_centred_t(xt, k)
    return ve.reshape(lead), null.reshape((draws,) + lead)


def shuffle_null_ve(keys, *, k: int = 8, draws: int = 20, seed=0) -> np.ndarray:
    """VE@k of token-shuffled keys, ``draws`` times per sequence (the shuffle null, §2).

    Each draw permutes every key dimension independently across the tokens of its sequence (the
    distribution of :func:`shuffle_tokens`, drawn with a vectorised Fisher-Yates shuffle), so the
    result holds *per-sequence* null draws: independent across sequences and draws, which is
    what the CLT test of a mean over sequences needs (:func:`attnbase.stats.inference.
    clt_mean_test`).

    Parameters
    ----------
    keys : array_like, shape (..., pos, d_head)
    k : int, default 8
    draws : int, default 20
        Shuffled copies of every sequence.
    seed : int or numpy.random.Generator

    Returns
    -------
    ndarray, shape (draws, ...)
        VE@k of every shuffled matrix; draw ``b`` of a head's null is the mean over its sequences.

    Examples
    --------
    Shuffling a single dimension changes nothing:

    >>> shuffle_null_ve([[1.0], [2.0], [4.0]], k=1, draws=2).tolist()
    [1.0, 1.0]
    """
    if draws < 1:
        raise StatsError(f"draws must be a positive integer, got {draws!r}")
    with _one_blas_thread():
        return _ve_and_shuffles(keys, k, draws, _rng(seed))[1]


def ve_with_shuffle_null(keys, *, k: int = 8, draws: int = 2, seed=0
                         ) -> tuple[np.ndarray, np.ndarray]:
    """VE@k of each sequence and ``draws`` shuffle-null draws of it, by one computation.

    The statistic and its null go through the same float32 Gram product and float64
    eigenvalues (:func:`_ve_centred_t`) of the same centred keys, so a null draw that happens to
    equal the data gives exactly the statistic. Against :func:`ve_at_k` (float64 throughout) the
    values differ by < 1e-7 (benchmarks/RESULTS.md: "VE null through the statistic's own path").

    Parameters
    ----------
    keys : array_like, shape (..., pos, d_head)
    k : int, default 8
    draws : int, default 2
        Shuffled copies of every matrix (0: the statistic alone).
    seed : int or numpy.random.Generator

    Returns
    -------
    (ndarray of shape (...), ndarray of shape (draws, ...))

    Examples
    --------
    >>> ve, null = ve_with_shuffle_null([[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]], k=1, draws=3)
    >>> float(ve), null.shape
    (1.0, (3,))
    """
    if draws < 0 or k < 1:
        raise StatsError(f"draws must be >= 0 and k positive, got {draws!r} and {k!r}")
    with _one_blas_thread():
        return _ve_and_shuffles(keys, k, draws, _rng(seed))


#: In-process cache of Gauss-null pools: (n_pos, d_head, k, draws, seed) -> VE draws (read-only).
_GAUSS_POOLS: dict[tuple[int, int, int, int, int], np.ndarray] = {}


def gauss_null_pool(n_pos: int, d_head: int, *, k: int = 8, draws: int = 4096, seed: int = 0,
                    cache_dir=None) -> np.ndarray:
    """Per-sequence Gauss-null draws: VE@k of ``draws`` i.i.d. N(0,1) ``n_pos x d_head`` matrices.

    The Gauss null depends only on the shape, so the pool is computed once per
    ``(n_pos, d_head, k, draws, seed)``: kept in-process and, with ``cache_dir``, as an ``.npy``
    file there (written atomically; a damaged file is recomputed). The draws are exactly those
    of ``gauss_null_ve(n_pos, d_head, k=k, draws=draws, seed=numpy.random.default_rng([seed,
    0]))``.

    Parameters
    ----------
    n_pos, d_head : int
    k : int, default 8
    draws : int, default 4096
        Matrices in the pool (per-sequence draws).
    seed : int, default 0
    cache_dir : path, optional

    Returns
    -------
    ndarray, shape (draws,)
        Read-only.
    """
    key = (int(n_pos), int(d_head), int(k), int(draws), int(seed))
    pool = _GAUSS_POOLS.get(key)
    if pool is not None:
        return pool
    path = None
    if cache_dir is not None:
        from pathlib import Path

        path = Path(cache_dir) / "pos{}_d{}_k{}_draws{}_seed{}.npy".format(*key)
        try:
            pool = np.load(path)
            if pool.shape != (draws,):
                pool = None
        except (OSError, ValueError):
            pool = None
    if pool is None:
        pool = gauss_null_ve(n_pos, d_head, k=k, draws=draws, n_seqs=1,
                             seed=np.random.default_rng([seed, 0])).ravel()
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                with open(tmp, "wb") as fh:
                    np.save(fh, pool)
                os.replace(tmp, path)
            except OSError:
                pass  # a cache that cannot be written is only a missed speed-up
    pool.setflags(write=False)
    _GAUSS_POOLS[key] = pool
    return pool
