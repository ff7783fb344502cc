"""Row/col attention statistics in one compiled pass per row (numba), from float32 logits.

The same quantities as :func:`attnbase.extract.rowstats.row_col_stats` (METRICS.md §3-4; that
module stays the reference the tests compare against), computed row by row in float64 while
the 128-key row sits in L1 cache: one pass for the max, the count of unmasked keys and the
content sum, one pass of ``exp`` for everything else. The torch path makes about a dozen
passes over a float64 copy of the ``[batch, head, query, key]`` block (benchmarks/RESULTS.md).

Every sum is a sum of non-negative terms, so no statistic suffers cancellation:

- ``S = sum_j e_j`` with ``e_j = exp(z_j - z_max)`` (so ``max_prob = 1 / S``, ``p_j = e_j / S``);
- entropy ``H = log1p(S - 1) + sum_j e_j (z_max - z_j) / S`` (= ``lse - sum p z``; ``S - 1``
  is summed directly, so an entropy near 0 keeps its relative precision);
- content entropy likewise over keys ``j >= 1`` relative to their own max;
- content dispersion ``sqrt(sum_{j>=1} (z_j - mean)^2)`` in two passes (mean from pass 1).

A row holding NaN or ``+inf`` gets NaN everywhere (its ``max_prob`` NaN is the capture's cheap
non-finite test); a fully masked row gets NaN probabilities and entropy 0, as the torch path.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np

from attnbase._lazy import LazyJit

#: numba is a dependency; without it (a broken install) the capture uses the torch path.
#: Imported on first use only: ``import numba`` costs ~0.5 s (seconds on a loaded machine).
AVAILABLE = importlib.util.find_spec("numba") is not None
numba = None  # bound by _JIT.get(); the kernel refers to numba.prange


def _kernel(z, n_out, sink, maxp, amax, ent, bal, cent, disp, recv):  # pragma: no cover (jitted)
    R, T, K = z.shape
    nan = math.nan
    inf = math.inf
    for r in numba.prange(R):
        ebuf = np.empty(K, np.float64)  # exp(z_j - z_max) of the row, reused by `received`
        for t in range(T):
            # pass 1: max (first index), unmasked count, content max / sum, bad values
            zmax = -inf
            arg = 0
            n = 0
            nc = 0
            zmaxc = -inf
            zsumc = 0.0
            bad = False
            for j in range(K):
                v = np.float64(z[r, t, j])
                if v != v or v == inf:
                    bad = True
                if v > -inf:
                    n += 1
                    if j >= 1:
                        nc += 1
                        zsumc += v
                        if v > zmaxc:
                            zmaxc = v
                if v > zmax:
                    zmax = v
                    arg = j
            n_out[r, t] = n
            amax[r, t] = arg
            if bad or n == 0:
                sink[r, t] = nan
                maxp[r, t] = nan
                ent[r, t] = 0.0 if (n == 0 and not bad) else nan
                bal[r, t] = nan
                cent[r, t] = nan
                disp[r, t] = nan
                for j in range(K):
                    recv[r, j] += nan
                continue
            # pass 2: exponentials relative to the max, and the content deviations
            # s = 1 + s_rest (the max's own term is exp(0) = 1): log1p(s_rest) keeps full
            # relative precision of entropies near 0 (a row on one key)
            s_rest = 0.0
            sd = 0.0
            sc_rest = 0.0
            scd = 0.0
            ss = 0.0
            argc = -1
            meanc = zsumc / nc if nc > 0 else 0.0
            # one exp per key: exp(v - zmaxc) = exp(v - zmax) * exp(zmax - zmaxc) (2 ulp), unless
            # the gap is so large that exp(v - zmax) could underflow where exp(v - zmaxc) does not
            gap = zmax - zmaxc if nc > 0 else 0.0
            direct = gap > 600.0
            cgap = math.exp(gap) if not direct else 0.0
            for j in range(K):
                v = np.float64(z[r, t, j])
                if v > -inf:
                    e = math.exp(v - zmax)  # exactly 1 at the argmax
                    ebuf[j] = e
                    if j != arg:
                        s_rest += e
                        sd += e * (zmax - v)
                    if j >= 1:
                        if argc < 0 and v == zmaxc:
                            argc = j
                        else:
                            ec = math.exp(v - zmaxc) if direct else e * cgap
                            sc_rest += ec
                            scd += ec * (zmaxc - v)
                        dv = v - meanc
                        ss += dv * dv
                else:
                    ebuf[j] = 0.0
            s = 1.0 + s_rest
            sc = 1.0 + sc_rest
            inv = 1.0 / s
            z0 = np.float64(z[r, t, 0])
            sink[r, t] = ebuf[0] * inv if z0 > -inf else 0.0
            maxp[r, t] = inv
            ent[r, t] = math.log1p(s_rest) + sd * inv
            # key 0 masked (sliding-window rows past the window, Gemma-3): no sink, so no
            # balance, and every unmasked key is content (nc = n, not n - 1)
            if n >= 2 and z0 > -inf:
                bal[r, t] = math.sqrt((n - 1) / n) * (z0 - meanc)
            else:
                bal[r, t] = nan
            if nc >= 2:
                cent[r, t] = math.log1p(sc_rest) + scd / sc
                disp[r, t] = math.sqrt(ss)
            else:
                cent[r, t] = nan
                disp[r, t] = nan
            for j in range(K):
                recv[r, j] += ebuf[j] * inv  # masked keys add +0.0


_JIT = LazyJit(_kernel, globals(), parallel=True, nogil=True, cache=True, fastmath=False)


def _get():
    """The compiled kernel (from numba's on-disk cache after the first compile, ~30 s once)."""
    return _JIT.get()


def warm() -> None:
    """Import numba and load the cached kernel now (the runner does it in a thread while the
    model loads, so the first batch does not pay it)."""
    if AVAILABLE:
        row_col_stats_np(np.zeros((1, 1, 4, 4), np.float32))


def row_col_stats_np(z: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Row statistics of ``z`` ``[..., query, key]`` (float32, masked = -inf) -> dict of
    ``[..., query]`` arrays (``n_keys``/``argmax`` int64, the rest float64) and ``received``
    ``[..., key]`` (float64)."""
    z = np.ascontiguousarray(z, dtype=np.float32)
    lead, (T, K) = z.shape[:-2], z.shape[-2:]
    z3 = z.reshape(-1, T, K)
    R = z3.shape[0]
    f = lambda: np.empty((R, T), np.float64)  # noqa: E731
    n_out, amax = np.empty((R, T), np.int64), np.empty((R, T), np.int64)
    sink, maxp, ent, bal, cent, disp = f(), f(), f(), f(), f(), f()
    recv = np.zeros((R, K), np.float64)
    _get()(z3, n_out, sink, maxp, amax, ent, bal, cent, disp, recv)
    out = {"n_keys": n_out, "sink_mass": sink, "max_prob": maxp, "argmax": amax, "entropy": ent,
           "sink_balance": bal, "content_entropy": cent, "content_dispersion": disp}
    return {k: v.reshape(*lead, T) for k, v in out.items()}, recv.reshape(*lead, K)
