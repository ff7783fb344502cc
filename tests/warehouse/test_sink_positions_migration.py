"""Migration 60: an existing catalog's runs gain sink_positions ([0], the one-position case of
every run registered before) and n_params (NULL: not counted then)."""

from __future__ import annotations

from attnbase.warehouse import Database

RUN = ("r", "tiny-gpt2", "seed:0", "gpt2", 2, 4, 4, 16, 64, False, True, "(text)", 2, 8,
       "default", "h", "float32", "c", "complete")


def test_existing_runs_get_the_default_sink(tmp_path):
    db = Database(tmp_path / "db")
    db.migrate()
    with db.connect() as con:  # the catalog as it was before migration 60
        con.execute("ALTER TABLE runs DROP COLUMN n_params")
        con.execute("ALTER TABLE runs DROP COLUMN sink_positions")
        con.execute("DELETE FROM schema_migrations WHERE version = 60")
        con.execute("INSERT INTO runs (run_id, model, model_revision, family, n_layers, n_heads, "
                    "n_kv_heads, d_head, d_model, rotary, causal, sink_token, n_seqs, seq_len, "
                    "corpus, corpus_hash, dtype, config_hash, status, created_at, "
                    "attnbase_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                    "?, ?, ?, current_timestamp::TIMESTAMP, '0')", list(RUN))
    assert [m.version for m in Database(tmp_path / "db").migrate()] == [60]
    with db.connect(read_only=True) as con:
        row = con.execute("SELECT sink_positions, n_params FROM runs").fetchone()
    assert row == ([0], None)
    assert Database(tmp_path / "db").migrate() == []  # applied once
