"""Row/col statistics of every layer of a batch, kept on the logits' device (the torch path).

The capture's statistics on a GPU (and on the CPU with ``ATTNBASE_ROWSTATS=torch``): each
layer's statistics are computed as the layer runs, by :func:`layer_row_col_stats`, into
device-side arrays that hold every layer of the batch (:class:`BatchStats`); nothing is read
back to the host per layer (no ``.item()``, ``bool()``, ``.cpu()``, data-dependent indexing:
the tests run it on the ``meta`` device, where any of those fails), and all layers' results come
back in one copy per batch (:meth:`BatchStats.to_host`, asynchronous into pinned memory on
CUDA, waited for with the captures' one event).

The formulas are the compiled kernel's (:mod:`attnbase.extract.rowkernel`, docs/metrics.md
§3-4), in float64, written as whole-tensor operations: ``e_j = exp(z_j - z_max)`` with the
(first) argmax's term, exactly 1, left out of the sums and added as ``1 + rest`` (so an
entropy near 0 keeps its relative precision); the content terms likewise relative to the
content max (no underflowing ``c = 1 - p_0``, so no row needs the two-pass redo of
:func:`attnbase.extract.rowstats.row_col_stats`, whose ``bool(redo.any())`` was one host
synchronisation per layer); the content dispersion in two passes. A row holding NaN or ``+inf``
gets NaN everywhere (its ``max_prob`` NaN is the capture's non-finite test); a fully masked row
gets NaN probabilities and entropy 0.
"""

from __future__ import annotations

import math

import torch

from attnbase.contract import ROW_STAT_COLUMNS

#: the integer columns (held as float64 on the device: exact below 2**53, one array for all)
_INT_COLUMNS = ("n_keys", "argmax")


def _rest_sums(z: torch.Tensor, zmax: torch.Tensor, arg: torch.Tensor):
    """``(e, rest, sum_{j != arg} e_j, sum_{j != arg} e_j (zmax - z_j))`` with
    ``e_j = exp(z_j - zmax)`` (0 where masked, 1 at ``arg``); ``rest`` is ``e`` with its
    ``arg`` entry 0."""
    d = zmax.unsqueeze(-1) - z  # +inf where masked
    e = torch.exp(-d)
    rest = e.scatter(-1, arg.unsqueeze(-1), 0.0)
    return e, rest, rest.sum(-1), (rest * d.clamp(max=1e300)).sum(-1)


def layer_row_col_stats(z: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Row statistics (:data:`ROW_STAT_COLUMNS`, each ``[..., query]``, float64 with
    ``n_keys``/``argmax`` int64) and ``received`` ``[..., key]`` of logits ``z`` ``[..., query,
    key]`` (masked = ``-inf``), on ``z``'s device with no host synchronisation."""
    z = z.to(torch.float64)
    nan = math.nan
    live = z > -math.inf
    n = live.view(torch.uint8).sum(-1, dtype=torch.int32).to(torch.int64)
    zmax, arg = z.max(dim=-1)  # the first maximal index; NaN if the row holds one
    bad = torch.isnan(zmax) | (zmax == math.inf)  # a NaN or +inf logit
    void = bad | (n == 0)
    e, _, s_rest, sd = _rest_sums(z, zmax, arg)
    inv = 1.0 / (1.0 + s_rest)
    z0 = z[..., 0]
    has_sink = z0 > -math.inf
    n_c = n - has_sink.to(torch.int64)

    zc, live_c = z[..., 1:], live[..., 1:]
    zero = torch.zeros((), dtype=torch.float64, device=z.device)
    zc0 = torch.where(live_c, zc, zero)
    mean_c = torch.where(n_c > 0, zc0.sum(-1) / n_c.clamp(min=1), zero)
    nf = n.to(torch.float64)
    balance = torch.sqrt((nf - 1).clamp(min=0) / nf.clamp(min=1)) * (z0 - mean_c)
    if zc.shape[-1]:
        zmax_c, arg_c = zc.max(dim=-1)
        _, _, sc_rest, scd = _rest_sums(zc, zmax_c, arg_c)
        content_h = torch.log1p(sc_rest) + scd / (1.0 + sc_rest)
        dev = torch.where(live_c, zc - mean_c.unsqueeze(-1), zero)
        dispersion = torch.sqrt((dev * dev).sum(-1))
    else:
        content_h = dispersion = torch.full_like(zmax, nan)

    def valid(x, ok=None):
        ok = ~void if ok is None else ok & ~void
        return torch.where(ok, x, nan)

    out = {
        "n_keys": n,
        "sink_mass": valid(torch.where(has_sink, e[..., 0] * inv, zero)),
        "max_prob": valid(inv),
        "argmax": arg,
        "entropy": torch.where(bad, nan, torch.where(n == 0, zero, torch.log1p(s_rest) + sd * inv)),
        "sink_balance": valid(balance, has_sink & (n >= 2)),
        "content_entropy": valid(content_h, n_c >= 2),
        "content_dispersion": valid(dispersion, n_c >= 2),
    }
    recv = torch.where(void.unsqueeze(-1), nan, e * inv.unsqueeze(-1)).sum(-2)
    return out, recv


class BatchStats:
    """Every layer's statistics of one batch in two device arrays: ``rows`` ``[column, layer,
    head, seq, query]`` (float64; :data:`ROW_STAT_COLUMNS` order) and ``recv`` ``[layer, head,
    seq, key]``, filled layer by layer (:meth:`add`) and read back once (:meth:`to_host`)."""

    #: how many times any batch's statistics were read back to the host (one per batch); the
    #: tests count it
    host_copies = 0

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.rows: torch.Tensor | None = None
        self.recv: torch.Tensor | None = None
        self.seen: set[int] = set()

    def add(self, layer: int, z: torch.Tensor) -> None:
        """Layer ``layer``'s statistics from its logits ``z`` ``[batch, head, query, key]``
        (stored as ``[head, batch, ...]``, the captured arrays' layout); no host read."""
        r, c = layer_row_col_stats(z)
        if self.rows is None:
            b, h, q = r["n_keys"].shape
            self.rows = torch.empty((len(ROW_STAT_COLUMNS), self.n_layers, h, b, q),
                                    dtype=torch.float64, device=z.device)
            self.recv = torch.empty((self.n_layers, h, b, c.shape[-1]), dtype=torch.float64,
                                    device=z.device)
        for i, name in enumerate(ROW_STAT_COLUMNS):
            self.rows[i, layer] = r[name].transpose(0, 1)
        self.recv[layer] = c.transpose(0, 1)
        self.seen.add(layer)

    def to_host(self, stream: "torch.cuda.Stream | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, recv)`` on the host: on CUDA copied with ``non_blocking`` into fresh pinned
        memory on ``stream`` (ordered after the statistics' kernels; valid once the caller has
        waited for ``stream``), on the CPU the arrays themselves."""
        BatchStats.host_copies += 1
        if not self.rows.is_cuda:
            return self.rows, self.recv
        rows = torch.empty(self.rows.shape, dtype=self.rows.dtype, pin_memory=True)
        recv = torch.empty(self.recv.shape, dtype=self.recv.dtype, pin_memory=True)
        stream.wait_stream(torch.cuda.current_stream(self.rows.device))
        with torch.cuda.stream(stream):
            rows.copy_(self.rows, non_blocking=True)
            recv.copy_(self.recv, non_blocking=True)
        self.rows.record_stream(stream)
        self.recv.record_stream(stream)
        return rows, recv


def host_columns(rows: torch.Tensor, recv: torch.Tensor) -> tuple[dict, "object"]:
    """``(row_stats, received)`` numpy columns (flattened ``[layer, head, seq, query|key]``) of
    :meth:`BatchStats.to_host`'s arrays: the integer columns as int32, the rest float64 views."""
    flat = rows.reshape(len(ROW_STAT_COLUMNS), -1).numpy()
    cols = {}
    for i, name in enumerate(ROW_STAT_COLUMNS):
        cols[name] = flat[i].astype("int32") if name in _INT_COLUMNS else flat[i]
    return cols, recv.reshape(-1).numpy()
