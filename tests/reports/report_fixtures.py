"""A small synthetic catalog with the docs/architecture.md tables, built directly with DuckDB.

Runs:
- ``gpt2-a``: runs + row_stats + col_stats + the collapse signature (head_metrics, null_tests,
  layer_metrics, run_metrics) — no routing, rank-collapse or convention studies.
- ``neox-b``: everything of gpt2-a plus routing_fraction / routing_erank, rank_collapse and a
  reversal/ARI study.
- ``bare``: only a runs row (extracted, nothing analysed, no row_stats).
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np

L, H, S, T = 4, 4, 2, 8

SCHEMA = """
CREATE TABLE runs(run_id VARCHAR PRIMARY KEY, model VARCHAR, model_revision VARCHAR,
  family VARCHAR, n_layers INTEGER, n_heads INTEGER, n_kv_heads INTEGER, d_head INTEGER,
  d_model INTEGER, rotary BOOLEAN, causal BOOLEAN, sink_token VARCHAR, n_seqs INTEGER,
  seq_len INTEGER, corpus VARCHAR, corpus_hash VARCHAR, dtype VARCHAR, config_hash VARCHAR,
  status VARCHAR, created_at TIMESTAMP, finished_at TIMESTAMP, attnbase_version VARCHAR);
CREATE TABLE arrays(run_id VARCHAR, name VARCHAR, path VARCHAR, dims VARCHAR[], shape BIGINT[],
  chunks BIGINT[], dtype VARCHAR);
CREATE TABLE batches(run_id VARCHAR, batch INTEGER, first_seq INTEGER, n_seqs INTEGER,
  status VARCHAR, written_at TIMESTAMP);
CREATE TABLE row_stats(run_id VARCHAR, layer INTEGER, head INTEGER, seq INTEGER, query INTEGER,
  n_keys INTEGER, sink_mass DOUBLE, max_prob DOUBLE, argmax INTEGER, entropy DOUBLE,
  sink_balance DOUBLE, content_entropy DOUBLE, content_dispersion DOUBLE);
CREATE TABLE col_stats(run_id VARCHAR, layer INTEGER, head INTEGER, seq INTEGER, key INTEGER,
  received DOUBLE);
CREATE TABLE head_metrics(run_id VARCHAR, layer INTEGER, head INTEGER, metric VARCHAR,
  value DOUBLE);
CREATE TABLE null_tests(run_id VARCHAR, layer INTEGER, head INTEGER, metric VARCHAR,
  null_model VARCHAR, statistic DOUBLE, null_mean DOUBLE, null_sd DOUBLE, z DOUBLE,
  draws INTEGER, seed BIGINT, p_value DOUBLE, p_method VARCHAR, p_empirical DOUBLE,
  p_at_floor BOOLEAN, q_value DOUBLE);
CREATE TABLE layer_metrics(run_id VARCHAR, layer INTEGER, metric VARCHAR, value DOUBLE);
CREATE TABLE run_metrics(run_id VARCHAR, metric VARCHAR, value DOUBLE);
CREATE TABLE studies(study_id VARCHAR, kind VARCHAR, run_ids VARCHAR[], params JSON,
  created_at TIMESTAMP);
CREATE TABLE study_results(study_id VARCHAR, key VARCHAR, value DOUBLE);
"""


def _row(rng: np.random.Generator, n: int, sink_logit: float) -> dict:
    z = rng.normal(size=n)
    z[0] += sink_logit
    p = np.exp(z - z.max())
    p /= p.sum()
    s = float(p[0])
    out = {"n_keys": n, "sink_mass": s, "max_prob": float(p.max()), "argmax": int(p.argmax()),
           "entropy": float(-(p * np.log(p)).sum()), "sink_balance": math.nan,
           "content_entropy": math.nan, "content_dispersion": math.nan}
    if n >= 2:
        lp = np.log(p)
        out["sink_balance"] = float(math.sqrt((n - 1) / n) * (lp[0] - lp[1:].mean()))
    if n >= 3:
        pi = p[1:] / (1 - s)
        out["content_entropy"] = float(-(pi * np.log(pi)).sum())
        lpi = np.log(pi)
        out["content_dispersion"] = float(np.linalg.norm(lpi - lpi.mean()))
    return out


def _insert(con, table: str, rows: list[tuple]) -> None:
    """Bulk insert through Arrow (DuckDB's executemany is row by row and slow)."""
    import pyarrow as pa

    names = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    frame = pa.table({n: [row[i] for row in rows] for i, n in enumerate(names)})
    con.register("_frame", frame)
    con.execute(f"INSERT INTO {table} SELECT * FROM _frame")
    con.unregister("_frame")


def _fill_run(con, run_id: str, model: str, seed: int, *, extras: bool, n_layers: int = L) -> None:
    rng = np.random.default_rng(seed)
    con.execute(
        "INSERT INTO runs VALUES (?, ?, 'rev-abc123', ?, ?, ?, ?, 16, 64, ?, true, '<bos>', ?, ?,"
        " 'default', 'corpus-9f8e', 'float32', ?, 'complete', now(), now(), '0.1.0')",
        [run_id, model, model.split("-")[0], n_layers, H, H, model.startswith("neox"), S, T,
         f"cfg-{run_id}"])
    rows, cols = [], []
    for layer in range(n_layers):
        for head in range(H):
            sink = 0.5 + 1.2 * layer + 0.3 * head
            for seq in range(S):
                received = np.zeros(T)
                for q in range(T):
                    r = _row(rng, q + 1, sink)
                    rows.append((run_id, layer, head, seq, q, *r.values()))
                    received[0] += r["sink_mass"]
                for k in range(T):
                    cols.append((run_id, layer, head, seq, k, float(received[k])))
    _insert(con, "row_stats", rows)
    _insert(con, "col_stats", cols)

    hm, nt = [], []
    for layer in range(n_layers):
        for head in range(H):
            cv = 0.09 + (0.035 if extras else 0.05) * layer + 0.01 * rng.random()
            share = min(0.95, 0.06 + (0.12 if extras else 0.2) * layer + 0.03 * head)
            ve = 0.35 + 0.1 * layer + 0.02 * rng.random()
            hm += [(run_id, layer, head, "key_norm_cv", cv),
                   (run_id, layer, head, "key_norm_cv_excl_sink", cv * 0.8),
                   (run_id, layer, head, "max_share", share),
                   (run_id, layer, head, "row_max_share", share * 1.1),
                   (run_id, layer, head, "ve_at_8", ve)]
            if extras:
                hm += [(run_id, layer, head, "routing_fraction", 0.3 + 0.1 * layer),
                       (run_id, layer, head, "routing_erank", 6.0 - layer)]
            for null, nmean, nsd, draws, nseed in (("gauss", 0.294, 0.01, 200, 0),
                                                    ("shuffle", 0.30 + 0.02 * layer, 0.015, 20, 1)):
                p = 1 / (1 + draws) if ve > nmean + 2 * nsd else 0.5
                nt.append((run_id, layer, head, "ve_at_8", null, ve, nmean, nsd,
                           (ve - nmean) / nsd, draws, nseed, p, "clt_normal", p,
                           p == 1 / (1 + draws), min(1.0, p * 2)))
    _insert(con, "head_metrics", hm)
    _insert(con, "null_tests", nt)
    con.execute("""INSERT INTO layer_metrics SELECT run_id, layer, metric, avg(value)
                   FROM head_metrics WHERE run_id = ? GROUP BY ALL""", [run_id])
    if extras:
        con.executemany("INSERT INTO layer_metrics VALUES (?,?,?,?)",
                        [(run_id, layer, "rank_collapse", 0.9 * 0.7 ** layer)
                         for layer in range(n_layers + 1)]
                        + [(run_id, layer, "rank_collapse_sd", 0.05) for layer in range(n_layers + 1)])
        con.execute("INSERT INTO studies VALUES ('rev-1', 'reversal', ?, "
                    "'{\"boot\": 200, \"bootstrap_units\": 32}', now())", [[run_id]])
        con.execute("INSERT INTO studies VALUES ('clu-1', 'clusters', ?, '{\"draws\": 999, "
                    "\"min_cluster\": 4, \"min_cluster_share\": 0.05, \"k_max\": 12, "
                    "\"boot\": 200, \"normal_fit_rule\": {\"min_distinct\": 20, "
                    "\"max_tie\": 0.2}}', now())", [[run_id]])
        # keys as docs/architecture.md names them: <statistic>/<dissimilarity>
        con.executemany("INSERT INTO study_results VALUES (?,?,?)",
                        [("rev-1", "reversal_rate/cosine", 0.31),
                         ("rev-1", "reversal_ci_low/cosine", 0.30),
                         ("rev-1", "reversal_ci_high/cosine", 0.32),
                         ("rev-1", "reversal_triplets/cosine", 50000.0),
                         ("rev-1", "reversal_exact/cosine", 0.0),
                         ("clu-1", "k/js", 3.0), ("clu-1", "silhouette/js", 0.5),
                         ("clu-1", "ari/js", 0.42), ("clu-1", "ari_p/js", 0.001),
                         ("clu-1", "ari_p_at_floor/js", 1.0),
                         ("clu-1", "ari_p_normal/js", 1e-5),
                         ("clu-1", "ari_null_distinct/js", 41.0),
                         ("clu-1", "ari_ci_low/js", 0.30), ("clu-1", "ari_ci_high/js", 0.55),
                         ("clu-1", "cluster_size/js/1", 30.0), ("clu-1", "cluster_size/js/2", 24.0),
                         ("clu-1", "cluster_size/js/3", 18.0),
                         # no partition of euclidean distances had every cluster >= 4 heads
                         ("clu-1", "k/euclidean", None), ("clu-1", "ari/euclidean", None)])
    metrics = {"key_norm_cv": 0.17, "key_norm_cv_baseline": 1 / math.sqrt(32), "ve_at_8": 0.5,
               "ve_gauss": 0.294, "ve_shuffle": 0.33, "onset_layer": 1.0, "onset_depth": 0.25,
               "r_cv_share": 0.81, "r_cv_share_p": 1.2e-4}
    if extras:
        metrics.update(onset_layer=2.0, onset_depth=0.5, r_cv_share=0.74, ve_at_8=0.52)
    con.executemany("INSERT INTO run_metrics VALUES (?,?,?)",
                    [(run_id, k, v) for k, v in metrics.items()])


def make_catalog(db_dir: Path, *, minimal_tables: bool = False) -> Path:
    """Create ``db_dir/catalog.duckdb``; with ``minimal_tables`` only runs + row_stats exist."""
    db_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(db_dir / "catalog.duckdb"))
    try:
        con.execute(SCHEMA)
        _fill_run(con, "gpt2-a", "gpt2-tiny", 1, extras=False)
        _fill_run(con, "neox-b", "neox-tiny", 2, extras=True)
        con.execute("INSERT INTO runs (run_id, model, n_layers, n_heads, status, dtype) "
                    "VALUES ('bare', 'gpt2-tiny', 4, 4, 'running', 'float32')")
        if minimal_tables:
            for t in ("head_metrics", "null_tests", "layer_metrics", "run_metrics",
                      "study_results", "studies"):
                con.execute(f"DROP TABLE {t}")
    finally:
        con.close()
    return db_dir


def make_depth_catalog(db_dir: Path, layers=(6, 18, 30)) -> Path:
    """Runs ``deep-<L>`` of ``L`` layers each (everything ``neox-b`` has): the report's tables
    and figures at the depths of MiniLM-like, mid-size and SmolLM2-like models."""
    db_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(db_dir / "catalog.duckdb"))
    try:
        con.execute(SCHEMA)
        for k, n in enumerate(layers):
            _fill_run(con, f"deep-{n}", "neox-deep", 10 + k, extras=True, n_layers=n)
        # the studies of _fill_run have fixed ids: the first run keeps them
        con.execute("DELETE FROM studies WHERE NOT list_contains(run_ids, ?)",
                    [f"deep-{layers[0]}"])
        con.execute("CREATE OR REPLACE TABLE study_results AS "
                    "SELECT DISTINCT * FROM study_results")
    finally:
        con.close()
    return db_dir


if __name__ == "__main__":  # used by `make test-browser`
    import sys

    print(make_catalog(Path(sys.argv[1])))
