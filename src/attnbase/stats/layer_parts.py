"""One layer's share of ``analyze_run``: what a run's analysis computes from that layer alone.

:func:`attnbase.stats.analyze.analyze_run` is split in two (docs/architecture.md, "analysis
fan-out"):

* **per layer** (this module, :func:`layer_part`): the key statistics of every kv head of the
  layer (norm-CV with and without the sink, per-sequence VE@8, the sampled sequences and their
  shuffled copies), the attention aggregates of every head (``max_share``, ``row_max_share``,
  ``mean_sink_mass``: :data:`attnbase.stats.queries.HEAD_CONCENTRATION_SQL` over that layer's
  rows of the run's statistics files), and the depth statistics of ``hidden[layer]``. A
  :class:`LayerJob` names the run's store and statistics files by path or URL, never the
  catalog, so a Dask worker on any machine that reaches the store can run it and return its
  :class:`LayerPart`;
* **across layers** (the coordinator, ``analyze.write_analysis``): the means of the shuffle
  null, the Gauss pool, the null tests with their BH/Holm q-values over every (layer, kv head),
  the layer and run means, onset, ``r_cv_share`` with its bootstrap CI over heads, and the one
  catalog transaction that writes them. They need every layer at once (or the catalog).

The single-process ``attnbase analyze`` runs the same parts in turn (:func:`layer_parts`, one
layer read ahead), so a fanned-out analysis writes exactly the rows it writes. Every random
draw is seeded by ``(seed, layer, kv head)``: results depend on neither the order nor the place
the parts run.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from attnbase.errors import StatsError
from attnbase.metrics import N
from attnbase.stats import geometry, norms
from attnbase.warehouse.runs.handle import RunHandle

#: The rank of VE@k that Table 1 reports; metric names assume it.
K = 8


@dataclass(frozen=True)
class LayerJob:
    """What one layer's part needs: the run's bytes by location (local path or ``s3://`` URL)
    and the analysis settings. Small and picklable: it travels to a Dask worker."""

    run_id: str
    layer: int
    run: RunHandle  #: where the run's bytes live (``Database.run``), DIR absolute
    #: ``(table, path)`` of the run's statistics files the catalog lists (``stat_files``)
    stat_files: tuple
    n_kv_heads: int
    n_seqs: int
    keys: bool  #: key statistics of this layer (layer < n_layers)
    attention: bool  #: attention aggregates of its heads (layer < n_layers)
    hidden: bool  #: depth statistics of ``hidden[layer]`` (layer <= n_layers)
    seed: int
    shuffle_seqs: int  #: m of :func:`attnbase.stats.analyze.shuffle_plan`
    seq_draws: int  #: D
    min_query: int
    sink: tuple[int, ...] = (0,)  #: the run's sink set (``runs.sink_positions``)
    #: head taxonomy scores of this layer (the run has ``attn_logits``, stored or derived, and
    #: ``tokens``; docs/metrics.md §3b)
    taxonomy: bool = False
    #: an image run's first patch position (its [CLS] and extra tokens come before): the
    #: high-norm statistics of ``hidden[layer]`` (docs/metrics.md §6c); None for text
    first_patch: int | None = None


@dataclass
class LayerPart:
    """One layer's results. ``keys``: ``(cv, cv_excl_sink, ve, idx, null)`` of shapes
    ``(kv,), (kv,), (kv, seq), (kv, m), (kv, m, D)``; ``attention``: this layer's head rows
    ``(layer, head, metric, value)`` (an Arrow table); ``depth``: ``(metric, value)`` of
    ``hidden[layer]``."""

    layer: int
    keys: tuple | None = None
    shape: tuple[int, int] | None = None  #: (pos, d_head) of the keys
    attention: Any = None
    depth: list[tuple[str, float]] | None = None
    seconds: float = 0.0


def kv_head_stats(x: np.ndarray, rng: np.random.Generator, m: int, seq_draws: int,
                  sink=(0,)) -> tuple:
    """Statistics of one kv head's keys ``(seq, pos, d_head)``: cv, cv excl sink, per-sequence
    VE ``(seq,)``, the ``m`` sequences shuffled (a uniform sample, sorted) and their shuffle-null
    draws ``(m, seq_draws)``."""
    n = x.shape[0]
    idx = np.arange(n) if m >= n else np.sort(rng.choice(n, size=m, replace=False))
    ve = np.empty(n)
    ve[idx], null = geometry.ve_with_shuffle_null(x[idx], k=K, draws=seq_draws, seed=rng)
    if m < n:
        rest = np.setdiff1d(np.arange(n), idx)
        ve[rest] = geometry.ve_with_shuffle_null(x[rest], k=K, draws=0)[0]
    return norms.key_norm_cv(x), norms.key_norm_cv_excl_sink(x, sink), ve, idx, null.T


def layer_key_stats(block: np.ndarray, job: LayerJob, pool=None) -> tuple:
    """The kv heads of one keys block ``(kv_head, seq, pos, d_head)``, stacked per statistic;
    each kv head has its own generator ``(seed, 1, layer, kv head)``."""
    KV, n = job.n_kv_heads, job.n_seqs
    if block.ndim != 4 or block.shape[0] != KV or block.shape[1] != n:
        raise StatsError(f"run {job.run_id!r}: keys[{job.layer}] has shape {block.shape}; "
                         f"expected (kv_head={KV}, seq={n}, pos, d_head)")
    one = (lambda g: kv_head_stats(block[g], np.random.default_rng([job.seed, 1, job.layer, g]),
                                   job.shuffle_seqs, job.seq_draws, job.sink))
    res = list(pool.map(one, range(KV)) if pool is not None else map(one, range(KV)))
    return tuple(np.stack([r[i] for r in res]) for i in range(5))


def attention_rows(job: LayerJob):
    """``(layer, head, metric, value)`` (an Arrow table) of the layer's heads: the catalog's
    attention SQL over this layer's rows of the run's statistics files, read without the
    catalog (one DuckDB thread: the same bits on every call and every machine)."""
    from attnbase.stats import queries
    from attnbase.warehouse.runs.statfiles import run_files_connection

    import duckdb

    from attnbase.warehouse.catalog.statledger import damaged_file_error

    con = run_files_connection(job.run, job.stat_files, job.layer)
    try:
        rows = con.execute(f"SELECT head, metric, value FROM ({queries.HEAD_CONCENTRATION_SQL}) "
                           "ORDER BY head, metric",
                           {"run": job.run_id, "min_query": job.min_query}).fetchall()
    except duckdb.Error as err:  # a damaged statistics file: one line naming it and the fix
        raise (damaged_file_error(err) or StatsError(
            f"run {job.run_id!r}: its statistics of layer {job.layer} cannot be read "
            f"({str(err).strip().splitlines()[0][:200]}); run `attnbase verify --run "
            f"{job.run_id}`")) from None
    finally:
        con.close()
    import pyarrow as pa

    head, metric, value = zip(*rows) if rows else ((), (), ())
    return pa.table({"layer": pa.array([job.layer] * len(rows), pa.int16()),
                     "head": pa.array(head, pa.int16()), "metric": pa.array(metric, pa.string()),
                     "value": pa.array(value, pa.float64())})  # a NULL stays NULL


#: Bytes of float64 probabilities one chunk of windows of the taxonomy scores may hold (the
#: logits block of one layer is read in chunks of windows, never whole).
TAXONOMY_CHUNK_BYTES = 64 << 20


def taxonomy_rows(job: LayerJob):
    """``(layer, head, metric, value)`` (an Arrow table) of the head taxonomy scores of the
    layer's heads (:mod:`attnbase.stats.taxonomy`): ``attn_logits[layer]`` read in chunks of
    windows (at most :data:`TAXONOMY_CHUNK_BYTES` of probabilities each), softmaxed, and the
    sums added up over the chunks. A score no row qualifies for (no token repeats) is NULL."""
    import pyarrow as pa

    from attnbase.logits import softmax
    from attnbase.stats import taxonomy

    store = job.run.store()
    tokens = store.read("tokens")
    shape = store.array("attn_logits").shape  # (layer, head, seq, query, key)
    H, n, T = int(shape[1]), int(shape[2]), int(shape[3])
    step = max(1, TAXONOMY_CHUNK_BYTES // max(1, H * T * int(shape[4]) * 8))
    total: dict = {}
    for s0 in range(0, n, step):
        s1 = min(n, s0 + step)
        z = store.read("attn_logits", (job.layer, slice(None), slice(s0, s1)))
        part = taxonomy.taxonomy_sums(softmax(z), tokens[s0:s1])
        total = part if not total else {k: total[k] + v for k, v in part.items()}
    means = taxonomy.taxonomy_means(total)
    names = [N.prev_token, N.duplicate_token, N.induction]
    head = [h for name in names for h in range(H)]
    metric = [name for name in names for _ in range(H)]
    value = [None if not np.isfinite(v) else float(v) for name in names for v in means[name]]
    return pa.table({"layer": pa.array([job.layer] * len(head), pa.int16()),
                     "head": pa.array(head, pa.int16()), "metric": pa.array(metric, pa.string()),
                     "value": pa.array(value, pa.float64())})


def high_norm_values(job: LayerJob, hidden: np.ndarray) -> list[tuple[str, float]]:
    """``(metric, value)`` of the high-norm statistics of ``hidden[layer]`` of an image run
    (:mod:`attnbase.stats.highnorm`); the [CLS] attention from ``attn_logits[layer]``, read
    for the images of one chunk at a time (the [CLS] query's row only), where that block
    exists."""
    from attnbase.logits import softmax
    from attnbase.stats.highnorm import high_norm_stats

    store = job.run.store()
    cls_rows = None
    if "attn_logits" in store.names() and job.layer < store.array("attn_logits").shape[0]:
        def cls_rows(s0: int, s1: int) -> np.ndarray:  # (head, seq, key)
            return softmax(store.read("attn_logits", (job.layer, slice(None), slice(s0, s1), 0)))
    stats = high_norm_stats(hidden, job.first_patch, cls_rows)
    return [(name, float(value)) for name, value in stats.items()]


def read_inputs(job: LayerJob) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The layer's ``keys`` and ``hidden`` blocks (checksums verified), as the job needs them."""
    store = job.run.store()
    return (store.read_layer("keys", job.layer) if job.keys else None,
            store.read_layer("hidden", job.layer) if job.hidden else None)


def compute_part(job: LayerJob, keys: np.ndarray | None, hidden: np.ndarray | None,
                 pool=None) -> LayerPart:
    from attnbase.stats import depth
    from attnbase.stats.massive import massive_activations, massive_values, run_tokens

    t0 = time.perf_counter()
    part = LayerPart(job.layer)
    with geometry._one_blas_thread():  # stacks of small matrices (see geometry._one_blas_thread)
        if keys is not None:
            part.keys = layer_key_stats(keys, job, pool)
            part.shape = (int(keys.shape[2]), int(keys.shape[3]))
        if job.attention:
            part.attention = attention_rows(job)
            if job.taxonomy:
                import pyarrow as pa

                part.attention = pa.concat_tables([part.attention, taxonomy_rows(job)])
        if hidden is not None:
            part.depth = (depth.depth_values(depth.hidden_layer_profile(hidden, pool))
                          + massive_values(massive_activations(
                              hidden, job.sink, run_tokens(job.run.store()))))
            if job.first_patch is not None:
                part.depth += high_norm_values(job, hidden)
    part.seconds = time.perf_counter() - t0
    return part


def layer_part(job: LayerJob, threads: int = 1) -> LayerPart:
    """One layer's part, reading its blocks itself (a Dask worker's task: one thread each by
    default, the workers being the parallelism)."""
    keys, hidden = read_inputs(job)
    if threads <= 1:
        return compute_part(job, keys, hidden)
    with ThreadPoolExecutor(threads) as pool:
        return compute_part(job, keys, hidden, pool)


def layer_parts(jobs: Iterable[LayerJob], threads: int | None = None,
                tick=None) -> list[LayerPart]:
    """Every job's part in this process, in turn: the next layer's blocks are read in a
    background thread while this one is computed on ``threads`` threads (default: the CPU
    count); at most two layers' blocks are alive."""
    jobs = list(jobs)
    if not jobs:
        return []
    out = []
    with ThreadPoolExecutor(1, thread_name_prefix="attnbase-read") as reader, \
            ThreadPoolExecutor(max(1, threads or os.cpu_count() or 1)) as pool:
        ahead = reader.submit(read_inputs, jobs[0])
        for i, job in enumerate(jobs):
            blocks = ahead.result()
            if i + 1 < len(jobs):
                ahead = reader.submit(read_inputs, jobs[i + 1])
            out.append(compute_part(job, *blocks, pool=pool))
            del blocks
            if tick:
                tick()
    return out


def assemble_keys(parts: list[LayerPart], n_layers: int, n_kv_heads: int, n_seqs: int,
                  m: int, D: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The layers' key statistics as the arrays of ``analyze.key_statistics``: per-kv metrics
    ``(layer, kv)`` and the per-sequence values of the null tests."""
    import warnings

    L, KV = n_layers, n_kv_heads
    per_kv = {name: np.full((L, KV), np.nan)
              for name in (N.key_norm_cv, N.key_norm_cv_excl_sink, f"ve_at_{K}", N.ve_shuffle)}
    ve_seq = np.full((L, KV, n_seqs), np.nan)
    shuffle = np.full((L, KV, m, D), np.nan)
    shuffle_idx = np.zeros((L, KV, m), dtype=np.int64)
    seen = set()
    for p in parts:
        if p.keys is None:
            continue
        cv, cv_x, ve, idx, null = p.keys
        per_kv[N.key_norm_cv][p.layer] = cv
        per_kv[N.key_norm_cv_excl_sink][p.layer] = cv_x
        ve_seq[p.layer], shuffle_idx[p.layer], shuffle[p.layer] = ve, idx, null
        seen.add(p.layer)
    if seen != set(range(L)):
        raise StatsError(f"key statistics of layers {sorted(set(range(L)) - seen)} are missing")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a head whose every sequence is NaN
        per_kv[f"ve_at_{K}"] = np.nanmean(ve_seq, axis=-1)
        sampled = np.take_along_axis(ve_seq, shuffle_idx, axis=-1)
        per_kv[N.ve_shuffle] = np.nanmean(np.where(np.isnan(sampled)[..., None], np.nan, shuffle),
                                          axis=(-2, -1))
    return per_kv, {"ve_seq": ve_seq, "shuffle_seq": shuffle, "shuffle_idx": shuffle_idx,
                    "seq_draws": D, "shuffle_seqs": m}
