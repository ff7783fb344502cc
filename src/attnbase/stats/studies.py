"""Studies over runs, stored as ``studies`` rows (docs/metrics.md §4-5; docs/architecture.md tables).

A study is identified by ``<kind>-<runs>-<hash of params>``: re-running the same study replaces
its rows (``study_results``, ``head_distances``, ``head_clusters``, ``entropy_change``) in one
transaction, so nothing is duplicated or half-written. ``params`` (JSON) records everything that
determines the numbers: rows, seed, draws, conventions, min_query, source study.

- :func:`distances_study` streams ``attn_logits`` one seq chunk at a time (all layers of a few
  sequences; never a run's logits at once) into :class:`HeadDistanceAccumulator`.
- :func:`reversal_study` and :func:`clusters_study` read a distances study back from the catalog.
- :func:`entropy_study` (in :mod:`attnbase.stats.entropy_study`) needs only ``row_stats``.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from attnbase.contract import DEFAULT_SINK, sink_keys, sink_set
from attnbase.errors import StatsError
from attnbase.metrics import S, unregistered_keys
from attnbase.stats import convention, text_bootstrap
from attnbase.stats.head_distances import CONVENTIONS, DISSIMILARITIES, HeadDistanceAccumulator
from attnbase.stats.text_bootstrap import unit_of_seq
from attnbase.warehouse.catalog.rows import insert_table
from attnbase.stats.weights_only import refuse_weights_only

if TYPE_CHECKING:
    from attnbase.warehouse import Database

#: Dissimilarities whose verdicts can depend on the convention (aitchison_perp cannot: it drops
#: the sink by definition, so its reversal rate is 0 and its ARI 1 by construction).
COMPARED = ("cosine", "js", "euclidean", "aitchison")
#: Queries per row group: rows of a group share one trimmed key length.
_QUERY_GROUP = 16


def make_study_id(kind: str, run_ids: list[str], params: dict) -> str:
    """``<kind>-<run>[+<run>...]-<8 hex of the params>`` (deterministic)."""
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()
    return f"{kind}-{'+'.join(run_ids)}-{digest[:8]}"


def write_study(db: Database, kind: str, run_ids: list[str], params: dict,
                results: dict[str, float], tables: dict[str, pa.Table] | None = None) -> str:
    """Replace one study's rows everywhere, in one transaction; returns its ``study_id``.
    Every key's name is a registered result of ``kind`` (attnbase/metrics.py)."""
    from attnbase.warehouse.catalog.study_tables import STUDY_TABLES

    bad = unregistered_keys(kind, results)
    if bad:
        raise StatsError(f"{kind} study results {', '.join(map(repr, bad[:5]))} are not "
                         f"registered; declare them in attnbase/metrics.py (S.{kind})")
    sid = make_study_id(kind, run_ids, params)
    res = pa.table({"study_id": [sid] * len(results), "key": [str(k) for k in results],
                    "value": [None if v is None else float(v) for v in results.values()]})
    tables = {"study_results": res, **(tables or {})}
    with db.transaction() as con:
        con.execute("DELETE FROM studies WHERE study_id = ?", [sid])
        for t in STUDY_TABLES:
            con.execute(f"DELETE FROM {t} WHERE study_id = ?", [sid])
        con.execute("INSERT INTO studies VALUES (?, ?, ?, ?, current_timestamp::TIMESTAMP)",
                    [sid, kind, run_ids, json.dumps(params, sort_keys=True, default=str)])
        for name, tbl in tables.items():
            insert_table(con, name, tbl)
    return sid


def find_study(db: Database, kind: str, run_id: str,
               study_id: str | None = None) -> tuple[str, dict]:
    """The given study or the latest ``kind`` study of ``run_id``: ``(study_id, params)``."""
    with db.connect(read_only=True) as con:
        if study_id is not None:
            row = con.execute("SELECT study_id, params FROM studies WHERE study_id = ? AND kind = ?",
                              [study_id, kind]).fetchone()
        else:
            row = con.execute(
                "SELECT study_id, params FROM studies WHERE kind = ? AND list_contains(run_ids, ?) "
                "ORDER BY created_at DESC LIMIT 1", [kind, run_id]).fetchone()
    if row is None:
        refuse_weights_only(db, run_id, f"a {kind} study")
        what = f"study {study_id!r}" if study_id else f"{kind} study of run {run_id!r}"
        raise StatsError(f"no {what} in {db.name}; run `attnbase study {kind} --db {db.name} "
                         f"--run {run_id}` first")
    return row[0], json.loads(row[1]) if row[1] else {}


def study_result(db: Database, study_id: str, key: str) -> float | None:
    """One value of ``study_results`` (None when the study did not record it)."""
    with db.connect(read_only=True) as con:
        row = con.execute("SELECT value FROM study_results WHERE study_id = ? AND key = ?",
                          [study_id, key]).fetchone()
    return None if row is None else row[0]


# --- distances ---------------------------------------------------------------------------------
def run_sink(info: dict) -> tuple[int, ...]:
    """The sink set a ``runs`` row records (``sink_positions``; key 0 where it is NULL)."""
    return sink_set(info.get("sink_positions"))


def row_set(n_seqs: int, seq_len: int, min_query: int = 2, max_rows: int | None = None,
            seed: int = 0) -> np.ndarray:
    """The shared row set ``(row, 2)`` of ``(seq, query)`` with ``query >= min_query``, sorted.

    ``max_rows`` draws a seeded uniform subsample without replacement.

    Examples
    --------
    >>> row_set(2, 4, min_query=2).tolist()
    [[0, 2], [0, 3], [1, 2], [1, 3]]
    """
    if min_query < 2:
        raise StatsError(f"min_query={min_query}: content compositions need queries i >= 2")
    if min_query >= seq_len:
        raise StatsError(f"min_query={min_query} leaves no rows in windows of {seq_len} tokens")
    s, q = np.meshgrid(np.arange(n_seqs), np.arange(min_query, seq_len), indexing="ij")
    rows = np.stack([s.ravel(), q.ravel()], axis=1)
    if max_rows is not None and max_rows < len(rows):
        if max_rows < 1:
            raise StatsError(f"max_rows={max_rows} must be >= 1")
        pick = np.sort(np.random.default_rng(seed).choice(len(rows), size=max_rows, replace=False))
        rows = rows[pick]
    return rows


def head_distance_matrices(db: Database, run_id: str, *, dissimilarities=DISSIMILARITIES,
                           min_query: int = 2, max_rows: int | None = None, seed: int = 0,
                           progress: bool = False):
    """Stream a run's ``attn_logits`` into head distance matrices (docs/metrics.md §5).

    Returns ``(matrices {(dissimilarity, convention): (head, head)}, heads (head, 2) of
    (layer, head), n_rows, n_rows_without_sink, parts)``; head index ``k = layer * n_heads +
    head``; ``parts`` (:class:`~attnbase.stats.text_bootstrap.SeqParts`) the per-sequence partial
    sums the bootstrap over the text resamples.
    Positions whose key 0 a sliding-window layer masks leave the shared row set (counted).
    Memory: one seq chunk of logits ``(layer, head, seq_chunk, query, key)`` plus one row
    group's float64 copies.
    """
    sink = run_sink(db.run_info(run_id))  # RunNotFoundError naming the known runs
    store = db.run(run_id).store()
    if "attn_logits" not in store.names():
        raise StatsError(f"run {run_id!r} has no attn_logits (stored, or derived from queries "
                         "and keys); re-extract it with `--capture keys,queries` to study head "
                         "distances")
    arr = store.array("attn_logits")
    n_layers, n_heads, n_seqs, seq_len, _ = arr.shape
    rows = row_set(n_seqs, seq_len, min_query, max_rows, seed)
    acc = HeadDistanceAccumulator(n_layers * n_heads, tuple(dissimilarities), sink)
    chunk = max(1, arr.chunks[2])
    units = unit_of_seq(n_seqs)
    n_no_sink = 0
    bar = None
    from rich.console import Console

    console = Console(stderr=True)
    if progress and console.is_terminal:  # no bar in piped output
        from rich.progress import Progress

        bar = Progress(transient=True, console=console)
        bar.start()
        task = bar.add_task(f"distances {run_id}", total=n_seqs)
    try:
        for s0 in range(0, n_seqs, chunk):
            s1 = min(n_seqs, s0 + chunk)
            sel = rows[(rows[:, 0] >= s0) & (rows[:, 0] < s1)]
            block = None
            if len(sel):
                block = store.read("attn_logits", (slice(None), slice(None), slice(s0, s1)))
                block = block.reshape(n_layers * n_heads, s1 - s0, seq_len, seq_len)
            for s in range(s0, s1):  # one sequence at a time: its partial sums are a unit's
                mine = sel[sel[:, 0] == s]
                groups = mine[:, 1] // _QUERY_GROUP
                for g in np.unique(groups):
                    part = mine[groups == g]
                    z = block[:, s - s0, part[:, 1], :]  # (head, row, key)
                    # a sliding-window layer masks key 0 (the sink) for queries past its
                    # window: the two conventions differ only where the sink is visible, so
                    # those positions leave the shared row set (counted, not refused)
                    sink_seen = np.isfinite(z[:, :, sink_keys(sink, seq_len)]).all(axis=(0, 2))
                    n_no_sink += int((~sink_seen).sum())
                    z = z[:, sink_seen]
                    if z.shape[1] == 0:
                        continue
                    live = np.isfinite(z).any(axis=(0, 1)).nonzero()[0]
                    acc.add(z[..., : int(live.max()) + 1])
                if s == n_seqs - 1 or units[s + 1] != units[s]:
                    acc.end_unit()
            if bar is not None:
                bar.update(task, completed=s1)
    finally:
        if bar is not None:
            bar.stop()
    heads = np.stack(np.divmod(np.arange(n_layers * n_heads), n_heads), axis=1)
    if acc.n_rows == 0 and n_no_sink:
        raise StatsError(f"run {run_id!r}: every one of the {n_no_sink} rows has key 0 (the sink) "
                         "masked by a sliding window in some layer; head distances need "
                         "queries inside every layer's window (a shorter --seq-len)")
    return acc.result(), heads, acc.n_rows, n_no_sink, acc.parts()


def distances_study(db: Database, run_id: str, *, dissimilarities=DISSIMILARITIES,
                    min_query: int = 2, max_rows: int | None = None, seed: int = 0,
                    progress: bool = False) -> str:
    """Compute and store the head distances of a run; returns the ``study_id``."""
    import time

    t0 = time.perf_counter()
    refuse_weights_only(db, run_id, "`attnbase study distances`")
    mats, heads, n_rows, n_no_sink, seq_parts = head_distance_matrices(
        db, run_id, dissimilarities=dissimilarities, min_query=min_query, max_rows=max_rows,
        seed=seed, progress=progress)
    n = len(heads)
    ia, ib = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    ia, ib = ia.ravel(), ib.ravel()
    parts = []
    for (d, c), m in sorted(mats.items()):
        parts.append(pa.table({
            "dissimilarity": [d] * (n * n), "convention": [c] * (n * n),
            "layer_a": heads[ia, 0].astype(np.int16), "head_a": heads[ia, 1].astype(np.int16),
            "layer_b": heads[ib, 0].astype(np.int16), "head_b": heads[ib, 1].astype(np.int16),
            "value": m.ravel()}))
    tbl = pa.concat_tables(parts)
    params = {"min_query": min_query, "max_rows": max_rows, "seed": seed, "rows": n_rows,
              "dissimilarities": list(dissimilarities), "conventions": list(CONVENTIONS)}
    sink = run_sink(db.run_info(run_id))
    if sink != DEFAULT_SINK:  # drop_sink dropped the whole set (docs/metrics.md "Sink sets")
        params["sink_positions"] = list(sink)
    D = S.distances
    results = {D.n_heads: float(n), D.n_rows: float(n_rows),
               D.rows_without_sink_dropped: float(n_no_sink),
               D.seconds: time.perf_counter() - t0}
    results[D.bootstrap_units] = float(seq_parts.n_units)
    sid = make_study_id("distances", [run_id], params)
    tbl = tbl.append_column("study_id", pa.array([sid] * tbl.num_rows))
    # the partial sums first: a study row exists only where its file does
    text_bootstrap.save_parts(db.run(run_id), sid, seq_parts)
    return write_study(db, "distances", [run_id], params, results, {"head_distances": tbl})


def load_distances(db: Database, study_id: str
                   ) -> tuple[dict[tuple[str, str], np.ndarray], np.ndarray]:
    """A distances study back as ``({(dissimilarity, convention): matrix}, heads (head, 2))``."""
    with db.connect(read_only=True) as con:
        df = con.execute(
            "SELECT dissimilarity, convention, layer_a, head_a, layer_b, head_b, value "
            "FROM head_distances WHERE study_id = ?", [study_id]).fetchnumpy()
    if len(df["value"]) == 0:
        raise StatsError(f"study {study_id!r} has no head_distances rows; re-run the distances study")
    heads = np.unique(np.stack([df["layer_a"], df["head_a"]], axis=1).astype(np.int64), axis=0)
    index = {tuple(h): k for k, h in enumerate(heads.tolist())}
    ka = np.array([index[(a, b)] for a, b in zip(df["layer_a"].tolist(), df["head_a"].tolist())])
    kb = np.array([index[(a, b)] for a, b in zip(df["layer_b"].tolist(), df["head_b"].tolist())])
    out: dict[tuple[str, str], np.ndarray] = {}
    diss = np.asarray(df["dissimilarity"], dtype=object)
    conv = np.asarray(df["convention"], dtype=object)
    for d in np.unique(diss):
        for c in np.unique(conv):
            sel = (diss == d) & (conv == c)
            if not sel.any():
                continue
            m = np.zeros((len(heads), len(heads)))
            m[ka[sel], kb[sel]] = df["value"][sel]
            out[(str(d), str(c))] = m
    return out, heads


# --- reversal and clusters ---------------------------------------------------------------------
def load_parts(db: Database, run_id: str, study_id: str):
    """A distances study's per-sequence partial sums (:mod:`attnbase.stats.text_bootstrap`)."""
    run = db.run(run_id)
    try:
        return text_bootstrap.load_parts(run, study_id)
    except FileNotFoundError:
        path = text_bootstrap.parts_path(run, study_id)
        raise StatsError(f"distances study {study_id!r} has no per-sequence partial sums ({path}); "
                         f"it predates intervals over the text: re-run `attnbase study distances "
                         f"--db {db.name} --run {run_id}`") from None


def reversal_study(db: Database, run_id: str, *, draws: int = 50_000, seed: int = 0,
                   distances: str | None = None, exact_limit: int = convention.EXACT_LIMIT,
                   force_sampled: bool = False, boot: int = text_bootstrap.BOOT
                   ) -> tuple[str, dict[str, Any]]:
    """Reversal rate per dissimilarity with its CI over the text; ``(study_id, results)``."""
    src, src_params = find_study(db, "distances", run_id, distances)
    parts = load_parts(db, run_id, src)
    results: dict[str, Any] = {}
    R = S.reversal
    for d in COMPARED:
        if (d, "with_sink") not in parts.sums:
            continue
        r = convention.reversal_over_text(parts, (d, "with_sink"), (d, "drop_sink"), draws=draws,
                                          seed=seed, boot=boot, exact_limit=exact_limit,
                                          force_sampled=force_sampled)
        results.update({R.reversal_rate(d): r.rate, R.reversal_ci_low(d): r.ci_low,
                        R.reversal_ci_high(d): r.ci_high, R.reversal_triplets(d): r.triplets,
                        R.reversal_exact(d): float(r.exact),
                        R.reversal_triplet_se(d): r.triplet_se,
                        R.reversal_boot_mean(d): r.boot_mean,
                        R.reversal_boot_sd(d): r.boot_sd,
                        R.reversal_ci_floor(d): float(r.ci_floor)})
    params = {"distances": src, "draws": draws, "seed": seed, "exact_limit": exact_limit,
              "force_sampled": force_sampled, "rows": src_params.get("rows"),
              "conventions": list(CONVENTIONS), "n_heads": parts.n_heads, "boot": boot,
              "bootstrap_units": parts.n_units,
              "ci": "percentile bootstrap over sequences (+ triplet-sampling error if sampled)"}
    return write_study(db, "reversal", [run_id], params, results), results


PRESETS = {"all": COMPARED, "clark": ("js",)}


def clusters_study(db: Database, run_id: str, *, preset: str = "all", draws: int = 999,
                   seed: int = 0, k_max: int = 12, distances: str | None = None,
                   min_cluster_share: float = convention.MIN_CLUSTER_SHARE,
                   boot: int = text_bootstrap.BOOT) -> tuple[str, dict[str, Any]]:
    """Clustering ARI per dissimilarity with MDS coordinates; ``(study_id, results)``.

    ``preset``: ``all`` (cosine, js, euclidean, aitchison) or ``clark`` (js only, Clark et al.
    2019). k is chosen among partitions whose smallest cluster holds >= ``max(2,
    min_cluster_share * heads)`` heads (:func:`attnbase.stats.convention.min_cluster_size`).
    Results per dissimilarity ``d``: ``k/d`` (None where no k qualifies, and then no ARI),
    ``qualified/d``, ``min_cluster/d``, ``cluster_size/d/<i>`` and ``cluster_size_drop/d/<i>``
    (largest first, i from 1), ``ari/d``, ``ari_p/d``, ``ari_null_distinct/d``,
    ``ari_p_normal/d`` (None unless the null is continuous), ``ari_ci_low|high/d`` and
    ``ari_boot_sd/d`` (over ``boot`` sequence resamples). Every (dissimilarity, convention)
    gets its labels and 2-D MDS in ``head_clusters`` (cluster 0 for every head where no k
    qualifies).
    """
    if preset not in PRESETS:
        raise StatsError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if not 0 <= min_cluster_share < 0.5:
        raise StatsError(f"min_cluster_share={min_cluster_share} must be in [0, 0.5)")
    src, src_params = find_study(db, "distances", run_id, distances)
    mats, heads = load_distances(db, src)
    parts = load_parts(db, run_id, src)
    min_cluster = convention.min_cluster_size(len(heads), min_cluster_share)
    params = {"distances": src, "preset": preset, "draws": draws, "seed": seed, "k_max": k_max,
              "rows": src_params.get("rows"), "conventions": list(CONVENTIONS),
              "linkage": "average", "min_cluster_share": min_cluster_share,
              "min_cluster": min_cluster, "boot": boot, "bootstrap_units": parts.n_units,
              "normal_fit_rule": {"min_distinct": convention.NORMAL_FIT_MIN_DISTINCT,
                                  "max_tie": convention.NORMAL_FIT_MAX_TIE}}
    sid = make_study_id("clusters", [run_id], params)
    results: dict[str, Any] = {}
    parts_tables = []
    C = S.clusters
    for d in PRESETS[preset]:
        if (d, "with_sink") not in mats:
            continue
        kw, kd = (d, "with_sink"), (d, "drop_sink")
        r = convention.cluster_agreement(mats[kw], mats[kd], k_max=k_max, draws=draws, seed=seed,
                                         min_cluster=min_cluster)
        results.update({C.k(d): r.k, C.qualified(d): float(r.k is not None),
                        C.min_cluster(d): float(r.min_cluster),
                        C.silhouette(d): r.silhouette, C.ari(d): r.ari,
                        C.ari_p(d): r.ari_p, C.ari_p_normal(d): r.ari_p_normal,
                        C.ari_null_mean(d): r.ari_null_mean, C.ari_null_sd(d): r.ari_null_sd,
                        C.ari_null_distinct(d): float(r.null_distinct) if r.k else None,
                        C.ari_p_at_floor(d): float(r.p_at_floor)})
        for i, size in enumerate(r.sizes_with, 1):
            results[C.cluster_size(d, i)] = float(size)
        for i, size in enumerate(r.sizes_drop, 1):
            results[C.cluster_size_drop(d, i)] = float(size)
        if r.k is not None and parts.n_units >= 2:
            lo, hi, _, sd = convention.ari_over_text(parts, kw, kd, r.k, boot=boot, seed=seed)
            results.update({C.ari_ci_low(d): lo, C.ari_ci_high(d): hi,
                            C.ari_boot_sd(d): sd})
        for c, labels in (("with_sink", r.labels_with), ("drop_sink", r.labels_drop)):
            xy = convention.mds_coordinates(mats[(d, c)], seed=seed)
            parts_tables.append(pa.table({
                "study_id": [sid] * len(heads), "dissimilarity": [d] * len(heads),
                "convention": [c] * len(heads), "layer": heads[:, 0].astype(np.int16),
                "head": heads[:, 1].astype(np.int16), "cluster": labels.astype(np.int32),
                "mds_x": xy[:, 0], "mds_y": xy[:, 1]}))
    tables = {"head_clusters": pa.concat_tables(parts_tables)} if parts_tables else {}
    return write_study(db, "clusters", [run_id], params, results, tables), results
