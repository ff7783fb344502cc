"""The text as the sample: bootstrap replicates of head distance matrices (docs/metrics.md §5).

A head-to-head distance is a mean over the run's shared rows, and the rows come from a few
sequences: a statistic of the distance matrices (a reversal rate, an ARI) is as uncertain as the
text it was measured on. The distances study therefore keeps, next to the matrices, the
*per-sequence partial sums* of every head distance (:class:`SeqParts`: one upper triangle per
bootstrap unit and the rows it holds). A bootstrap replicate draws the units with replacement
(multinomial counts ``w``) and is the weighted mean ``sum_u w_u S_u / sum_u w_u n_u``: a weighted
sum of stored arrays, no new pass over the logits.

A unit is one sequence; runs with more than :data:`MAX_UNITS` sequences group consecutive
sequences into that many units (sequences are independent draws of the corpus, so blocks of
them are too), which bounds the file at ``MAX_UNITS x pairs x matrices`` float64.

The interval of a statistic is the percentile interval of its replicates
(:func:`percentile_interval`); :func:`widen` adds an independent sampling error in quadrature
to both sides (the triplet-sampling error of a sampled reversal rate).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from attnbase.errors import StatsError
from attnbase.stats.defaults import BOOT

__all__ = ["BOOT", "MAX_UNITS", "SeqParts", "unit_of_seq", "percentile_interval", "widen",
           "parts_path", "save_parts", "load_parts"]

#: At most this many bootstrap units (sequences, or blocks of consecutive sequences).
MAX_UNITS = 64
#: Two-sided coverage of every reported interval.
LEVEL = 0.95


def unit_of_seq(n_seqs: int, max_units: int = MAX_UNITS) -> np.ndarray:
    """Bootstrap unit of each sequence ``(seq,)``: the sequence itself up to ``max_units``
    sequences, else ``max_units`` blocks of consecutive sequences.

    Examples
    --------
    >>> unit_of_seq(3).tolist()
    [0, 1, 2]
    >>> unit_of_seq(6, max_units=3).tolist()
    [0, 0, 1, 1, 2, 2]
    """
    units = min(n_seqs, max_units)
    return (np.arange(n_seqs) * units) // max(n_seqs, 1)


@dataclass
class SeqParts:
    """Per-unit partial sums of head distances: ``sums[(dissimilarity, convention)]`` is
    ``(unit, pair)`` over the upper-triangle pairs of ``n_heads`` heads (``np.triu_indices(n, 1)``
    order), ``n_rows (unit,)`` the rows each unit holds."""

    sums: dict[tuple[str, str], np.ndarray]
    n_rows: np.ndarray
    n_heads: int

    @property
    def n_units(self) -> int:
        return int(len(self.n_rows))

    def _square(self, tri: np.ndarray) -> np.ndarray:
        m = np.zeros((self.n_heads, self.n_heads))
        iu = np.triu_indices(self.n_heads, 1)
        m[iu] = tri
        return m + m.T

    def matrices(self, keys, weights: np.ndarray | None = None) -> dict[tuple[str, str], np.ndarray]:
        """Weighted mean distance matrices ``{key: (head, head)}``; ``weights (unit,)`` default
        ones (the point estimate, equal to the stored ``head_distances``)."""
        w = np.ones(self.n_units) if weights is None else np.asarray(weights, dtype=np.float64)
        rows = float(w @ self.n_rows)
        if rows <= 0:
            raise StatsError("a bootstrap replicate holds no rows (every drawn sequence is empty)")
        return {k: self._square(w @ self.sums[k] / rows) for k in keys}

    def replicates(self, keys, boot: int = BOOT, seed: int = 0):
        """``boot`` seeded bootstrap replicates: yields ``{key: (head, head)}`` per replicate."""
        if self.n_units < 2:
            raise StatsError(f"a bootstrap over the text needs >= 2 sequences; this run has "
                             f"{self.n_units}")
        rng = np.random.default_rng(seed)
        for _ in range(boot):
            w = rng.multinomial(self.n_units, np.full(self.n_units, 1 / self.n_units))
            if w @ self.n_rows == 0:  # every drawn unit is empty: draw again (a bounded loop)
                for _ in range(100):
                    w = rng.multinomial(self.n_units, np.full(self.n_units, 1 / self.n_units))
                    if w @ self.n_rows > 0:
                        break
            yield self.matrices(keys, w)


def percentile_interval(values, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates.

    Examples
    --------
    >>> [round(x, 6) for x in percentile_interval(np.arange(101) / 100)]
    [0.025, 0.975]
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo, hi = np.quantile(v, [a, 1 - a])
    return float(lo), float(hi)


def widen(estimate: float, low: float, high: float, se: float, level: float = LEVEL,
          bounds: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float]:
    """Add an independent error of standard error ``se`` to both sides of ``[low, high]`` in
    quadrature (half-widths ``sqrt(h^2 + (z se)^2)``), clipped to ``bounds``.

    Examples
    --------
    >>> widen(0.5, 0.4, 0.6, 0.0)
    (0.4, 0.6)
    >>> [round(x, 4) for x in widen(0.5, 0.5, 0.5, 0.01)]
    [0.4804, 0.5196]
    """
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    lo = estimate - float(np.hypot(estimate - low, z * se))
    hi = estimate + float(np.hypot(high - estimate, z * se))
    return max(bounds[0], lo), min(bounds[1], hi)


# --- storage: one .npz per distances study, in the run's directory or prefix ---------------------
def parts_path(run, study_id: str):
    """Where a distances study keeps its per-sequence partial sums: ``distance_parts/`` of the
    run's own place (``run``: its :class:`~attnbase.warehouse.runs.handle.RunHandle`; the
    database directory's ``runs/<run_id>/`` or the run's prefix on object storage, so any
    machine of a team reads them; deleted with the run)."""
    return run.base / "distance_parts" / f"{study_id}.npz"


def save_parts(run, study_id: str, parts: SeqParts) -> None:
    """Write whole (a temporary file, fsync and rename locally; one PUT on object storage): a
    reader sees the whole file or none."""
    buf = io.BytesIO()
    arrays = {f"{d}|{c}": v for (d, c), v in parts.sums.items()}
    np.savez(buf, n_rows=parts.n_rows, n_heads=np.int64(parts.n_heads), **arrays)
    run.put(parts_path(run, study_id), buf.getbuffer())


def load_parts(run, study_id: str) -> SeqParts:
    """The partial sums :func:`save_parts` wrote; :class:`FileNotFoundError` where none."""
    with np.load(io.BytesIO(run.get(parts_path(run, study_id)))) as z:
        sums = {tuple(k.split("|", 1)): z[k] for k in z.files if "|" in k}
        return SeqParts(sums, z["n_rows"].astype(np.float64), int(z["n_heads"]))
