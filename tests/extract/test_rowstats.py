"""Row / column attention statistics against docs/metrics.md §4 reference values and a direct loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnbase.extract.rowstats import received, row_col_stats, row_stats
from attnbase.contract import ROW_STAT_COLUMNS

P = (0.6, 0.2, 0.1, 0.1)


def test_reference_values():
    z = torch.log(torch.tensor([P], dtype=torch.float64))
    s = row_stats(z)
    assert tuple(s) == ROW_STAT_COLUMNS
    assert float(s["sink_balance"][0]) == pytest.approx(1.351615, abs=1e-6)
    assert float(s["content_dispersion"][0]) == pytest.approx(0.565952, abs=1e-6)
    assert float(s["entropy"][0]) == pytest.approx(1.088900, abs=1e-6)
    # H(p) = H_b(s) + (1 - s) H(pi)   (docs/metrics.md §4, H_b(0.6) = 0.673012)
    assert 0.673012 + 0.4 * float(s["content_entropy"][0]) == pytest.approx(1.088900, abs=1e-6)
    assert int(s["n_keys"][0]) == 4 and int(s["argmax"][0]) == 0
    assert float(s["sink_mass"][0]) == pytest.approx(0.6) and float(s["max_prob"][0]) == pytest.approx(0.6)
    # ||clr p||^2 = b^2 + C_perp^2
    clr = z[0] - z[0].mean()
    assert float(clr @ clr) == pytest.approx(float(s["sink_balance"][0] ** 2 + s["content_dispersion"][0] ** 2))


def test_shift_invariance_and_masking():
    z = torch.log(torch.tensor([P], dtype=torch.float64)) + 7.0
    padded = torch.cat([z, torch.full((1, 3), -math.inf, dtype=torch.float64)], dim=1)
    a, b = row_stats(z), row_stats(padded)
    for k in ROW_STAT_COLUMNS:
        assert float(a[k][0]) == pytest.approx(float(b[k][0]), abs=1e-12), k


def test_small_rows_nan():
    z = torch.tensor([[0.0, -math.inf, -math.inf], [0.3, 0.1, -math.inf], [0.3, 0.1, 0.2]], dtype=torch.float64)
    s = row_stats(z)
    assert s["n_keys"].tolist() == [1, 2, 3]
    assert float(s["sink_mass"][0]) == 1.0 and float(s["entropy"][0]) == 0.0
    assert math.isnan(s["sink_balance"][0]) and not math.isnan(s["sink_balance"][1])
    for k in ("content_entropy", "content_dispersion"):
        assert math.isnan(s[k][0]) and math.isnan(s[k][1]) and not math.isnan(s[k][2])


def _loop_reference(z: np.ndarray) -> dict[str, float]:
    keep = np.isfinite(z)
    zz = z[keep]
    n = len(zz)
    p = np.exp(zz - zz.max())
    p /= p.sum()
    out = {"n_keys": n, "sink_mass": p[0], "max_prob": p.max(), "argmax": int(p.argmax()),
           "entropy": -np.sum(p * np.log(p))}
    out["sink_balance"] = math.sqrt((n - 1) / n) * (np.log(p[0]) - np.log(p[1:]).mean()) if n >= 2 else math.nan
    if n >= 3:
        pi = p[1:] / (1 - p[0])
        clr = np.log(pi) - np.log(pi).mean()
        out["content_entropy"] = -np.sum(pi * np.log(pi))
        out["content_dispersion"] = math.sqrt(clr @ clr)
    else:
        out["content_entropy"] = out["content_dispersion"] = math.nan
    return out


def test_vectorised_matches_loop_on_causal_rows():
    rng = np.random.default_rng(0)
    t = 7
    z = rng.normal(scale=3.0, size=(2, 3, t, t))
    z[..., ~np.tril(np.ones((t, t), bool))] = -np.inf
    s = {k: v.numpy() for k, v in row_stats(torch.from_numpy(z)).items()}
    for idx in np.ndindex(2, 3, t):
        ref = _loop_reference(z[idx])
        for k, v in ref.items():
            np.testing.assert_allclose(s[k][idx], v, rtol=1e-10, atol=1e-12, err_msg=f"{k} {idx}")


def test_received_sums_rows():
    t = 5
    z = torch.randn(3, t, t, dtype=torch.float64)
    z = z.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    r = received(z)
    assert r.shape == (3, t)
    torch.testing.assert_close(r.sum(-1), torch.full((3,), float(t), dtype=torch.float64))
    torch.testing.assert_close(r, torch.softmax(z, -1).sum(-2))


def _kernel_vs_reference(z: torch.Tensor, rtol: float, atol: float = 1e-13) -> None:
    """``atol``: the reference's own float64 rounding of ``lse - sum p z`` for entropies near 0
    (~1e-16 x lse); the kernel sums ``S - 1`` directly and is the more precise one there."""
    from attnbase.extract import rowkernel

    ref, ref_recv = row_col_stats(z)
    got, got_recv = rowkernel.row_col_stats_np(z.numpy())
    for k, v in ref.items():
        a = v.numpy()
        if a.dtype.kind in "iu":
            np.testing.assert_array_equal(got[k], a, err_msg=k)
        else:
            np.testing.assert_allclose(got[k], a, rtol=rtol, atol=atol, equal_nan=True, err_msg=k)
    np.testing.assert_allclose(got_recv, ref_recv.numpy(), rtol=rtol, atol=atol, equal_nan=True)


def test_compiled_kernel_matches_the_float64_reference():
    """The capture's one-pass kernel agrees with the float64 torch path to 1e-9 relative on
    causal rows (1..T keys) with and without a dominant sink, and on unmasked (BERT) rows."""
    g = torch.Generator().manual_seed(3)
    T = 32
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for sink in (0.0, 6.0, 30.0):
        z = torch.randn(2, 3, T, T, generator=g) * 2
        z[..., 0] += sink
        _kernel_vs_reference(z.masked_fill(causal, -math.inf), rtol=1e-9)
        _kernel_vs_reference(z, rtol=1e-9)


def test_compiled_kernel_edge_rows():
    """A NaN or +inf logit makes the row's max_prob NaN (the capture's non-finite test); a
    fully masked row has NaN probabilities and entropy 0, as in the torch path."""
    from attnbase.extract import rowkernel

    z = torch.zeros(1, 1, 3, 4)
    z[0, 0, 0, 2] = math.nan
    z[0, 0, 1, 1] = math.inf
    z[0, 0, 2] = -math.inf
    got, _ = rowkernel.row_col_stats_np(z.numpy())
    assert np.isnan(got["max_prob"][0, 0]).all()
    assert got["entropy"][0, 0, 2] == 0 and got["n_keys"][0, 0, 2] == 0


def test_vectorised_exp_matches_libm():
    """The kernel's SIMD ``exp`` (rowkernel._exp_neg) against numpy's: within 1.5 ulp over the
    normal range, the same subnormals to an ulp of the smallest, 0 past the underflow, and
    exactly 1 at 0 (the argmax's term)."""
    from attnbase.extract import rowkernel

    rowkernel.warm()  # compiles the helpers and binds them in the module
    d = np.concatenate([[0.0, np.inf, 1e-300, 5e-324], np.logspace(-18, 3.05, 20000),
                        [700.0, 708.3, 708.4, 709.8, 730.0, 744.4, 745.2, 746.0, 1e6],
                        np.random.default_rng(0).uniform(0, 50, 20000)])
    e = np.empty_like(d)
    bits = np.empty(2 * d.size, np.int64)
    rowkernel._exp_neg(d, e, bits, bits.view(np.float64))
    want = np.exp(-d)
    normal = want >= np.finfo(np.float64).tiny
    assert e[0] == 1.0 and e[1] == 0.0
    rel = np.abs(e[normal] - want[normal]) / want[normal]
    assert rel.max() <= 1.5 * np.finfo(np.float64).eps, rel.max()
    assert np.abs(e[~normal] - want[~normal]).max() <= 2 * 5e-324
    assert np.all(e[d > 745.2] == 0.0) and np.all(e >= 0.0)


def _device_path_vs(z: torch.Tensor, ref: dict, ref_recv: np.ndarray, rtol: float,
                    atol: float = 1e-13) -> None:
    from attnbase.extract.batchstats import layer_row_col_stats

    got, got_recv = layer_row_col_stats(z)
    assert tuple(got) == ROW_STAT_COLUMNS
    for k, v in ref.items():
        a, b = np.asarray(v), got[k].numpy()
        if a.dtype.kind in "iu":
            np.testing.assert_array_equal(b, a, err_msg=k)
        else:
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, equal_nan=True, err_msg=k)
    np.testing.assert_allclose(got_recv.numpy(), ref_recv, rtol=rtol, atol=atol, equal_nan=True)


def test_device_path_matches_the_kernel_and_the_reference():
    """The torch device path (extract/batchstats.py: the kernel's formulas as whole-tensor
    operations) agrees with the compiled kernel and with the two-pass float64 reference on
    causal and unmasked rows, a dominant sink (30, and 800: every content p underflows, the
    reference's redo case), a Gemma-3 row with key 0 masked, and the edge rows (NaN, +inf,
    fully masked, one key)."""
    from attnbase.extract import rowkernel

    g = torch.Generator().manual_seed(5)
    T = 24
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for sink in (0.0, 30.0, 800.0):
        z = torch.randn(2, 3, T, T, generator=g) * 2
        z[..., 0] += sink
        for zz in (z.masked_fill(causal, -math.inf), z):
            k, k_recv = rowkernel.row_col_stats_np(zz.numpy())
            _device_path_vs(zz, k, k_recv, rtol=1e-12)
            r, r_recv = row_col_stats(zz)
            _device_path_vs(zz, {n: v.numpy() for n, v in r.items()}, r_recv.numpy(), rtol=1e-9)
    edge = torch.randn(1, 1, 5, 4, generator=g)
    edge[0, 0, 0, 2] = math.nan
    edge[0, 0, 1, 1] = math.inf
    edge[0, 0, 2] = -math.inf
    edge[0, 0, 3, 1:] = -math.inf
    edge[0, 0, 4, 0] = -math.inf  # past a sliding window: no sink
    k, k_recv = rowkernel.row_col_stats_np(edge.numpy())
    _device_path_vs(edge, {n: v for n, v in k.items() if n != "argmax"}, k_recv, rtol=1e-12)
    from attnbase.extract.batchstats import layer_row_col_stats

    got, _ = layer_row_col_stats(edge)
    assert np.isnan(got["max_prob"][0, 0, :3]).all() and got["entropy"][0, 0, 2] == 0
    assert got["n_keys"][0, 0].tolist() == [3, 4, 0, 1, 3]  # NaN is not counted, +inf is
    assert got["sink_mass"][0, 0, 4] == 0


def test_device_path_reads_nothing_back_per_layer():
    """No host synchronisation per layer: the torch path runs on the ``meta`` device, where any
    data-dependent host read (``.item()``, ``bool()``, ``.cpu()``, a boolean-mask index, the
    reference path's ``bool(redo.any())``) raises; the negative control is that reference."""
    from attnbase.extract.batchstats import BatchStats

    z = torch.empty(2, 3, 16, 16, device="meta")
    bs = BatchStats(n_layers=4)
    for layer in range(4):
        bs.add(layer, z)
    assert bs.rows.device.type == "meta" and bs.rows.shape == (len(ROW_STAT_COLUMNS), 4, 3, 2, 16)
    assert bs.recv.shape == (4, 3, 2, 16) and bs.seen == {0, 1, 2, 3}
    with pytest.raises((RuntimeError, NotImplementedError)):
        row_col_stats(z)  # the reference reads bool(redo.any()) back
