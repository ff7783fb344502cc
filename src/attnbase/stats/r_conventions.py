"""r(key-norm CV, max share) under every convention of the paper's Table 1 (docs/metrics.md §1, §3, §3a).

"All Routes Lead to Collapse" reports a positive r_cv,sh for all nine of its models; our runs'
default r (``r_cv_share``: key_norm_cv with token 0, ``max_share`` over every query and key, each
query head paired with its kv head's CV) is negative. This study recomputes r for every
combination of

* the norm-CV variant: :data:`CV_VARIANTS` (token 0 in or out; §1),
* the share variant: :data:`SHARE_VARIANTS` (column share over all keys / keys ``j >= 1``, not
  renormalised / queries ``i >= 4`` / both; the mean row maximum of queries ``i >= 4``; §3),
* the pairing (:data:`PAIRINGS`): ``query_head`` (every query head with its kv head's CV, the
  default of §1) and, for GQA runs, ``kv_head`` (each kv head's CV against the mean share of its
  query heads, so a shared kv head is counted once),

each with Pearson r and its two-sided p (scipy), a 95% bootstrap CI over the (layer, head) pairs
(BCa, :func:`inference.bootstrap_ci`) and Spearman's rho. The BOS convention is a property of
the run (``attnbase extract --bos``, ``runs.sink_token``): compare a ``--bos auto`` run with a
``--bos none`` run of the same model.

Inputs are read through the warehouse only (:meth:`Database.read_layers`): ``keys`` for the CVs,
``attn_logits`` for the shares (softmax over the unmasked keys, one layer at a time), so the
numbers are the registered numpy statistics (:mod:`attnbase.stats.registry`) applied to the
stored run, not a second implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnbase.errors import StatsError, WarehouseError
from attnbase.logits import softmax
from attnbase.metrics import N, S
from attnbase.stats import concentration, inference, norms
from attnbase.stats.weights_only import refuse_weights_only

if TYPE_CHECKING:
    from attnbase.warehouse import Database

RC = S.r_conventions
CV_VARIANTS = (N.key_norm_cv, N.key_norm_cv_excl_sink)
SHARE_VARIANTS = (N.max_share, RC.max_share_excl_sink, RC.max_share_q4,
                  RC.max_share_excl_sink_q4, N.row_max_share)
PAIRINGS = ("query_head", "kv_head")
#: The statistics stored per combination (study_results key ``<combination>:<statistic>``).
RESULT_STATS = (RC.n, RC.r, RC.ci_low, RC.ci_high, RC.p, RC.spearman, RC.spearman_p)
#: The combination of the run's own ``r_cv_share`` (analyze_run's default).
DEFAULT_COMBINATION = (N.key_norm_cv, N.max_share, "query_head")
KIND = "r_conventions"


def combination_key(cv: str, share: str, pairing: str) -> str:
    """``<cv>|<share>|<pairing>``, e.g. ``key_norm_cv|max_share|query_head``."""
    return f"{cv}|{share}|{pairing}"


def split_key(key: str) -> tuple[str, str, str, str]:
    """``(cv, share, pairing, statistic)`` of a study_results key."""
    combo, stat = key.rsplit(":", 1)
    cv, share, pairing = combo.split("|")
    return cv, share, pairing, stat


def share_variants(attn: np.ndarray, min_query: int = 4) -> dict[str, np.ndarray]:
    """Every :data:`SHARE_VARIANTS` value of attention ``(..., seq, query, key)`` -> ``(...)``."""
    return {
        N.max_share: concentration.max_share(attn),
        "max_share_excl_sink": concentration.max_share_excl_sink(attn),
        "max_share_q4": concentration.max_share_q4(attn, min_query),
        "max_share_excl_sink_q4": concentration.max_share_excl_sink_q4(attn, min_query),
        N.row_max_share: concentration.row_max_share(attn, min_query),
    }


def head_values(db: Database, run_id: str, min_query: int = 4) -> tuple[dict, dict, np.ndarray]:
    """``(cv, share, kv_of_head)``: CV variants per ``(layer, kv_head)``, share variants per
    ``(layer, query_head)`` and the kv head of each query head, from the stored run."""
    info = db.run_info(run_id)
    if info["status"] != "complete":
        raise StatsError(f"run {run_id!r} is {info['status']!r}, not complete; finish it first")
    if "keys" not in {r["name"] for r in db.array_rows(run_id)}:
        raise StatsError(f"run {run_id!r} has no keys array; re-extract it with "
                         "--capture keys,logits")
    L, H, KV = int(info["n_layers"]), int(info["n_heads"]), int(info["n_kv_heads"])
    if KV < 1 or H % KV:
        raise StatsError(f"n_heads={H} is not a multiple of n_kv_heads={KV}")
    cv = {name: np.full((L, KV), np.nan) for name in CV_VARIANTS}
    for layer, block in db.read_layers(run_id, "keys", range(L)):  # (kv_head, seq, pos, d_head)
        cv[N.key_norm_cv][layer] = norms.key_norm_cv(block)
        cv[N.key_norm_cv_excl_sink][layer] = norms.key_norm_cv_excl_sink(block)
    share = {name: np.full((L, H), np.nan) for name in SHARE_VARIANTS}
    try:
        for layer, block in db.read_layers(run_id, "attn_logits", range(L)):  # (head, seq, q, k)
            for name, values in share_variants(softmax(block), min_query).items():
                share[name][layer] = values
    except WarehouseError as err:
        raise StatsError(f"run {run_id!r}: its attention logits could not be read ({err}); "
                         "re-extract it with --capture keys,logits") from None
    return cv, share, np.arange(H) // (H // KV)


def correlate(x, y, *, n_boot: int = 2000, seed: int = 0) -> dict[str, float]:
    """The :data:`RESULT_STATS` of the pairs ``(x, y)`` (NaN pairs dropped)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    r, rs = inference.pearson(x, y), inference.spearman(x, y)
    lo = hi = np.nan
    if np.isfinite(r.r):
        lo, hi = inference.bootstrap_ci(x, y, n_resamples=n_boot, seed=seed)
    n = int((np.isfinite(x) & np.isfinite(y)).sum())
    return dict(zip(RESULT_STATS, (float(n), r.r, lo, hi, r.p_value, rs.r, rs.p_value)))


def r_table(cv: dict, share: dict, kv_of_head: np.ndarray, *, n_boot: int = 2000,
            seed: int = 0) -> dict[tuple[str, str, str], dict[str, float]]:
    """Every combination's statistics. ``kv_head`` pairings only where heads share a kv head."""
    gqa = len(np.unique(kv_of_head)) < kv_of_head.size
    out = {}
    for c in CV_VARIANTS:
        for s in SHARE_VARIANTS:
            out[(c, s, "query_head")] = correlate(cv[c][:, kv_of_head], share[s],
                                                  n_boot=n_boot, seed=seed)
            if gqa:
                n_kv = cv[c].shape[1]
                grouped = np.stack([share[s][:, kv_of_head == g].mean(axis=1)
                                    for g in range(n_kv)], axis=1)
                out[(c, s, "kv_head")] = correlate(cv[c], grouped, n_boot=n_boot, seed=seed)
    return out


def r_conventions_study(db: Database, run_id: str, *, n_boot: int = 2000, seed: int = 0,
                        min_query: int = 4) -> tuple[str, dict]:
    """Compute :func:`r_table` for ``run_id`` and store it as a ``r_conventions`` study: one
    study_results row per (combination, statistic), key ``<cv>|<share>|<pairing>:<stat>``.
    Returns ``(study_id, table)``."""
    from attnbase.stats.studies import write_study

    if min_query < 1 or n_boot < 100:
        raise StatsError(f"min_query must be >= 1 and n_boot >= 100, got {min_query} and {n_boot}")
    refuse_weights_only(db, run_id, "`attnbase study r-conventions`")
    cv, share, kv_of_head = head_values(db, run_id, min_query)
    table = r_table(cv, share, kv_of_head, n_boot=n_boot, seed=seed)
    info = db.run_info(run_id)
    params = {"run": run_id, "seed": seed, "n_boot": n_boot, "min_query": min_query,
              "ci": "95% BCa bootstrap over (layer, head) pairs", "excl_sink_renormalised": False,
              "sink_token": info.get("sink_token"), "model": info.get("model"),
              "default_combination": combination_key(*DEFAULT_COMBINATION)}
    results = {f"{combination_key(*combo)}:{stat}": value
               for combo, stats in table.items() for stat, value in stats.items()}
    sid = write_study(db, KIND, [run_id], params, results)
    return sid, table
