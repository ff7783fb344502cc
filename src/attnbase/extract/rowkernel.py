"""Row/col attention statistics in one compiled pass per row (numba), from float32 logits.

The same quantities as :func:`attnbase.extract.rowstats.row_col_stats` (docs/metrics.md §3-4; that
module stays the reference the tests compare against), computed row by row in float64 while
the 128-key row sits in L1 cache: passes for the count of unmasked keys, the content sum and
the max, one of ``exp``, then the sums. The torch path makes about a dozen passes over a
float64 copy of the ``[batch, head, query, key]`` block.

The passes are written for SIMD: ``exp`` is computed in four lanes by :func:`_exp_neg` (Cody-Waite
range reduction and a degree-12 polynomial, within 1.5 ulp of libm's; libm's scalar ``exp``
took a third of the kernel), and the sums may be reassociated (each helper's own ``fastmath``
flags, :data:`_HELPERS`); it is faster than the scalar kernel before it, every statistic
equal to rounding (benchmarks/RESULTS.md: "numba row kernel").

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

import math

import numpy as np

from attnbase._lazy import LazyJit

#: numba is imported on first use only: ``import numba`` costs ~0.5 s (seconds on a loaded
#: machine).
numba = None  # bound by _JIT.get(); the kernel refers to numba.prange

LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01  # its low 21 bits are zero: n * LN2_HI is exact
LN2_LO = 1.90821492927058770002e-10
SHIFTER = 6755399441055744.0  # 1.5 * 2**52: x + SHIFTER rounds x to an integer in the low bits
SHIFTER_BITS = 0x4338000000000000  # the bit pattern of SHIFTER
CLAMP = 1100.0  # exp(-1100) rounds to 0 (two scalings of 2**-550)


def _exp_neg(d, e, bits, fbits):  # pragma: no cover (jitted)
    """``e[j] = exp(-d[j])`` for ``d[j] >= 0`` (``+inf`` gives 0), in SIMD lanes.

    ``exp(-x) = 2^n exp(r)``, ``n = round(-x / ln 2)``, ``r = -x - n ln 2`` (two-constant
    reduction, ``|r| <= 0.347``), ``exp(r)`` by its Taylor polynomial of degree 12 (truncation
    < 2e-16 relative), ``2^n`` as two powers ``2^(n//2) 2^(n - n//2)`` built from their bit patterns
    (``bits``: int64 scratch of ``2 K``; ``fbits`` the same memory as float64), so that results
    below the normal range round to subnormals or 0 as libm's do."""
    K = d.shape[0]
    for j in range(K):
        x = -min(d[j], CLAMP)
        t = x * LOG2E + SHIFTER
        n = t - SHIFTER
        r = (x - n * LN2_HI) - n * LN2_LO
        p = 1.0 / 479001600.0
        p = p * r + 1.0 / 39916800.0
        p = p * r + 1.0 / 3628800.0
        p = p * r + 1.0 / 362880.0
        p = p * r + 1.0 / 40320.0
        p = p * r + 1.0 / 5040.0
        p = p * r + 1.0 / 720.0
        p = p * r + 1.0 / 120.0
        p = p * r + 1.0 / 24.0
        p = p * r + 1.0 / 6.0
        p = p * r + 0.5
        p = p * r + 1.0
        p = p * r + 1.0
        e[j] = p
        fbits[j] = t
    for j in range(K):
        k = bits[j] - SHIFTER_BITS
        k1 = k >> 1
        bits[j] = (k1 + 1023) << 52
        bits[K + j] = (k - k1 + 1023) << 52
    for j in range(K):
        e[j] = e[j] * fbits[j] * fbits[K + j]


def _sums_main(e, d):  # pragma: no cover (jitted)
    """``(sum e_j, sum e_j d_j)``; ``d_j`` is clipped at 1e300 where masked (``e_j = 0``)."""
    s = 0.0
    sd = 0.0
    for j in range(e.shape[0]):
        s += e[j]
        sd += e[j] * min(d[j], 1e300)
    return s, sd


def _sums_content(ec, zrow, zmaxc, meanc, scale):  # pragma: no cover (jitted)
    """Over the keys ``j >= 1``: ``(sum x_j, sum x_j (zmaxc - z_j), sum (z_j - meanc)^2)`` with
    ``x_j = scale ec_j`` (masked keys add 0)."""
    s = 0.0
    sd = 0.0
    ss = 0.0
    for j in range(1, ec.shape[0]):
        v = np.float64(zrow[j])
        ok = v > -math.inf
        w = (zmaxc - v) if ok else 0.0
        x = ec[j] * scale
        s += x
        sd += x * w
        dv = (v - meanc) if ok else 0.0
        ss += dv * dv
    return s, sd, ss


def _scan_sums(zrow):  # pragma: no cover (jitted)
    """(unmasked count, NaN/+inf count, sum of the unmasked ``z_j`` for ``j >= 1``)."""
    n = 0
    nbad = 0
    zs = 0.0
    for j in range(zrow.shape[0]):
        v = np.float64(zrow[j])
        ok = v > -math.inf
        n += 1 if ok else 0
        nbad += 1 if (v != v or v == math.inf) else 0
        zs += v if (ok and j >= 1) else 0.0
    return n, nbad, zs


def _argmax_from(zrow, start):  # pragma: no cover (jitted)
    """(max, first index of it) of zrow[start:] (-inf, -1 when every entry is -inf)."""
    m = -math.inf
    a = -1
    for j in range(start, zrow.shape[0]):
        v = np.float64(zrow[j])
        if v > m:
            m = v
            a = j
    return m, a


def _kernel(z, n_out, sink, maxp, amax, ent, bal, cent, disp, recv):  # pragma: no cover (jitted)
    """Rows ``z[r, t]`` of ``z`` ``(R, T, K)`` (rows ``r`` in parallel); outputs ``(R, T)``, and
    ``recv`` ``(R, K)`` accumulated. ``e_j = exp(z_j - z_max)`` once per key; the content terms
    are ``e_j exp(z_max - zmaxc)`` (2 ulp) unless that gap is so large that ``e_j`` could underflow
    where ``exp(z_j - zmaxc)`` does not. The sums leave out the (first) argmax's term, exactly 1,
    and add it as ``1 + rest``, so an entropy near 0 keeps its relative precision."""
    R, T, K = z.shape
    nan = math.nan
    inf = math.inf
    for r in numba.prange(R):
        e = np.empty(K, np.float64)
        d = np.empty(K, np.float64)
        e2 = np.empty(K, np.float64)
        bits = np.empty(2 * K, np.int64)
        fbits = bits.view(np.float64)
        for t in range(T):
            zrow = z[r, t]
            n, nbad, zsumc = _scan_sums(zrow)
            bad = nbad > 0
            z0 = np.float64(zrow[0])
            nc = n - (1 if z0 > -inf else 0)
            zmax, arg = _argmax_from(zrow, 0)
            if arg < 0:
                arg = 0
            if arg >= 1:
                zmaxc, argc = zmax, arg
            else:
                zmaxc, argc = _argmax_from(zrow, 1)
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
            for j in range(K):
                d[j] = zmax - np.float64(zrow[j])  # +inf where masked
            _exp_neg(d, e, bits, fbits)  # exp(z_j - z_max): 1 at the argmax, 0 where masked
            e[arg] = 0.0
            s_rest, sd = _sums_main(e, d)
            e[arg] = 1.0
            s = 1.0 + s_rest
            inv = 1.0 / s
            sink[r, t] = e[0] * inv if z0 > -inf else 0.0
            maxp[r, t] = inv
            ent[r, t] = math.log1p(s_rest) + sd * inv
            meanc = zsumc / nc if nc > 0 else 0.0
            if n >= 2 and z0 > -inf:
                bal[r, t] = math.sqrt((n - 1) / n) * (z0 - meanc)
            else:
                bal[r, t] = nan
            if nc >= 2:
                gap = zmax - zmaxc
                if gap > 600.0:  # exp(z_j - z_max) could underflow where exp(z_j - zmaxc) does not
                    for j in range(K):
                        d[j] = zmaxc - np.float64(zrow[j])
                    _exp_neg(d, e2, bits, fbits)
                    e2[argc] = 0.0
                    sc_rest, scd, ss = _sums_content(e2, zrow, zmaxc, meanc, 1.0)
                else:
                    ea = e[argc]
                    e[argc] = 0.0
                    sc_rest, scd, ss = _sums_content(e, zrow, zmaxc, meanc, math.exp(gap))
                    e[argc] = ea
                sc = 1.0 + sc_rest
                cent[r, t] = math.log1p(sc_rest) + scd / sc
                disp[r, t] = math.sqrt(ss)
            else:
                cent[r, t] = nan
                disp[r, t] = nan
            for j in range(K):
                recv[r, j] += e[j] * inv


#: The helpers' own compile options: ``contract`` lets the polynomial use FMAs; ``reassoc`` lets
#: the sums run in SIMD lanes (sums of non-negative terms: no cancellation in any order; the content
#: sum of float32 logits is exact in float64 in any order for rows spanning < 2^28 in magnitude).
_HELPERS = {"_exp_neg": dict(fastmath={"contract"}, nogil=True, cache=True),
            "_sums_main": dict(fastmath={"reassoc"}, nogil=True, cache=True),
            "_sums_content": dict(fastmath={"reassoc"}, nogil=True, cache=True),
            "_scan_sums": dict(fastmath={"reassoc"}, nogil=True, cache=True),
            "_argmax_from": dict(nogil=True, cache=True)}
_JIT = LazyJit(_kernel, globals(), helpers=_HELPERS, parallel=True, nogil=True, cache=True,
               fastmath=False)


def _get():
    """The compiled kernel (from numba's on-disk cache after the first compile, ~30 s once)."""
    return _JIT.get()


def warm() -> None:
    """Import numba and load the cached kernel now (the runner does it in a thread while the
    model loads, so the first batch does not pay it)."""
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
