"""The path study (``attnbase study paths``): rank collapse of products of attention matrices along paths.

Dong, Cordonnier & Loukas (2021), Sec. 5 / Fig. 2 (docs/metrics.md §6): the attention matrices of a
run (softmax of the captured ``attn_logits``) are multiplied along random paths -- ``k`` distinct
layers in forward order, one random head per layer -- and each product ``P`` is scored by
``||P - P_1||_{1,inf} / ||P||_{1,inf}`` (``P_1`` its best rank-1 approximation). ``--draws``
paths per length ``k = 1..L`` and per sequence. One ``studies`` row (kind ``paths``) and, per
length ``k``, these ``study_results`` keys over its ``seqs x draws`` ratios:
``ratio_mean/k``, ``ratio_sd/k``, ``ratio_q05/k``, ``ratio_q25/k``, ``ratio_median/k``,
``ratio_q75/k``, ``ratio_q95/k``, ``n/k``.

Order: ``forward`` (default) multiplies as the network composes, ``P = A_{l_k} ... A_{l_1}``.
The peer notebook (``paper-plotting/utils.py::sample_P_matrix``) multiplies ``P = P @ A_l`` over
ascending layers, i.e. ``A_{l_1} ... A_{l_k}``, the reverse; ``--order ascending`` reproduces it.
Both are products of the same row-stochastic matrices, so both stay row-stochastic and both
collapse towards rank 1 (``1 pi^T``), but they are different matrices: in the ascending product
the *first* layer's matrix mixes the rows last, so the limit row ``pi`` and the per-length ratios
differ (for causal models both are lower triangular).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbase.metrics import S

if TYPE_CHECKING:
    from attnbase.warehouse import Database

P = S.paths
#: The quantiles of the ratio the study stores, by key (attnbase/metrics.py).
QUANTILES = {P.ratio_q05: 0.05, P.ratio_q25: 0.25, P.ratio_median: 0.5, P.ratio_q75: 0.75,
             P.ratio_q95: 0.95}


def paths_study(db: Database, run_id: str, *, draws: int = 100, seed: int = 0,
                order: str = "forward", seqs: int | None = None) -> tuple[str, dict[str, float]]:
    """Run the path study on ``run_id``; returns ``(study_id, results)``. Re-running with the same
    parameters replaces the study."""
    import numpy as np

    from attnbase.errors import StatsError
    from attnbase.logits import softmax
    from attnbase.stats.depth import PATH_ORDERS, path_ratio_draws
    from attnbase.stats.studies import write_study
    from attnbase.stats.weights_only import refuse_weights_only

    refuse_weights_only(db, run_id, "`attnbase study paths`")
    info = db.run_info(run_id)
    if order not in PATH_ORDERS:
        raise StatsError(f"unknown --order {order!r}; use one of {', '.join(PATH_ORDERS)}")
    if draws < 1:
        raise StatsError(f"--draws must be >= 1, got {draws}")
    if info["status"] != "complete":
        raise StatsError(f"run {run_id!r} is {info['status']!r}, not complete; finish it first")
    names = {r["name"] for r in db.array_rows(run_id)}
    if "attn_logits" not in names:
        raise StatsError(f"run {run_id!r} has no 'attn_logits' array (captured: "
                         f"{', '.join(sorted(names)) or 'none'}); re-extract it with --capture "
                         "including logits")
    n = int(info["n_seqs"]) if seqs is None else min(int(seqs), int(info["n_seqs"]))
    if n < 1:
        raise StatsError(f"--seqs must be >= 1, got {seqs}")
    attn = np.stack([softmax(db.read_layer(run_id, "attn_logits", layer)[:, :n]).astype(np.float32)
                     for layer in range(int(info["n_layers"]))])  # (layer, head, seq, q, k)
    ratios = path_ratio_draws(attn, draws=draws, seed=seed, order=order)
    results: dict[str, float] = {}
    for k, r in ratios.items():
        v = r.ravel()
        results[P.ratio_mean(k)] = float(v.mean())
        results[P.ratio_sd(k)] = float(v.std(ddof=1)) if v.size > 1 else float("nan")
        for name, q in QUANTILES.items():
            results[name(k)] = float(np.quantile(v, q))
        results[P.n(k)] = float(v.size)
    params = {"draws": draws, "seed": seed, "order": order, "seqs": n,
              "model_revision": info["model_revision"]}
    study_id = write_study(db, "paths", [run_id], params, results)
    return study_id, results
