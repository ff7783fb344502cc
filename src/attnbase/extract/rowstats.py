"""Per-row and per-column attention statistics computed at capture time (METRICS.md §3-4).

Input everywhere: scaled pre-softmax logits ``z`` of shape ``[..., query, key]`` with masked
entries ``-inf``; the unmasked prefix of a row always contains key 0 (the sink). All math is
vectorised over rows in float64. Because ``clr(softmax(z)) = z - mean(z)`` exactly on the unmasked
prefix, the Aitchison quantities are computed from ``z`` directly and never need zero replacement
(Aitchison, *The Statistical Analysis of Compositional Data*, 1986).

Example (METRICS.md §4 reference row p = (.6, .2, .1, .1), logits z = ln p):

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



def _masked_mean(x: torch.Tensor, keep: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, x, 0.0).sum(-1) / n.clamp(min=1)


def _entropy(logp: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats of rows given as log-probabilities (masked entries ignored)."""
    return -torch.where(keep, logp.exp() * logp, 0.0).sum(-1)


def row_stats(z: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics of each attention row of ``z`` ``[..., query, key]`` -> dict of ``[..., query]``.

    Keys are :data:`~attnbase.extract.types.ROW_STAT_COLUMNS`:

    - ``n_keys``: unmasked keys n (int64); ``sink_mass`` = p_0; ``max_prob``, ``argmax`` (int64).
    - ``entropy`` H(p) in nats.
    - ``sink_balance`` b(p) = sqrt((n-1)/n) (z_0 - mean_{j>=1} z_j); NaN for n < 2.
    - ``content_entropy`` H(pi), pi = p_{1:} / (1 - p_0) = softmax(z_{1:}); NaN for n < 3.
    - ``content_dispersion`` C_perp = ||clr(pi)||_2 = ||z_{1:} - mean(z_{1:})||_2; NaN for n < 3.
    """
    z = z.to(torch.float64)
    keep = torch.isfinite(z)
    n = keep.sum(-1)
    nf = n.to(torch.float64)
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    max_prob, argmax = p.max(dim=-1)
    nan = torch.full_like(nf, math.nan)

    zc, keep_c = z[..., 1:], keep[..., 1:]
    n_c = (n - 1).to(torch.float64)
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
        "sink_balance": torch.where(n >= 2, balance, nan),
        "content_entropy": torch.where(n >= 3, content_h, nan),
        "content_dispersion": torch.where(n >= 3, dispersion, nan),
    }


def received(z: torch.Tensor) -> torch.Tensor:
    """Attention received by each key: ``sum_i A[i, key]`` over query rows -> ``[..., key]``."""
    return torch.softmax(z.to(torch.float64), dim=-1).sum(-2)

