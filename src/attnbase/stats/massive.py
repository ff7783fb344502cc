"""Massive activations in the residual stream (Sun et al. 2024, "Massive Activations in Large
Language Models"; docs/metrics.md §6b).

Per hidden state of a run that captured ``hidden`` (``layer`` = hidden index, 0 = embeddings),
over every (seq, pos, dim) entry ``h`` of that layer's block ``(seq, pos, d_model)``:

- ``massive_top1``, ``massive_top2``, ``massive_top3``: the three largest ``|h|`` at distinct
  (pos, dim) coordinates, each coordinate counted once with its largest over the sequences
  (so an activation every sequence repeats, as at a causal model's first token, is one value,
  not three); where the largest sits: its smallest (seq, pos, dim) among ties;
- ``massive_median``: the median ``|h|``, exact (two passes over the block: a histogram of
  ``log10 |h|`` finds the bins that hold the middle ranks, then only their values are sorted);
- ``massive_ratio`` = ``massive_top1 / massive_median``;
- ``massive_seq``, ``massive_pos``, ``massive_dim``, ``massive_token``: where the largest sits
  (its token id from the run's ``tokens``; NaN without them);
- ``massive_sink_share``: the share of sequences whose own largest ``|h|`` sits at one of the
  run's sink positions (``runs.sink_positions``; token 0 for text);
- ``massive_flag``: 1 where ``massive_top1 > MIN_ABS`` (100) and ``massive_ratio > MIN_RATIO``
  (1,000), Sun et al.'s "activations above 100 and about 1,000 times the median"; else 0.

The block is read once per layer by the analysis (as for the depth profile); this module walks
it :data:`SEQ_CHUNK` sequences at a time, so its temporaries are a chunk's size, never a second
copy of the layer. Non-finite entries (sequences not yet written read as NaN) are left out.
"""

from __future__ import annotations

import numpy as np

from attnbase.metrics import MASSIVE_MIN_ABS, MASSIVE_MIN_RATIO, N

#: Sun et al. 2024's thresholds of a massive activation: magnitude and ratio to the median
#: (declared beside the registry's massive_flag).
MIN_ABS, MIN_RATIO = MASSIVE_MIN_ABS, MASSIVE_MIN_RATIO
#: Sequences per step of the walk over a layer's block.
SEQ_CHUNK = 8
#: ``log10 |h|`` histogram of the median's first pass: bins per decade over [1e-30, 1e30];
#: smaller and larger values (and 0) fall into the end bins, which the second pass sorts alike.
_PER_DECADE, _LO, _HI = 64, -30, 30
_NBINS = (_HI - _LO) * _PER_DECADE + 2

#: The layer_metrics this module writes, in the order of :func:`massive_values`.
MASSIVE_LAYER_METRICS = (N.massive_top1, N.massive_top2, N.massive_top3, N.massive_median,
                         N.massive_ratio, N.massive_seq, N.massive_pos, N.massive_dim,
                         N.massive_token, N.massive_sink_share, N.massive_flag)


def _bins(a: np.ndarray) -> np.ndarray:
    """Histogram bin of each finite ``a >= 0``: 0 for 0 and anything below 1e-30, the last bin
    for anything from 1e30."""
    with np.errstate(divide="ignore"):
        lg = np.log10(a.astype(np.float64))
    b = np.floor((lg - _LO) * _PER_DECADE) + 1
    return np.clip(np.nan_to_num(b, nan=0.0, neginf=0.0, posinf=_NBINS - 1), 0,
                   _NBINS - 1).astype(np.int64)


def _chunks(block: np.ndarray):
    for s0 in range(0, block.shape[0], SEQ_CHUNK):
        yield s0, np.abs(np.asarray(block[s0:s0 + SEQ_CHUNK]))


def massive_activations(block, sink=(0,), tokens=None) -> dict[str, float]:
    """The massive-activation statistics of one hidden state's block ``(seq, pos, d_model)``
    (module docstring), keyed by :data:`MASSIVE_LAYER_METRICS`; ``tokens`` ``(seq, pos)`` ids.

    >>> x = np.ones((2, 4, 3), dtype=np.float32); x[1, 0, 2] = -5000.0
    >>> m = massive_activations(x)
    >>> m["massive_top1"], m["massive_ratio"], m["massive_pos"], m["massive_dim"], m["massive_flag"]
    (5000.0, 5000.0, 0.0, 2.0, 1.0)
    """
    block = np.asarray(block) if not hasattr(block, "shape") else block
    if len(block.shape) != 3:
        raise ValueError(f"a hidden block is (seq, pos, d_model), got shape {block.shape}")
    n_seq, n_pos, d = (int(s) for s in block.shape)
    sink_set = {int(p) for p in sink}
    counts = np.zeros(_NBINS, dtype=np.int64)
    # per (pos, dim): the largest |h| over the sequences so far and the first sequence holding it
    coord_max = np.full(n_pos * d, -1.0, dtype=np.float64)
    coord_seq = np.zeros(n_pos * d, dtype=np.int64)
    at_sink = seqs = 0
    for s0, a in _chunks(block):
        fin = np.isfinite(a)
        counts += np.bincount(_bins(a[fin]), minlength=_NBINS)
        af = np.where(fin, a, -1.0).reshape(a.shape[0], -1)
        best = af.argmax(axis=1)
        real = af[np.arange(a.shape[0]), best] >= 0
        seqs += int(real.sum())
        at_sink += int(sum((int(i) // d) in sink_set for i in best[real]))
        s_best = af.argmax(axis=0)
        v_best = af[s_best, np.arange(af.shape[1])]
        better = v_best > coord_max
        coord_max[better] = v_best[better]
        coord_seq[better] = s0 + s_best[better]
    n = int(counts.sum())
    nan = float("nan")
    out = dict.fromkeys(MASSIVE_LAYER_METRICS, nan)
    if n == 0:
        return out
    k = min(3, coord_max.size)
    vals = np.sort(coord_max[np.argpartition(coord_max, coord_max.size - k)[coord_max.size - k:]])
    tops = [float(v) if v >= 0 else nan for v in vals[::-1]] + [nan] * (3 - k)
    # where the largest sits: among the coordinates holding it, the smallest (seq, pos, dim)
    tied = np.flatnonzero(coord_max == vals[-1])
    i = int(tied[np.lexsort((tied % d, tied // d, coord_seq[tied]))[0]])
    top, s, p, dim = tops[0], int(coord_seq[i]), i // d, i % d
    median = _median(block, counts, n)
    ratio = top / median if median > 0 else float("inf")
    token = nan
    if tokens is not None:
        token = float(np.asarray(tokens)[s, p])
    out.update({N.massive_top1: tops[0], N.massive_top2: tops[1], N.massive_top3: tops[2],
                N.massive_median: median, N.massive_ratio: ratio, N.massive_seq: float(s),
                N.massive_pos: float(p), N.massive_dim: float(dim), N.massive_token: token,
                N.massive_sink_share: at_sink / seqs if seqs else nan,
                N.massive_flag: float(top > MIN_ABS and ratio > MIN_RATIO)})
    return out


def _median(block, counts: np.ndarray, n: int) -> float:
    """The exact median of the block's finite ``|h|`` (``counts``: its histogram): the values of
    the bins holding ranks ``(n - 1) // 2`` and ``n // 2``, sorted."""
    lo_rank, hi_rank = (n - 1) // 2, n // 2
    cum = np.cumsum(counts)
    b_lo = int(np.searchsorted(cum, lo_rank, side="right"))
    b_hi = int(np.searchsorted(cum, hi_rank, side="right"))
    below = int(cum[b_lo - 1]) if b_lo > 0 else 0
    vals = []
    for _, a in _chunks(block):
        a = a[np.isfinite(a)]
        b = _bins(a)
        vals.append(a[(b >= b_lo) & (b <= b_hi)].astype(np.float64))
    v = np.sort(np.concatenate(vals))
    return float((v[lo_rank - below] + v[hi_rank - below]) / 2.0)


def run_tokens(store) -> np.ndarray | None:
    """A run's ``tokens (seq, pos)`` (where the largest activation sits), or None without."""
    return store.read("tokens") if "tokens" in store.names() else None


def massive_values(stats: dict[str, float]) -> list[tuple[str, float]]:
    """``(metric, value)`` of :func:`massive_activations`, in :data:`MASSIVE_LAYER_METRICS`
    order (the layer rows of one hidden state)."""
    return [(name, float(stats[name])) for name in MASSIVE_LAYER_METRICS]
