"""Pairwise Jensen-Shannon sums between heads in one compiled pass (numba), for head distances.

``JS(p, q) = H(m) - (H(p) + H(q)) / 2`` with ``m = (p + q) / 2``: the entropies of the heads'
own rows are computed once per row (float64, by the caller); the mixture entropy ``H(m)`` is the
one term that needs a logarithm per (row, head pair, key) -- 36,315 pairs x 8,064 rows x ~65 keys
= 1.9e10 logarithms per convention for SmolLM2's 270 heads on 64 x 128 windows. ``torch``'s
``special.entr`` evaluates them with the scalar libm ``log`` (~9 ns each on this machine);
numba has no vector math library here (no SVML), so this module carries its own float32
logarithm -- Cephes ``logf`` (S. Moshier): frexp by bit manipulation, a degree-9 polynomial on
``[sqrt(1/2) - 1, sqrt(2) - 1]``, ~1 ulp -- written so LLVM vectorises it (no calls, no branches:
selects). Mixture and logarithm in float32 (as the torch path did), products summed in float64.

Work per row stays in L1/L2: one row's ``(head, key)`` probabilities (270 x 128 float32 =
138 KB), a 128-key scratch per thread. Rows are dealt to threads round-robin; each thread owns
its ``(head, head)`` partial sum, added up at the end. Masked keys are ``p = 0`` and contribute
``0`` (the mixture is clamped to 1e-30 before the logarithm: ``1e-30 ln 1e-30 = -7e-29``).
"""

from __future__ import annotations

import numpy as np

from attnbase._lazy import LazyJit

numba = None  # bound by _JIT.get(); the kernel refers to numba.prange / get_num_threads

# Cephes logf constants, as float32 so numba keeps the polynomial in single precision
_SQRTHF = np.float32(0.707106781186547524)
_C = tuple(np.float32(c) for c in (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1,
                                   -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
                                   2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1))
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8 = _C
_Q1 = np.float32(-2.12194440e-4)
_Q2 = np.float32(0.693359375)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_TINY = np.float32(1e-30)
_EXP_MASK = np.int32(0x7F800000)
_MANT_MASK = np.int32(0x007FFFFF)
_HALF_BITS = np.int32(0x3F000000)
_SHIFT = np.int32(23)
_BIAS = np.int32(126)


def _kernel(p, nk, h, parts):  # pragma: no cover (jitted)
    """``parts[t, a, b] += sum over rows r = t, t + T, ... of max(JS_r(a, b), 0)``, a < b."""
    R, N, K = p.shape
    T = parts.shape[0]
    for t in numba.prange(T):
        mix = np.empty(K, np.float32)
        mix_bits = mix.view(np.int32)
        man_bits = np.empty(K, np.int32)
        man = man_bits.view(np.float32)
        ex = np.empty(K, np.float32)
        acc = parts[t]
        for r in range(t, R, T):
            n = nk[r]
            for a in range(N):
                pa = p[r, a]
                ha = h[r, a]
                for b in range(a + 1, N):
                    pb = p[r, b]
                    for k in range(n):
                        m = _HALF * (pa[k] + pb[k])
                        mix[k] = m if m > _TINY else _TINY
                    for k in range(n):  # frexp: mix = man * 2**ex, man in [0.5, 1)
                        bits = mix_bits[k]
                        ex[k] = np.float32(((bits & _EXP_MASK) >> _SHIFT) - _BIAS)
                        man_bits[k] = (bits & _MANT_MASK) | _HALF_BITS
                    s = 0.0
                    for k in range(n):
                        x = man[k]
                        e = ex[k]
                        low = x < _SQRTHF
                        e = e - _ONE if low else e
                        x = (x + x - _ONE) if low else (x - _ONE)
                        z = x * x
                        y = ((((((((_C0 * x + _C1) * x + _C2) * x + _C3) * x + _C4) * x + _C5)
                               * x + _C6) * x + _C7) * x + _C8) * x * z
                        y = y + _Q1 * e - _HALF * z
                        lg = x + y + _Q2 * e
                        s += np.float64(mix[k] * lg)
                    js = -s - 0.5 * (ha + h[r, b])
                    if js > 0.0:
                        acc[a, b] += js


_JIT = LazyJit(_kernel, globals(), parallel=True, nogil=True, cache=True,
               fastmath={"reassoc", "contract", "nsz", "arcp"})


def js_pair_sums(p: np.ndarray, n_keys: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Sum over rows of ``JS(p[r, a], p[r, b])`` for every head pair -> ``(head, head)`` float64.

    ``p`` ``(row, head, key)`` probabilities (cast to float32); ``n_keys`` ``(row,)`` keys to
    read per row (a prefix holding every nonzero entry); ``h`` ``(row, head)`` float64 entropies
    of the rows. Upper triangle computed, mirrored; diagonal 0. Per-row values below 0 (float
    rounding of a near-zero divergence) count as 0.
    """
    p = np.ascontiguousarray(p, dtype=np.float32)
    R, N, K = p.shape
    n_keys = np.ascontiguousarray(n_keys, dtype=np.int64)
    if n_keys.shape != (R,) or (R and (n_keys.min() < 0 or n_keys.max() > K)):
        raise ValueError(f"n_keys must be ({R},) within [0, {K}]")
    h = np.ascontiguousarray(h, dtype=np.float64)
    kernel = _JIT.get()
    T = max(1, min(numba.get_num_threads(), R))
    parts = np.zeros((T, N, N), np.float64)
    if R:
        kernel(p, n_keys, h, parts)
    out = parts.sum(0)
    iu = np.triu_indices(N, 1)
    out[iu[1], iu[0]] = out[iu]
    return out


def logf(x: np.ndarray) -> np.ndarray:
    """The kernel's float32 logarithm, vectorised in numpy (for tests): ``x > 0`` normal."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.int32)
    e = (((bits & _EXP_MASK) >> _SHIFT) - _BIAS).astype(np.float32)
    f = ((bits & _MANT_MASK) | _HALF_BITS).view(np.float32)
    low = f < _SQRTHF
    e = np.where(low, e - _ONE, e).astype(np.float32)
    f = np.where(low, f + f - _ONE, f - _ONE).astype(np.float32)
    z = f * f
    y = _C0
    for c in _C[1:]:
        y = y * f + c
    y = y * f * z + _Q1 * e - _HALF * z
    return (f + y + _Q2 * e).astype(np.float32)


__all__ = ["js_pair_sums", "logf"]
