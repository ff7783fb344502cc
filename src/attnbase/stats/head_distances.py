"""Head-to-head distances under two sink conventions (docs/metrics.md §5).

Papamichalis & Ruane, "Attention Rows as Compositional Data", §5: a head is represented by its
attention rows on one shared set of ``(seq, query)`` positions (queries ``i >= min_query``), and a
head-to-head distance is the mean, over that set, of a row dissimilarity between the two heads'
rows at the same position. Dissimilarities (names as stored in ``head_distances``):

- ``cosine`` ``1 - p.q / (|p| |q|)``; ``js`` Jensen-Shannon divergence (natural log, not its
  square root); ``euclidean`` ``|p - q|_2``;
- ``aitchison`` ``d_A = ||clr p - clr q||`` -- under ``drop_sink`` it is d_A of the content
  compositions, i.e. ``d_A_perp``;
- ``aitchison_perp`` ``d_A_perp``: the sink is dropped by definition, so its value is the same
  under both conventions (stored under both so every dissimilarity has both).

Conventions: ``with_sink`` uses the full row ``p = softmax(z)``; ``drop_sink`` the content
composition ``pi = p_{1:} / (1 - p_0) = softmax(z_{1:})``.

Computation (what keeps it fast and memory bounded): rows arrive in blocks ``(head, row, key)``
of logits -- all heads of the run at the same positions, keys trimmed to the block's longest
prefix -- and are folded into running sums of ``(head, head)`` matrices. Cosine, Euclidean and
Aitchison come from per-row Gram matrices ``X X^T`` (batched matmul, float64); JS from
``H(m) - (H(p) + H(q)) / 2`` with the mixture entropy evaluated pairwise over the upper triangle
and each row's live keys only, by a compiled kernel (:mod:`attnbase.stats.jskernel`: float32
mixtures and logarithm, float64 sums). Nothing holds more than one row block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnbase.contract import DEFAULT_SINK, content_keys, sink_keys, sink_set
from attnbase.errors import StatsError
from attnbase.logits import softmax

__all__ = [
    "DISSIMILARITIES",
    "CONVENTIONS",
    "row_dissimilarity",
    "HeadDistanceAccumulator",
]

DISSIMILARITIES: tuple[str, ...] = ("cosine", "js", "euclidean", "aitchison", "aitchison_perp")
CONVENTIONS: tuple[str, ...] = ("with_sink", "drop_sink")


def _check_names(dissimilarities) -> tuple[str, ...]:
    bad = [d for d in dissimilarities if d not in DISSIMILARITIES]
    if bad:
        raise StatsError(f"unknown dissimilarity {bad[0]!r}; choose from {', '.join(DISSIMILARITIES)}")
    return tuple(dissimilarities)


def row_dissimilarity(name: str, z_a, z_b, convention: str = "with_sink",
                      sink=DEFAULT_SINK) -> np.ndarray:
    """Reference (numpy, float64) row dissimilarity between logit rows ``(..., key)`` -> ``(...)``.

    Rows compared must share their unmasked keys. This is the per-row quantity whose mean over
    the shared row set :class:`HeadDistanceAccumulator` computes with matrix algebra.
    ``drop_sink`` removes every key of ``sink`` (docs/metrics.md "Sink sets") and renormalises.

    Examples
    --------
    >>> import numpy as np
    >>> za, zb = np.log([.6, .2, .1, .1]), np.log([.3, .3, .2, .2])
    >>> round(float(row_dissimilarity("aitchison", za, zb)), 6)
    1.141939
    >>> round(float(row_dissimilarity("aitchison", za, zb, "drop_sink")), 6)
    0.234891
    >>> round(float(row_dissimilarity("euclidean", za, zb)), 6)
    0.34641
    """
    from attnbase.stats import compositional as comp

    _check_names([name])
    if convention not in CONVENTIONS:
        raise StatsError(f"unknown convention {convention!r}; choose from {', '.join(CONVENTIONS)}")
    z_a, z_b = np.asarray(z_a, dtype=np.float64), np.asarray(z_b, dtype=np.float64)
    if name == "aitchison_perp" or (name == "aitchison" and convention == "drop_sink"):
        return comp.aitchison_perp_distance(z_a, z_b, sink)
    if name == "aitchison":
        return comp.aitchison_distance(z_a, z_b)
    if convention == "drop_sink":
        ci = content_keys(sink, z_a.shape[-1])
        z_a, z_b = z_a[..., ci], z_b[..., ci]
    p, q = softmax(z_a), softmax(z_b)
    if name == "cosine":
        return 1.0 - (p * q).sum(-1) / np.sqrt((p * p).sum(-1) * (q * q).sum(-1))
    if name == "euclidean":
        return np.sqrt(((p - q) ** 2).sum(-1))
    from scipy.special import xlogy

    m = (p + q) / 2
    h = lambda x: -xlogy(x, x).sum(-1)  # noqa: E731
    return np.maximum(h(m) - (h(p) + h(q)) / 2, 0.0)


def _clr(z: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    n = keep.sum(-1, keepdim=True).clamp(min=1)
    zf = torch.where(keep, z, 0.0)
    return torch.where(keep, zf - zf.sum(-1, keepdim=True) / n, 0.0)


def _gram_sums(x: torch.Tensor, cosine: bool, euclidean: bool) -> dict[str, torch.Tensor]:
    """Row sums of cosine distances and Euclidean distances between heads, ``x (row, head,
    key)`` -> ``{"cosine"|"euclidean": (head, head)}``, from the per-row Gram matrices; the
    ``(row, head, head)`` work happens in place in the Gram buffer (a fresh tensor per step
    had the kernel page-faulting more than the arithmetic took)."""
    g = torch.bmm(x, x.transpose(1, 2))
    sq = torch.diagonal(g, dim1=1, dim2=2).clone()
    out = {}
    if cosine:
        nrm = sq.sqrt()
        c = torch.div(g, nrm.unsqueeze(2))
        c.div_(nrm.unsqueeze(1))
        out["cosine"] = c.shape[0] - c.sum(0)
        del c
    if euclidean:
        d = g.mul_(-2.0).add_(sq.unsqueeze(2)).add_(sq.unsqueeze(1)).clamp_(min=0).sqrt_()
        out["euclidean"] = d.sum(0)
    return out


#: Rows per step of :meth:`HeadDistanceAccumulator.add`: keeps each ``(row, head, head)``
#: float64 Gram buffer at ~9 MB for 270 heads (malloc reuses it instead of mapping it anew).
_ROWS_PER_STEP = 16


@dataclass
class HeadDistanceAccumulator:
    """Running sums of row dissimilarities between every pair of heads.

    ``add(z)`` takes logits ``z (head, row, key)`` (torch or numpy; masked keys ``-inf``; every
    head at the same rows, every row with >= 3 unmasked keys so ``drop_sink`` has content
    geometry); ``drop_sink`` drops every key of ``sink``; :meth:`result` returns ``{(dissimilarity, convention): (head, head) float64}`` --
    the mean over all rows added, symmetric with an exactly zero diagonal.
    """

    n_heads: int
    dissimilarities: tuple[str, ...] = DISSIMILARITIES
    sink: tuple[int, ...] = DEFAULT_SINK
    n_rows: int = 0
    _sums: dict = field(default_factory=dict, repr=False)
    _units: list = field(default_factory=list, repr=False)  #: closed units' partial sums
    _last: dict = field(default_factory=dict, repr=False)
    _last_rows: int = 0

    def __post_init__(self) -> None:
        self.dissimilarities = _check_names(self.dissimilarities)
        self.sink = sink_set(self.sink)
        for d in self.dissimilarities:
            for c in CONVENTIONS:
                if d == "aitchison_perp" and c == "with_sink":
                    continue  # identical to drop_sink by definition: filled in by result()
                self._sums[(d, c)] = torch.zeros(self.n_heads, self.n_heads, dtype=torch.float64)

    def add(self, z) -> None:
        z = torch.as_tensor(z)
        if z.ndim != 3 or z.shape[0] != self.n_heads:
            raise StatsError(f"a row block must have shape (head={self.n_heads}, row, key); "
                             f"got {tuple(z.shape)}")
        if z.shape[1] == 0:
            return
        z = z.to(torch.float64).transpose(0, 1)  # (row, head, key)
        keep = torch.isfinite(z)
        si = self._index(sink_keys(self.sink, z.shape[-1]))
        if not bool(keep[..., si].all()):
            raise StatsError("some rows have their sink key masked (sliding-window layers); "
                             "head distances need key 0 in every row: restrict the run's "
                             "queries to the window (--max-rows cannot fix this)")
        if bool((keep.sum(-1) < len(self.sink) + 2).any()):
            raise StatsError(f"head distances need rows with >= {len(self.sink) + 2} unmasked keys "
                             f"(min_query >= {len(self.sink) + 1})")
        for r0 in range(0, z.shape[0], _ROWS_PER_STEP):
            self._add_rows(z[r0:r0 + _ROWS_PER_STEP], keep[r0:r0 + _ROWS_PER_STEP])
        self.n_rows += z.shape[0]

    def _add_rows(self, z: torch.Tensor, keep: torch.Tensor) -> None:
        want = set(self.dissimilarities)
        for conv in CONVENTIONS:
            ci = self._index(content_keys(self.sink, z.shape[-1]))
            zc, kc = (z, keep) if conv == "with_sink" else (z[..., ci], keep[..., ci])
            p = torch.softmax(torch.where(kc, zc, -torch.inf), dim=-1)
            if want & {"cosine", "euclidean"}:
                for name, v in _gram_sums(p, "cosine" in want, "euclidean" in want).items():
                    self._sums[(name, conv)] += v
            if want & {"aitchison", "aitchison_perp"}:
                d = _gram_sums(_clr(zc, kc), False, True)["euclidean"]
                if "aitchison" in want:
                    self._sums[("aitchison", conv)] += d
                if conv == "drop_sink" and "aitchison_perp" in want:
                    self._sums[("aitchison_perp", conv)] += d
            if "js" in want:
                self._sums[("js", conv)] += self._js(p, kc)

    @staticmethod
    def _index(ix):
        """A key index for torch: slices as they are, arrays as int64 tensors."""
        return ix if isinstance(ix, slice) else torch.as_tensor(ix, dtype=torch.int64)

    @staticmethod
    def _js(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Sum over rows of JS(p_a, p_b) for ``p (row, head, key)``: the compiled pairwise pass
        (:mod:`attnbase.stats.jskernel`) over each row's live key prefix."""
        from attnbase.stats.jskernel import js_pair_sums

        live = keep.any(1)  # (row, key): some head sees the key
        k = live.shape[-1]
        n_keys = k - torch.flip(live, dims=(-1,)).to(torch.int8).argmax(-1)
        n_keys = torch.where(live.any(-1), n_keys, 0)
        h = torch.special.entr(p).sum(-1)  # (row, head) float64
        return torch.from_numpy(js_pair_sums(p.numpy(), n_keys.numpy(), h.numpy()))

    def end_unit(self) -> None:
        """Close a bootstrap unit: the rows added since the previous call are one unit's
        partial sums (upper triangle of the symmetrised sums; docs/metrics.md §5). Call it
        after each unit (a sequence or a block of them), also for a unit that added no rows."""
        iu = np.triu_indices(self.n_heads, 1)
        part = {}
        for key, s in self._sums.items():
            m = s.numpy()
            tri = (m[iu] + m.T[iu]) / 2
            prev = self._last.get(key)
            part[key] = tri - prev if prev is not None else tri.copy()
            self._last[key] = tri
        self._units.append((part, self.n_rows - self._last_rows))
        self._last_rows = self.n_rows

    def parts(self):
        """The closed units as :class:`attnbase.stats.text_bootstrap.SeqParts` (with
        ``aitchison_perp`` under both conventions, as :meth:`result`)."""
        from attnbase.stats.text_bootstrap import SeqParts

        if not self._units:
            raise StatsError("no bootstrap unit was closed (call end_unit after each sequence)")
        sums = {key: np.stack([u[0][key] for u in self._units]) for key in self._sums}
        if ("aitchison_perp", "drop_sink") in sums:
            sums[("aitchison_perp", "with_sink")] = sums[("aitchison_perp", "drop_sink")]
        return SeqParts(sums, np.array([u[1] for u in self._units], dtype=np.float64),
                        self.n_heads)

    def result(self) -> dict[tuple[str, str], np.ndarray]:
        if self.n_rows == 0:
            raise StatsError("no rows were added; the shared row set is empty (check min_query)")
        out = {}
        for key, s in self._sums.items():
            m = (s / self.n_rows).numpy().copy()
            m = (m + m.T) / 2  # float rounding of the Gram terms is not exactly symmetric
            np.fill_diagonal(m, 0.0)
            out[key] = m
        if ("aitchison_perp", "drop_sink") in out:
            out[("aitchison_perp", "with_sink")] = out[("aitchison_perp", "drop_sink")].copy()
        return out
