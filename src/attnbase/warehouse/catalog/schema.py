"""The warehouse's own catalog schema: its migrations, versions 1-99 (docs/architecture.md's
tables; the registry and the runner are :mod:`attnbase.warehouse.catalog.migrations`)."""

from __future__ import annotations

import re

from attnbase.warehouse.catalog.migrations import Migration, _sql


# --- migration 1: the tables of docs/architecture.md ----------------------------------------------
# Key columns are NOT NULL; only tables that are small get a primary key (an index on row_stats
# would cost more at insert than it saves: its reads are scans grouped by layer/head).
_V1 = _sql(
    """
    CREATE TABLE IF NOT EXISTS runs (
        run_id VARCHAR PRIMARY KEY,
        model VARCHAR NOT NULL,
        model_revision VARCHAR,
        family VARCHAR NOT NULL,
        n_layers INTEGER NOT NULL,
        n_heads INTEGER NOT NULL,
        n_kv_heads INTEGER NOT NULL,
        d_head INTEGER NOT NULL,
        d_model INTEGER NOT NULL,
        rotary BOOLEAN NOT NULL,
        causal BOOLEAN NOT NULL,
        sink_token VARCHAR,
        n_seqs INTEGER NOT NULL,
        seq_len INTEGER NOT NULL,
        corpus VARCHAR NOT NULL,
        corpus_hash VARCHAR,
        dtype VARCHAR NOT NULL,
        config_hash VARCHAR NOT NULL,
        status VARCHAR NOT NULL CHECK (status IN ('running', 'complete', 'failed')),
        created_at TIMESTAMP NOT NULL,
        finished_at TIMESTAMP,
        attnbase_version VARCHAR NOT NULL,
        config JSON
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS arrays (
        run_id VARCHAR NOT NULL,
        name VARCHAR NOT NULL,
        path VARCHAR NOT NULL,
        dims VARCHAR[] NOT NULL,
        shape BIGINT[] NOT NULL,
        chunks BIGINT[] NOT NULL,
        dtype VARCHAR NOT NULL,
        PRIMARY KEY (run_id, name)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS batches (
        run_id VARCHAR NOT NULL,
        batch INTEGER NOT NULL,
        first_seq INTEGER NOT NULL,
        n_seqs INTEGER NOT NULL,
        status VARCHAR NOT NULL CHECK (status IN ('pending', 'complete')),
        written_at TIMESTAMP,
        PRIMARY KEY (run_id, batch)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS row_stats (
        run_id VARCHAR NOT NULL,
        layer SMALLINT NOT NULL,
        head SMALLINT NOT NULL,
        seq INTEGER NOT NULL,
        query INTEGER NOT NULL,
        n_keys INTEGER,
        sink_mass DOUBLE,
        max_prob DOUBLE,
        argmax INTEGER,
        entropy DOUBLE,
        sink_balance DOUBLE,
        content_entropy DOUBLE,
        content_dispersion DOUBLE
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS col_stats (
        run_id VARCHAR NOT NULL,
        layer SMALLINT NOT NULL,
        head SMALLINT NOT NULL,
        seq INTEGER NOT NULL,
        key INTEGER NOT NULL,
        received DOUBLE
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS head_metrics (
        run_id VARCHAR NOT NULL,
        layer SMALLINT NOT NULL,
        head SMALLINT NOT NULL,
        metric VARCHAR NOT NULL,
        value DOUBLE
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS null_tests (
        run_id VARCHAR NOT NULL,
        layer SMALLINT NOT NULL,
        head SMALLINT NOT NULL,
        metric VARCHAR NOT NULL,
        "null" VARCHAR NOT NULL,
        statistic DOUBLE,
        null_mean DOUBLE,
        null_sd DOUBLE,
        draws INTEGER,
        seed BIGINT,
        p_value DOUBLE,
        q_value DOUBLE
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS layer_metrics (
        run_id VARCHAR NOT NULL,
        layer SMALLINT NOT NULL,
        metric VARCHAR NOT NULL,
        value DOUBLE
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS run_metrics (
        run_id VARCHAR NOT NULL,
        metric VARCHAR NOT NULL,
        value DOUBLE
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS studies (
        study_id VARCHAR PRIMARY KEY,
        kind VARCHAR NOT NULL,
        run_ids VARCHAR[] NOT NULL,
        params JSON,
        created_at TIMESTAMP NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS study_results (
        study_id VARCHAR NOT NULL,
        key VARCHAR NOT NULL,
        value DOUBLE
    )
    """,
)


def _v2_interrupted_status(con) -> None:
    """Allow ``runs.status = 'interrupted'`` (Ctrl-C during extract). DuckDB cannot alter a CHECK
    constraint, so the table is rebuilt from its own DDL with the wider list (keeping any
    columns other migrations added)."""
    ddl = con.execute("SELECT sql FROM duckdb_tables() WHERE table_name = 'runs' "
                      "AND schema_name = 'main'").fetchone()[0]
    m = re.search(r"status IN \(([^)]*)\)", ddl)
    if m is None or "'interrupted'" in m.group(1):
        return
    ddl = ddl.replace(m.group(0), f"status IN ({m.group(1)}, 'interrupted')", 1)
    ddl = re.sub(r"^CREATE TABLE (main\.)?\"?runs\"?\s*\(", "CREATE TABLE runs__v2(", ddl, count=1)
    con.execute(ddl)
    con.execute("INSERT INTO runs__v2 SELECT * FROM runs")
    con.execute("DROP TABLE runs")
    con.execute("ALTER TABLE runs__v2 RENAME TO runs")


def _v3_stats_files(con) -> None:
    from attnbase.warehouse.runs.statfiles import migrate_tables_to_files

    migrate_tables_to_files(con)


# --- migration 10: null_tests as docs/metrics.md §8 asks ------------------------------------------
# The column "null" (which SQL reads as the NULL literal unless quoted) becomes null_model, and
# every null comparison gains z, p_method, p_empirical and p_at_floor, in docs/architecture.md's column
# order (so the table is rebuilt, not altered). Rows written before carry their empirical p-value
# as both p_value and p_empirical, with p_method 'empirical'. The views that read the old column
# are re-created by the stats migration 101.
_V10_REBUILD = _sql(
    "DROP VIEW IF EXISTS head_summary",
    """
    CREATE TABLE null_tests_v10 (
        run_id VARCHAR NOT NULL,
        layer SMALLINT NOT NULL,
        head SMALLINT NOT NULL,
        metric VARCHAR NOT NULL,
        null_model VARCHAR NOT NULL,
        statistic DOUBLE,
        null_mean DOUBLE,
        null_sd DOUBLE,
        z DOUBLE,
        draws INTEGER,
        seed BIGINT,
        p_value DOUBLE,
        p_method VARCHAR,
        p_empirical DOUBLE,
        p_at_floor BOOLEAN,
        q_value DOUBLE
    )
    """,
    """
    INSERT INTO null_tests_v10
    SELECT run_id, layer, head, metric, "null", statistic, null_mean, null_sd,
           CASE WHEN null_sd > 0 THEN (statistic - null_mean) / null_sd END,
           draws, seed, p_value, 'empirical', p_value,
           p_value <= 1.0 / (draws + 1) + 1e-12, q_value
    FROM null_tests
    """,
    "DROP TABLE null_tests",
    "ALTER TABLE null_tests_v10 RENAME TO null_tests",
)
_V10_COLUMNS = {"z": "DOUBLE", "p_method": "VARCHAR", "p_empirical": "DOUBLE",
                "p_at_floor": "BOOLEAN"}


def _v10(con) -> None:
    cols = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'null_tests'"
    ).fetchall()}
    if "null" in cols:
        _V10_REBUILD(con)
        return
    # a catalog created with the new layout by other means: add whatever it lacks
    for name, sql_type in _V10_COLUMNS.items():
        if name not in cols:
            con.execute(f"ALTER TABLE null_tests ADD COLUMN {name} {sql_type}")


def _v12_derived_arrays(con) -> None:
    """``arrays.derived`` / ``arrays.derivation``: an array formed on read from others
    (``attn_logits`` from queries and keys, :class:`attnbase.contract.LogitsRecipe` JSON);
    every array registered before is stored."""
    cols = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'arrays'"
    ).fetchall()}
    if "derived" not in cols:  # the default fills the rows there are
        con.execute("ALTER TABLE arrays ADD COLUMN derived BOOLEAN DEFAULT false")
        _commit_step(con)
    if "derivation" not in cols:
        con.execute("ALTER TABLE arrays ADD COLUMN derivation JSON")


def _commit_step(con) -> None:
    """Commit a migration's ALTER so far and go on in a new transaction: DuckDB 1.5 fails at
    COMMIT, as a duplicate primary key of an untouched row or a conflict with itself, a
    transaction that alters a table after adding a column with a default, or that updates a
    list column. Each step of such a migration checks what is done already, so one stopped
    between two steps completes when it runs again."""
    con.execute("COMMIT")
    con.execute("BEGIN TRANSACTION")


def _v13_store_url(con) -> None:
    """``runs.store_url``: where a run's bytes live when not under DIR (``s3://bucket/prefix/
    <run_id>``, :mod:`attnbase.warehouse.runs.location`); NULL for every run registered before (local,
    ``DIR/runs/<run_id>``)."""
    cols = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'"
    ).fetchall()}
    if "store_url" not in cols:
        con.execute("ALTER TABLE runs ADD COLUMN store_url VARCHAR")


def _v20_stat_files(con) -> None:
    """``stat_files``: every statistics file readers may see, with its crc32c and size; the
    views read exactly those (:mod:`attnbase.warehouse.catalog.statledger`)."""
    from attnbase.warehouse.catalog.statledger import backfill

    backfill(con)


def _v21_run_leases(con) -> None:
    """``run_leases``: one writer per run (:mod:`attnbase.warehouse.catalog.lease`)."""
    from attnbase.warehouse.catalog.lease import DDL

    con.execute(DDL)


def _v60_sink_positions(con) -> None:
    """``runs.sink_positions`` (the key positions every sink statistic reads as the sink; ``[0]``
    for every run registered before), ``runs.n_params`` (the loaded model's parameter count;
    NULL where it was not counted) and ``seq_sources`` (where each window of an image run came
    from: file and crop box)."""
    cols = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'"
    ).fetchall()}
    if "sink_positions" not in cols:  # a default fills the rows there are; new rows name theirs
        con.execute("ALTER TABLE runs ADD COLUMN sink_positions INTEGER[] DEFAULT [0]")
        _commit_step(con)
        con.execute("ALTER TABLE runs ALTER COLUMN sink_positions DROP DEFAULT")
        _commit_step(con)
    if "n_params" not in cols:
        con.execute("ALTER TABLE runs ADD COLUMN n_params BIGINT")
    con.execute("""
        CREATE TABLE IF NOT EXISTS seq_sources (
            run_id VARCHAR NOT NULL,
            seq INTEGER NOT NULL,
            source VARCHAR NOT NULL,
            x0 INTEGER, y0 INTEGER, x1 INTEGER, y1 INTEGER,
            PRIMARY KEY (run_id, seq)
        )""")


#: The warehouse's own migrations (versions 1-99).
MIGRATIONS: list[Migration] = [
    Migration(1, "core tables: runs, arrays, batches, row_stats, col_stats, metrics, studies", _V1),
    Migration(2, "runs.status may be 'interrupted'", _v2_interrupted_status),
    Migration(3, "row_stats/col_stats: per-batch Parquet files read through views", _v3_stats_files),
    Migration(10, "null_tests: null -> null_model; z, p_method, p_empirical, p_at_floor", _v10),
    Migration(12, "arrays: derived, derivation (attn_logits formed from queries and keys)",
              _v12_derived_arrays),
    Migration(13, "runs.store_url: run stores and statistics files on object storage (s3://)",
              _v13_store_url),
    Migration(20, "stat_files: statistics files checksummed; the views read only those listed",
              _v20_stat_files),
    Migration(21, "run_leases: one writer per run (holder PID, host, heartbeat)", _v21_run_leases),
    Migration(60, "runs.sink_positions, runs.n_params, seq_sources (sink sets; parameter "
                  "counts; image windows)",
              _v60_sink_positions),
]
