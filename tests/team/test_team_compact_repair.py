"""Compact, repair, overwrite and delete of a run in a team database: each changes the ledger
(PostgreSQL's tables) through the same interface as a directory database's, and readers see
exactly the rows of the complete batches after each."""

from __future__ import annotations

import psycopg
from fakes import fake_batches, fake_config, fake_info

from attnbase.runner import ingest_batches
from attnbase.warehouse import Database
from attnbase.warehouse.runs.statcompact import compact_stats
from attnbase.warehouse.runs.verify import mark_for_repair, verify

RUN = "c"


def _pg(db: Database, sql: str) -> list[tuple]:
    with psycopg.connect(db.catalog.url.conninfo(), autocommit=True) as pg:
        return pg.execute(sql).fetchall()


def _rows(db: Database) -> tuple:
    with db.connect(read_only=True) as con:
        return con.execute("SELECT count(*), round(sum(entropy), 6), count(DISTINCT seq) FROM "
                           "row_stats WHERE run_id = ?", [RUN]).fetchone()


def test_compact_repair_overwrite_and_delete_in_a_team_database(team):
    url, _ = team
    db = Database(url)
    info, cfg = fake_info(), fake_config(n_seqs=8, batch_size=2)

    def ingest(**kw):
        return ingest_batches(db, RUN, cfg, info=info, corpus="default", corpus_hash="c0",
                              batches=fake_batches(info, cfg), progress=False, **kw)

    ingest()
    whole = _rows(db)
    assert whole[2] == 8
    files = f"SELECT table_name, batch FROM attnbase_ledger.stat_files WHERE run_id = '{RUN}'"
    assert len(_pg(db, files)) == 8  # a row_stats and a col_stats file per batch

    result = compact_stats(db, RUN)
    assert (result.files_before, result.files_after) == (8, 2), result
    assert sorted(_pg(db, files)) == [("col_stats", None), ("row_stats", None)]
    assert _rows(db) == whole

    assert mark_for_repair(db, RUN, [1]) == [1]
    assert _pg(db, f"SELECT batch FROM attnbase_ledger.batches WHERE run_id = '{RUN}' "
                   "AND status = 'pending'") == [(1,)]
    assert db.run_info(RUN)["status"] == "running"
    assert _rows(db)[2] == 6  # the merged files rewritten without batch 1's two seqs
    assert ingest().batches_written == 1  # the resume rewrites batch 1 alone
    assert _rows(db) == whole
    assert not verify(db, run_id=RUN).problems

    ingest(overwrite=True)  # deleted and written again
    assert _rows(db) == whole
    assert len(_pg(db, files)) == 8

    db.delete_run(RUN)
    assert _pg(db, f"SELECT count(*) FROM attnbase_ledger.batches WHERE run_id = '{RUN}'") == [(0,)]
    assert _pg(db, f"SELECT count(*) FROM attnbase_ledger.stat_files WHERE run_id = '{RUN}'"
               ) == [(0,)]
    assert db.find_run(RUN) is None
