"""``analyze_run``: the collapse signature of one run, written to the catalog.

Reproduces the measurements of "All Routes Lead to Collapse", Table 1 (norm-CV, VE@8, Gauss,
shuffle, onset, r_cv,sh) for any extracted run (docs/metrics.md §1-3, §8):

1. **Keys** (Zarr, streamed one layer at a time: memory is bounded by one layer's block
   ``keys[layer]`` of shape ``(kv_head, seq, pos, d_head)`` plus a few per-kv-head temporaries):
   ``key_norm_cv``, ``key_norm_cv_excl_sink``, ``ve_at_8`` (mean over sequences) and its two nulls
   (docs/metrics.md §2, §8), both drawn per sequence and combined by the CLT: Gauss (a pool of
   ``gauss_pool`` N(0,1) matrices, shared by all heads and cached per shape) and shuffle
   (``seq_draws`` shuffled copies of each of ``shuffle_seqs`` sequences sampled per kv head).
2. **Attention** (SQL over the run's ``row_stats`` / ``col_stats`` files, one layer at a time,
   :mod:`attnbase.stats.queries`): ``max_share``, ``row_max_share``, ``mean_sink_mass`` per
   (layer, head).
3. Layer means, run means, onset (SQL), and the correlation ``r_cv_share`` over (layer, head)
   pairs (scipy) with a bootstrap CI over heads.

Steps 1-2 (and the depth statistics of ``hidden``) are per-layer parts
(:mod:`attnbase.stats.layer_parts`) that read the run's bytes without the catalog, so the
analyze flow can run them on Dask workers; :func:`write_analysis` combines them (the null tests
and their q-values, step 3) and writes. :func:`analyze_run` runs the same parts in this process,
so both ways write the same rows, and the same bits on every call.

GQA: key statistics are per kv head; they are written for every query head of the group
(query head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``), so every head_metrics row,
``head_summary`` row and (layer, query head) pair of ``r_cv_share`` is coherent. The null tests
are run once per kv head, BH/Holm-corrected across (layer, kv head), and copied to the group's
query heads likewise. Model means over query heads equal those over kv heads (equal group sizes).

All four result tables are replaced for the run in one transaction: re-running never duplicates.
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from attnbase.contract import image_token_names, sink_set
from attnbase.errors import StatsError
from attnbase.metrics import N
from attnbase.stats import depth, geometry, inference, layer_parts, norms, queries
from attnbase.stats.concentration import onset_depth
from attnbase.stats.layer_parts import K, LayerJob, LayerPart
from attnbase.stats.defaults import NULL_DRAWS, SINK_EPS
from attnbase.stats.views import create_views
from attnbase.warehouse.catalog.rows import insert_table
from attnbase.stats.weights_only import refuse_weights_only

if TYPE_CHECKING:
    from attnbase.warehouse import Database

VE = f"ve_at_{K}"
RESULT_TABLES = ("head_metrics", "null_tests", "layer_metrics", "run_metrics")
#: The q-value below which a head "beats" a null in the run summary.
ALPHA = 0.05
#: Sequences per kv head that get shuffled copies (a uniform sample; all when fewer): the null
#: mean of the head's VE@8 is estimated from them, its sampling error counted in null_sd.
SHUFFLE_SEQS = 64
#: Shuffled key matrices per head at least (default ``seq_draws``: this over the sequences).
MIN_SHUFFLE_MATRICES = 128
#: Per-sequence Gauss-null draws (one pool per (pos, d_head, seed), cached; docs/metrics.md §2).
GAUSS_POOL = 4096


def _head_map(n_heads: int, n_kv_heads: int) -> np.ndarray:
    """kv head of each query head (GQA/MQA grouping; identity without GQA)."""
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise StatsError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    return np.arange(n_heads) // (n_heads // n_kv_heads)


def _progress(enabled: bool, total: int, label: str):
    from rich.console import Console

    console = Console(stderr=True)
    if not (enabled and console.is_terminal):  # no bar in piped output
        return nullcontext(None)
    from rich.progress import Progress

    prog = Progress(transient=False, console=console)
    prog.start()
    task = prog.add_task(label, total=total)

    class _Ctx:
        def __enter__(self):
            return lambda: prog.advance(task)

        def __exit__(self, *exc):
            prog.stop()

    return _Ctx()


def shuffle_plan(n_seqs: int, shuffle_seqs: int | None = None,
                 seq_draws: int | None = None) -> tuple[int, int]:
    """``(m, D)``: sequences of a head that get shuffled copies (default ``min(n_seqs,``
    :data:`SHUFFLE_SEQS` ``)``) and copies per sequence (default: at least 2, for a
    per-sequence variance, and at least :data:`MIN_SHUFFLE_MATRICES` in all)."""
    m = min(n_seqs, SHUFFLE_SEQS if shuffle_seqs is None else int(shuffle_seqs))
    D = max(2, -(-MIN_SHUFFLE_MATRICES // max(1, m))) if seq_draws is None else int(seq_draws)
    return m, D


def gauss_cache_dir(db: Database):
    """Where the Gauss-null pools of a database are cached (they depend only on the shape)."""
    return db.path / "cache" / "gauss_null"


def key_statistics(db: Database, run_id: str, info: dict, *, seed: int,
                   seq_draws: int | None = None, gauss_pool: int = GAUSS_POOL,
                   progress: bool = False, workers: int | None = None,
                   shuffle_seqs: int | None = None
                   ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Key statistics of every (layer, kv head), streaming ``keys`` one layer at a time.

    Returns ``(per_kv, nulls)``: ``per_kv`` maps metric -> ``(layer, kv_head)`` array
    (key_norm_cv, key_norm_cv_excl_sink, ve_at_8, ve_shuffle = the shuffle null's mean);
    ``nulls`` holds the per-sequence values the null tests need: ``"ve_seq"`` ``(layer, kv_head,
    seq)``, ``"shuffle_idx"`` ``(layer, kv_head, m)`` the sequences shuffled (a uniform sample
    per kv head) and ``"shuffle_seq"`` ``(layer, kv_head, m, D)`` their ``D`` shuffled copies
    (:func:`shuffle_plan`), ``"gauss_pool"`` ``(gauss_pool,)`` per-sequence
    Gauss-null draws (shared by every head and cached per shape, :func:`geometry.gauss_null_pool`).
    The kv heads of a layer run on ``workers`` threads (default: the CPU count); each has its
    own generator seeded by ``(seed, layer, kv_head)``, so results do not depend on ``workers``.
    """
    L, KV = int(info["n_layers"]), int(info["n_kv_heads"])
    m, D = shuffle_plan(int(info["n_seqs"]), shuffle_seqs, seq_draws)
    if D < 2:
        raise StatsError(f"seq_draws must be >= 2 (a per-sequence null variance), got {D}")
    run, files = _run_files(db, run_id)
    jobs = [LayerJob(run_id, layer, run, files, KV, int(info["n_seqs"]), keys=True,
                     attention=False, hidden=False, seed=seed, shuffle_seqs=m, seq_draws=D,
                     min_query=4, sink=sink_set(info.get("sink_positions")))
            for layer in range(L)]
    with _progress(progress, L, f"analyze {run_id}: keys") as tick:
        parts = layer_parts.layer_parts(jobs, threads=workers, tick=tick)
    per_kv, nulls = layer_parts.assemble_keys(parts, L, KV, int(info["n_seqs"]), m, D)
    n_pos, d_head = parts[0].shape
    nulls["gauss_pool"] = geometry.gauss_null_pool(n_pos, d_head, k=K, draws=gauss_pool,
                                                   seed=seed, cache_dir=gauss_cache_dir(db))
    return per_kv, nulls


def null_tests(per_kv: dict[str, np.ndarray], nulls: dict[str, Any], *, draws: int,
               gauss_draws: int, seed: int) -> dict[str, inference.NullTest]:
    """The VE@8 null tests of every (layer, kv head) (docs/metrics.md §2, §8), by the CLT.

    ``shuffle``: each sampled sequence against its own shuffled copies
    (:func:`inference.clt_mean_test`, empirical p from ``draws`` draws of the mean);
    ``gauss``: the mean over a head's finite sequences against the shared Gauss pool
    (:func:`inference.pooled_clt_mean_test`).
    """
    ve_seq = nulls["ve_seq"]
    sampled = np.take_along_axis(ve_seq, nulls["shuffle_idx"], axis=-1)
    shuffle = np.where(np.isnan(sampled)[..., None], np.nan, nulls["shuffle_seq"])
    n_finite = np.isfinite(ve_seq).sum(-1)
    return {
        "gauss": inference.pooled_clt_mean_test(per_kv[VE], nulls["gauss_pool"], n_finite,
                                                draws=gauss_draws,
                                                seed=np.random.default_rng([seed, 3])),
        "shuffle": inference.clt_mean_test(per_kv[VE], shuffle, seq_observed=sampled,
                                           n_seqs=n_finite, draws=draws,
                                           seed=np.random.default_rng([seed, 2])),
    }


def _null_rows(run_id: str, test: inference.NullTest, name: str, heads: np.ndarray,
               seed: int, p_adjust: str) -> dict[str, np.ndarray]:
    """null_tests rows for one null: every array of ``test`` has shape ``(layer, kv)``; BH/Holm
    over the (layer, kv head) family, then copied to each kv head's query heads."""
    L, _ = test.statistic.shape
    q = inference.adjust_p_values(test.p_value, method=p_adjust)
    H = heads.size
    layer = np.repeat(np.arange(L), H)
    kv = np.tile(heads, L)
    n = L * H
    return {
        "run_id": np.full(n, run_id, dtype=object),
        "layer": layer.astype(np.int16), "head": np.tile(np.arange(H), L).astype(np.int16),
        "metric": np.full(n, VE, dtype=object), "null_model": np.full(n, name, dtype=object),
        "statistic": test.statistic[layer, kv], "null_mean": test.null_mean[layer, kv],
        "null_sd": test.null_sd[layer, kv], "z": test.z[layer, kv],
        "draws": np.full(n, test.draws, dtype=np.int32), "seed": np.full(n, seed, dtype=np.int64),
        "p_value": test.p_value[layer, kv], "p_method": np.full(n, test.p_method, dtype=object),
        "p_empirical": test.p_empirical[layer, kv],
        "p_at_floor": np.asarray(test.p_at_floor[layer, kv], dtype=bool),
        "q_value": q[layer, kv],
    }


def _concat(parts: list[dict[str, np.ndarray]]) -> pa.Table:
    cols = parts[0].keys()
    return pa.table({c: np.concatenate([np.asarray(p[c]) for p in parts]) for c in cols})


def _fetch_value(con, sql: str, params: dict) -> Any:
    row = con.execute(sql, params).fetchone()
    return None if row is None else row[0]


def analyze_run(db: Database, run_id: str, draws: int = NULL_DRAWS,
                gauss_draws: int = NULL_DRAWS, seed: int = 0, onset_threshold: float = 0.2,
                progress: bool = False, *, min_query: int = 4,
                p_adjust: str = "bh", n_boot: int = 2000, workers: int | None = None,
                seq_draws: int | None = None, gauss_pool: int = GAUSS_POOL,
                shuffle_seqs: int | None = None, wait: bool = False,
                sink_eps: float = SINK_EPS) -> dict[str, float | None]:
    """Compute the collapse signature of ``run_id`` and write it to the catalog, holding the
    run's lease (``wait``: for another process writing the run, else refuse naming it).

    Parameters
    ----------
    db : attnbase.warehouse.Database
    run_id : str
        A complete run (``runs.status = 'complete'``).
    draws : int, default 200
        Shuffle-null draws of a head's VE@8 (means over its sequences) behind the empirical
        p-value (docs/metrics.md §2, §8); they combine the per-sequence draws, so cost little.
    gauss_draws : int, default 200
        Gauss-null draws of a head's VE@8 behind its empirical p-value (means of ``n_seqs``
        values resampled from the Gauss pool).
    seed : int, default 0
        Seeds every null and the bootstrap; recorded in null_tests and run_metrics.
    onset_threshold : float, default 0.2
        ``onset_layer`` = first layer whose mean-over-heads max_share exceeds it.
    progress : bool, default False
        Show a progress bar over layers.
    min_query : int, default 4
        First query row of ``row_max_share`` (docs/metrics.md §3).
    p_adjust : {"bh", "holm"}, default "bh"
        Correction of the null-test p-values across heads.
    n_boot : int, default 2000
        Bootstrap resamples of the ``r_cv_share`` CI.
    workers : int, optional
        Threads over the kv heads of a layer (default: CPU count); results do not depend on it.
    seq_draws : int, optional
        Shuffled copies of every shuffled sequence (default: at least 2, and at least
        ``MIN_SHUFFLE_MATRICES`` per head in all). Their cost is the shuffle null's cost.
    shuffle_seqs : int, optional
        Sequences per kv head that get shuffled copies, a uniform sample (default
        ``SHUFFLE_SEQS`` = 64; all of them when the run has fewer; pass ``n_seqs`` for all).
    gauss_pool : int, default 4096
        Per-sequence Gauss-null matrices (cached per shape and seed under ``<db>/cache``).
    sink_eps : float, default 0.3
        Threshold of ``sink_rate`` (Gu et al. 2025, Sink_1^eps; docs/metrics.md §3b): the share
        of heads whose mean sink mass exceeds it, per layer and run; recorded in run_metrics.

    Returns
    -------
    dict
        The run_metrics written (metric -> value; None where undefined, e.g. no onset).

    Raises
    ------
    RunNotFoundError
        Unknown run.
    StatsError
        The run is not complete, or has no ``keys`` array / ``row_stats``.
    """
    db.run_info(run_id)  # RunNotFoundError naming the known runs
    with db.catalog.acquire_lease(run_id, "analyze", wait=wait):
        plan = analysis_plan(db, run_id, draws=draws, gauss_draws=gauss_draws, seed=seed,
                             onset_threshold=onset_threshold, min_query=min_query,
                             p_adjust=p_adjust, n_boot=n_boot, seq_draws=seq_draws,
                             gauss_pool=gauss_pool, shuffle_seqs=shuffle_seqs,
                             sink_eps=sink_eps)
        with _progress(progress, len(plan.jobs), f"analyze {run_id}: layers") as tick:
            parts = layer_parts.layer_parts(plan.jobs, threads=workers, tick=tick)
        return write_analysis(db, plan, parts)


@dataclass(frozen=True)
class AnalysisPlan:
    """A run's analysis, validated against the catalog: its per-layer jobs (run anywhere,
    :mod:`attnbase.stats.layer_parts`) and what :func:`write_analysis` combines them with."""

    run_id: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_pos: int | None  #: positions of the keys (None for a depth-only run)
    jobs: tuple[LayerJob, ...]
    depth_only: bool
    draws: int
    gauss_draws: int
    seed: int
    onset_threshold: float
    min_query: int
    p_adjust: str
    n_boot: int
    gauss_pool: int
    seq_draws: int
    shuffle_seqs: int
    sink_eps: float = SINK_EPS  #: eps of ``sink_rate`` (docs/metrics.md §3b)


def analysis_plan(db: Database, run_id: str, draws: int = NULL_DRAWS, gauss_draws: int = NULL_DRAWS,
                  seed: int = 0, onset_threshold: float = 0.2, *, min_query: int = 4,
                  p_adjust: str = "bh", n_boot: int = 2000, seq_draws: int | None = None,
                  gauss_pool: int = GAUSS_POOL, shuffle_seqs: int | None = None,
                  sink_eps: float = SINK_EPS) -> AnalysisPlan:
    """Check that ``run_id`` can be analysed with these settings (the errors of
    :func:`analyze_run`) and list its layer jobs: one per layer of keys, and one per layer of
    ``hidden`` (``n_layers + 1``) when it was captured."""
    info = db.run_info(run_id)
    if info["status"] != "complete":
        from attnbase.warehouse.catalog import lease

        writer = db.catalog.lease_holder(run_id)
        if writer is not None and writer["pid"] != os.getpid():
            raise StatsError(f"run {run_id!r} is being written by {lease.describe(writer)}; "
                             "analyze it once that has finished")
        raise StatsError(
            f"run {run_id!r} is {info['status']!r}, not complete and nobody is writing it; "
            f"finish it first (re-running the same `attnbase extract ... --run {run_id}` "
            "resumes it)"
        )
    if draws < 1 or gauss_draws < 1:
        raise StatsError(f"draws and gauss_draws must be >= 1, got {draws} and {gauss_draws}")
    if shuffle_seqs is not None and shuffle_seqs < 2:
        raise StatsError(f"shuffle_seqs must be >= 2, got {shuffle_seqs}")
    if (seq_draws is not None and seq_draws < 2) or gauss_pool < 2:
        raise StatsError(f"seq_draws and gauss_pool must be >= 2 (a per-sequence null variance), "
                         f"got {seq_draws} and {gauss_pool}")
    if not 0.0 <= sink_eps < 1.0:
        raise StatsError(f"sink_eps must be in [0, 1), got {sink_eps}")
    if p_adjust not in inference.P_ADJUST_METHODS:
        raise StatsError(f"unknown p_adjust {p_adjust!r}; choose one of "
                         f"{sorted(inference.P_ADJUST_METHODS)}")
    refuse_weights_only(db, run_id, "`attnbase analyze`")
    arrays = {r["name"]: r for r in db.array_rows(run_id)}
    depth_only = "keys" not in arrays and "hidden" in arrays  # docs/metrics.md §6
    if "keys" not in arrays and not depth_only:
        raise StatsError(
            f"run {run_id!r} has no 'keys' array (captured: {', '.join(sorted(arrays)) or 'none'}); "
            "re-extract it with --capture including keys"
        )
    if not depth_only:
        with db.connect(read_only=True) as con:
            has_rows = _fetch_value(con, "SELECT count(*) > 0 FROM (SELECT 1 FROM row_stats "
                                         "WHERE run_id = $run LIMIT 1)", {"run": run_id})
        if not has_rows:
            raise StatsError(
                f"run {run_id!r} has no row_stats in the catalog; re-extract it "
                f"(`attnbase extract ... --run {run_id} --overwrite`)"
            )
    L, H, KV = int(info["n_layers"]), int(info["n_heads"]), int(info["n_kv_heads"])
    _head_map(H, KV)
    n_seqs = int(info["n_seqs"])
    m, D = shuffle_plan(n_seqs, shuffle_seqs, seq_draws)
    hidden = "hidden" in arrays
    run, files = _run_files(db, run_id)
    # the head taxonomy reads the logits (stored, or derived from queries and keys) and tokens
    taxonomy = not depth_only and "tokens" in arrays and "attn_logits" in run.store().names()
    sink = sink_set(info.get("sink_positions"))
    # an image run: its patches follow the [CLS] and extra tokens, which its sink set holds
    first_patch = (len(sink) if image_token_names(info.get("family") or "", len(sink),
                                                  int(info["seq_len"])) is not None else None)
    jobs = tuple(
        LayerJob(run_id, layer, run, files, KV, n_seqs, keys=layer < L and not depth_only,
                 attention=layer < L and not depth_only, hidden=hidden, seed=seed,
                 shuffle_seqs=m, seq_draws=D, min_query=min_query,
                 sink=sink, taxonomy=taxonomy, first_patch=first_patch)
        for layer in range(L + 1 if hidden else L))
    n_pos = None if depth_only else int(arrays["keys"]["shape"][3])
    return AnalysisPlan(run_id, L, H, KV, int(info["d_head"]), n_pos, jobs, depth_only, draws,
                        gauss_draws, seed, onset_threshold, min_query, p_adjust, n_boot,
                        gauss_pool, D, m, float(sink_eps))


def _run_files(db: Database, run_id: str):
    """The run's handle (DIR absolute: a worker's working directory may differ) and the
    ``(table, path)`` of the statistics files the catalog lists for it."""
    from attnbase.warehouse.catalog.statledger import listed

    with db.connect(read_only=True, stats=False) as con:
        files = tuple((f.table, f.path) for f in listed(con, run_id))
    return db.run(run_id).absolute(), files


def gauss_pool_of(db: Database, plan: AnalysisPlan) -> np.ndarray:
    """The run's Gauss-null pool (cached per shape and seed under ``<db>/cache``)."""
    return geometry.gauss_null_pool(plan.n_pos, plan.d_head, k=K, draws=plan.gauss_pool,
                                    seed=plan.seed, cache_dir=gauss_cache_dir(db))


def write_analysis(db: Database, plan: AnalysisPlan,
                   parts: list[LayerPart]) -> dict[str, float | None]:
    """Combine the layer parts of ``plan`` (computed here or on workers) and write the four
    result tables in one transaction: what needs every layer at once (the null tests with
    their q-values over all (layer, kv head), layer and run means, onset, ``r_cv_share``)
    is computed here. Returns the run_metrics written."""
    run_id, seed = plan.run_id, plan.seed
    L, H, KV = plan.n_layers, plan.n_heads, plan.n_kv_heads
    parts = sorted(parts, key=lambda p: p.layer)
    if [p.layer for p in parts] != [j.layer for j in plan.jobs]:
        raise StatsError(f"run {run_id!r}: analysis parts of layers {[p.layer for p in parts]} "
                         f"do not match its jobs {[j.layer for j in plan.jobs]}")
    depth_rows = None
    if any(j.hidden for j in plan.jobs):
        rows: dict[str, list] = {"layer": [], "metric": [], "value": []}
        for p in parts:
            for metric, value in p.depth:
                rows["layer"].append(p.layer)
                rows["metric"].append(metric)
                rows["value"].append(value)
        depth_rows = depth.depth_table(run_id, rows)
    if plan.depth_only:
        return write_depth_only(db, run_id, L + 1, rows=depth_rows)
    heads = _head_map(H, KV)

    # --- 1. keys: combined over layers ------------------------------------------------------
    per_kv, nulls = layer_parts.assemble_keys(parts, L, KV, plan.jobs[0].n_seqs,
                                              plan.shuffle_seqs, plan.seq_draws)
    nulls["gauss_pool"] = gauss_pool_of(db, plan)
    nt = null_tests(per_kv, nulls, draws=plan.draws, gauss_draws=plan.gauss_draws, seed=seed)
    gauss_mean = float(nulls["gauss_pool"].mean())
    per_kv[N.ve_gauss] = np.full((L, KV), gauss_mean)
    layer_idx = np.repeat(np.arange(L), H)
    head_idx = np.tile(np.arange(H), L)
    kv_idx = np.tile(heads, L)
    key_rows = [
        {"run_id": np.full(L * H, run_id, dtype=object), "layer": layer_idx.astype(np.int16),
         "head": head_idx.astype(np.int16), "metric": np.full(L * H, name, dtype=object),
         "value": values[layer_idx, kv_idx]}
        for name, values in per_kv.items()
    ]
    tests = _concat([_null_rows(run_id, nt[name], name, heads, seed, plan.p_adjust)
                     for name in ("gauss", "shuffle")])
    attention = pa.concat_tables([p.attention for p in parts if p.attention is not None])
    attention = attention.append_column("run_id", pa.array([run_id] * attention.num_rows))

    params = {"run": run_id}
    with db.transaction() as con:
        for table in RESULT_TABLES:
            con.execute(f"DELETE FROM {table} WHERE run_id = $run", params)
        # --- 2. head metrics: keys + attention (both from the layer parts) -------------------
        insert_table(con, "head_metrics", _concat(key_rows))
        insert_table(con, "head_metrics", attention)
        insert_table(con, "null_tests", tests)
        # --- 3. layer and run means, onset, correlation ------------------------------------
        con.execute("INSERT INTO layer_metrics (run_id, layer, metric, value) "
                    f"SELECT $run, layer, metric, value FROM ({queries.LAYER_METRICS_SQL})", params)
        con.execute("INSERT INTO layer_metrics (run_id, layer, metric, value) "
                    f"SELECT $run, layer, metric, value FROM ({queries.SINK_RATE_SQL})",
                    {**params, "eps": plan.sink_eps})
        if depth_rows is not None:
            insert_table(con, "layer_metrics", pa.table(depth_rows))
        run: dict[str, float | None] = {
            m: v for m, v in con.execute(queries.RUN_MEANS_SQL, params).fetchall()
        }
        onset = _fetch_value(con, queries.ONSET_SQL, {**params, "threshold": plan.onset_threshold})
        pairs = np.array([(np.nan if c is None else c, np.nan if m is None else m)
                          for _, _, c, m in con.execute(queries.CV_SHARE_PAIRS_SQL,
                                                        params).fetchall()], dtype=np.float64)
        cv, share = pairs.reshape(-1, 2).T
        r = inference.pearson(cv, share)
        rs = inference.spearman(cv, share)
        lo, hi = inference.bootstrap_ci(cv, share, n_resamples=plan.n_boot, seed=seed)
        q_gauss = tests.column("q_value").to_numpy()[:L * H]
        q_shuffle = tests.column("q_value").to_numpy()[L * H:]
        run.update({
            N.key_norm_cv_baseline: norms.isotropic_norm_cv(plan.d_head),
            N.ve_gauss: gauss_mean,
            N.onset_layer: None if onset is None else int(onset),
            N.onset_depth: onset_depth(None if onset is None else int(onset), L),
            N.r_cv_share: r.r, N.r_cv_share_p: r.p_value,
            N.r_cv_share_ci_low: lo, N.r_cv_share_ci_high: hi,
            N.r_cv_share_spearman: rs.r, N.r_cv_share_spearman_p: rs.p_value,
            N.n_head_pairs: float(np.isfinite(cv).sum()),
            N.frac_heads_beat_gauss: float(np.mean(q_gauss < ALPHA)),
            N.frac_heads_beat_shuffle: float(np.mean(q_shuffle < ALPHA)),
            # the conventions used, so that every number can be traced (docs/metrics.md §8)
            N.onset_threshold: plan.onset_threshold, N.draws: plan.draws,
            N.gauss_draws: plan.gauss_draws, N.shuffle_seq_draws: nulls["seq_draws"],
            N.shuffle_seqs: nulls["shuffle_seqs"], N.gauss_pool: plan.gauss_pool, N.seed: seed,
            N.row_max_share_min_query: plan.min_query, N.ve_k: K, N.sink_rate_eps: plan.sink_eps,
        })
        run = {m: (None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v))
               for m, v in run.items()}
        insert_table(con, "run_metrics", pa.table({
            "run_id": pa.array([run_id] * len(run)),
            "metric": pa.array(list(run)),
            "value": pa.array(list(run.values()), type=pa.float64()),
        }))
        _ensure_views(con)
    return run


def _ensure_views(con) -> None:
    """Create head_summary / table1 if missing (the stats migration normally did). An existing
    view is left alone: a later migration may have replaced it with a newer definition."""
    have = {n for (n,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE view_name IN ('head_summary', 'table1')"
    ).fetchall()}
    if len(have) < 2:
        create_views(con)


def write_depth_only(db: Database, run_id: str, n_hidden: int, rows: dict | None = None
                     ) -> dict[str, float | None]:
    """``analyze`` of a run that captured ``hidden`` but no keys: replace only its depth rows in
    ``layer_metrics`` (one transaction; ``rows``: computed already, e.g. by the analysis
    fan-out's workers). Returns the (empty) run_metrics written: none."""
    if rows is None:
        rows = depth.depth_layer_rows(db, run_id, n_hidden,
                                      sink=sink_set(db.run_info(run_id).get("sink_positions")))
    with db.transaction() as con:
        con.execute("DELETE FROM layer_metrics WHERE run_id = ? AND list_contains(?, metric)",
                    [run_id, list(depth.DEPTH_LAYER_METRICS)])
        insert_table(con, "layer_metrics", pa.table(rows))
    return {}
