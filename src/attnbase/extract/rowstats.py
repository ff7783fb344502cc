"""Per-row and per-column attention statistics computed at capture time (docs/metrics.md §3-4).

Input everywhere: scaled pre-softmax logits ``z`` of shape ``[..., query, key]`` with masked
entries ``-inf``; the unmasked keys of a row contain key 0 (the sink) except in sliding-window rows
past the window (Gemma-3), which have no sink: there ``sink_mass`` = 0, ``sink_balance`` is NaN and
every unmasked key is content (``content_*`` need >= 2 content keys). Probabilities and
every sum are taken in float64. Because ``clr(softmax(z)) = z - mean(z)`` exactly on the unmasked
prefix, the Aitchison quantities are computed from ``z`` directly and never need zero replacement
(Aitchison, *The Statistical Analysis of Compositional Data*, 1986).

This is the torch reference the tests compare the capture's paths against (the numba kernel,
:mod:`attnbase.extract.rowkernel`, on CPU; :mod:`attnbase.extract.batchstats` on a GPU or with
``ATTNBASE_ROWSTATS=torch``). Its one-pass form (:func:`row_col_stats`) makes a handful of passes over
``[..., query, key]``: one float64 softmax ``p`` shared by every statistic and by
:func:`received`, then row sums of ``p``, ``p * z``, ``z`` and ``z**2``:

- ``entropy`` ``H = lse - sum_j p_j z_j`` with ``lse = z_max - log p_max``;
- ``content_entropy`` ``H(pi) = lse + log c - sum_{j>=1} p_j z_j / c``, ``c = sum_{j>=1} p_j``
  (a direct sum, not ``1 - p_0``, so a dominant sink loses no precision);
- ``content_dispersion`` from the one-pass ``sum (z_j - mean)^2 = sum z_j^2 - (n-1) mean^2``.

Rows where a one-pass form could lose precision (``c`` underflowing, or ``sum z^2`` exceeding
``1e4 x`` the dispersion, i.e. a relative error above ~1e-12) are recomputed with the exact
two-pass formulas (:func:`_row_stats_exact`), so every value agrees with the two-pass reference
to float64 rounding.

Example (docs/metrics.md §4 reference row p = (.6, .2, .1, .1), logits z = ln p):

>>> import math, torch
>>> z = torch.log(torch.tensor([[0.6, 0.2, 0.1, 0.1]], dtype=torch.float64))
>>> s = row_stats(z)
>>> round(float(s["sink_balance"][0]), 6), round(float(s["content_dispersion"][0]), 6)
(1.351615, 0.565952)
>>> round(float(s["entropy"][0]), 6)
1.0889
"""

from __future__ import annotations

import math

import torch

#: ``sum z^2 / dispersion^2`` above which a row's dispersion is recomputed in two passes.
_CANCEL_LIMIT = 1e4


def _masked_mean(x: torch.Tensor, keep: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, x, 0.0).sum(-1) / n.clamp(min=1)


def _entropy(logp: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats of rows given as log-probabilities (masked entries ignored)."""
    return -torch.where(keep, logp.exp() * logp, 0.0).sum(-1)


def _row_stats_exact(z: torch.Tensor) -> dict[str, torch.Tensor]:
    """The two-pass reference of :func:`row_stats` (float64 throughout, masked via ``where``)."""
    z = z.to(torch.float64)
    keep = torch.isfinite(z)
    n = keep.sum(-1)
    nf = n.to(torch.float64)
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    max_prob, argmax = p.max(dim=-1)
    nan = torch.full_like(nf, math.nan)

    zc, keep_c = z[..., 1:], keep[..., 1:]
    has_sink = keep[..., 0]
    n_content = keep_c.sum(-1)
    n_c = n_content.to(torch.float64)
    mean_c = _masked_mean(zc, keep_c, n_c)
    balance = torch.sqrt((nf - 1).clamp(min=0) / nf.clamp(min=1)) * (z[..., 0] - mean_c)
    dev = torch.where(keep_c, zc - mean_c.unsqueeze(-1), 0.0)
    dispersion = torch.sqrt((dev * dev).sum(-1))
    logpi = torch.log_softmax(torch.where(keep_c, zc, -math.inf), dim=-1)
    content_h = _entropy(torch.nan_to_num(logpi, nan=-math.inf), keep_c)

    return {
        "n_keys": n,
        "sink_mass": p[..., 0],
        "max_prob": max_prob,
        "argmax": argmax,
        "entropy": _entropy(logp, keep),
        "sink_balance": torch.where(has_sink & (n >= 2), balance, nan),
        "content_entropy": torch.where(n_content >= 2, content_h, nan),
        "content_dispersion": torch.where(n_content >= 2, dispersion, nan),
    }


def row_col_stats(z: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``(row_stats(z), received(z))`` from one shared float64 softmax (see the module doc).

    A row holding NaN or ``+inf`` gets NaN ``max_prob`` (the capture's cheap non-finite test).
    """
    if z.shape[-1] == 0 or z.numel() == 0:
        return _row_stats_exact(z), torch.softmax(z.to(torch.float64), dim=-1).sum(-2)
    z64 = z.to(torch.float64)
    p = torch.softmax(z64, dim=-1)
    recv = p.sum(-2)
    max_prob, argmax = p.max(dim=-1)
    # n = unmasked (> -inf) logits, counted over bytes into int32 (a bool or int64 sum is several
    # times slower); NaN is not counted, +inf is, and either makes the whole row NaN
    n = (z > -math.inf).view(torch.uint8).sum(-1, dtype=torch.int32).to(torch.int64)
    nf = n.to(torch.float64)
    # key 0 is masked only in sliding-window rows past the window (Gemma-3): no sink in the row,
    # every unmasked key is content
    has_sink = z[..., 0] > -math.inf
    n_content = n - has_sink.to(torch.int64)
    # masked logits -> 0 so that plain row sums skip them (NaN / +inf kept: they surface as NaN)
    zf = torch.nan_to_num(z64, nan=math.nan, posinf=math.inf, neginf=0.0)
    z0 = zf[..., 0]
    zmax = torch.amax(z, dim=-1).to(torch.float64)
    lse = zmax - torch.log(max_prob)
    pz_c = torch.einsum("...j,...j->...", p[..., 1:], zf[..., 1:])
    # both are sums of non-negative terms: clamp the rounding of a near-zero result at 0
    entropy = (lse - (pz_c + p[..., 0] * z0)).clamp(min=0)
    entropy = torch.where(n > 0, entropy, 0.0)  # a fully masked row, as the two-pass form gives
    c = p[..., 1:].sum(-1)
    content_h = (lse + torch.log(c) - pz_c / c).clamp(min=0)

    n_cf = n_content.to(torch.float64)
    zc = zf[..., 1:]
    mean_c = zc.sum(-1) / n_cf.clamp(min=1)
    balance = torch.sqrt((nf - 1).clamp(min=0) / nf.clamp(min=1)) * (z0 - mean_c)
    sq_c = torch.linalg.vector_norm(zc, dim=-1).square()
    disp2 = sq_c - mean_c * mean_c * n_cf
    dispersion = torch.sqrt(disp2.clamp(min=0))

    nan = torch.full_like(nf, math.nan)
    out = {
        "n_keys": n,
        "sink_mass": p[..., 0],
        "max_prob": max_prob,
        "argmax": argmax,
        "entropy": entropy,
        "sink_balance": torch.where(has_sink & (n >= 2), balance, nan),
        "content_entropy": torch.where(n_content >= 2, content_h, nan),
        "content_dispersion": torch.where(n_content >= 2, dispersion, nan),
    }
    # rows whose one-pass forms may have lost precision: redo them in two passes
    redo = (n_content >= 2) & ~((c > 0) & (sq_c <= _CANCEL_LIMIT * disp2))
    if bool(redo.any()):
        exact = _row_stats_exact(z[redo])
        for k in ("content_entropy", "content_dispersion"):
            out[k] = out[k].clone()
            out[k][redo] = exact[k]
    return out, recv


def row_col_stats_set(z: torch.Tensor, sink) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """:func:`row_col_stats` with a sink *set* S of key positions (docs/metrics.md "Sink sets";
    vision families: [CLS] + distillation token, [CLS] + registers), in two passes, float64.

    Per row, over its unmasked keys split into S and the content keys C:
    ``sink_mass = sum_{j in S} p_j``; ``sink_balance = sqrt(|S||C| / (|S| + |C|)) (mean_{j in S}
    z_j - mean_{j in C} z_j)`` (NaN unless both groups are non-empty); ``content_entropy`` and
    ``content_dispersion`` of ``pi = softmax(z_C)`` (NaN for |C| < 2). With S = {0} these are
    :func:`row_col_stats`'s values (the capture uses that path for the default sink).

    >>> z = torch.log(torch.tensor([[0.3, 0.2, 0.1, 0.25, 0.15]], dtype=torch.float64))
    >>> r, _ = row_col_stats_set(z, (0, 1))
    >>> round(float(r["sink_mass"][0]), 6), round(float(r["content_entropy"][0]), 6)
    (0.5, 1.029653)
    """
    from attnbase.contract import sink_set

    z64 = z.to(torch.float64)
    k = z64.shape[-1]
    in_s = torch.zeros(k, dtype=torch.bool, device=z.device)
    in_s[[p for p in sink_set(sink) if p < k]] = True
    keep = z64 > -math.inf
    ks, kc = keep & in_s, keep & ~in_s
    n, n_s, n_c = keep.sum(-1), ks.sum(-1), kc.sum(-1)
    logp = torch.log_softmax(z64, dim=-1)
    p = logp.exp()
    max_prob, argmax = p.max(dim=-1)
    nan = torch.full(n.shape, math.nan, dtype=torch.float64, device=z.device)
    nsf, ncf = n_s.to(torch.float64), n_c.to(torch.float64)
    mean_s = _masked_mean(z64, ks, nsf)
    mean_c = _masked_mean(z64, kc, ncf)
    weight = torch.sqrt(nsf * ncf / (nsf + ncf).clamp(min=1))
    dev = torch.where(kc, z64 - mean_c.unsqueeze(-1), 0.0)
    logpi = torch.log_softmax(torch.where(kc, z64, -math.inf), dim=-1)
    content_h = _entropy(torch.nan_to_num(logpi, nan=-math.inf), kc)
    out = {
        "n_keys": n,
        "sink_mass": torch.where(ks, p, 0.0).sum(-1),
        "max_prob": max_prob,
        "argmax": argmax,
        "entropy": _entropy(logp, keep),
        "sink_balance": torch.where((n_s >= 1) & (n_c >= 1), weight * (mean_s - mean_c), nan),
        "content_entropy": torch.where(n_c >= 2, content_h, nan),
        "content_dispersion": torch.where(n_c >= 2, torch.sqrt((dev * dev).sum(-1)), nan),
    }
    return out, p.sum(-2)


def row_stats(z: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics of each attention row of ``z`` ``[..., query, key]`` -> dict of ``[..., query]``.

    Keys are :data:`~attnbase.contract.ROW_STAT_COLUMNS`:

    - ``n_keys``: unmasked keys n (int64); ``sink_mass`` = p_0; ``max_prob``, ``argmax`` (int64).
    - ``entropy`` H(p) in nats.
    - ``sink_balance`` b(p) = sqrt((n-1)/n) (z_0 - mean_{j>=1} z_j); NaN for n < 2 or key 0 masked.
    - ``content_entropy`` H(pi), pi = p_{1:} / (1 - p_0) = softmax(z_{1:}); NaN for n < 3.
    - ``content_dispersion`` C_perp = ||clr(pi)||_2 = ||z_{1:} - mean(z_{1:})||_2; NaN for n < 3.
    """
    return row_col_stats(z)[0]


def received(z: torch.Tensor) -> torch.Tensor:
    """Attention received by each key: ``sum_i A[i, key]`` over query rows -> ``[..., key]``."""
    return torch.softmax(z, dim=-1, dtype=torch.float64).sum(-2)
