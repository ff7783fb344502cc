"""The resumable batch loop, driven by synthetic batches (no model)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from fakes import expected_arrays, fake_batches, fake_config, fake_info

from attnbase.errors import RunConfigConflictError, WarehouseError
from attnbase.warehouse import Database, read_sql
from attnbase.runner import ingest_batches
from attnbase.warehouse.runs.writer import CRASH_ENV
from attnbase.warehouse.runs.store import RunStore


def run(db, run_id="r", cfg=None, info=None, **kw):
    info = info or fake_info()
    cfg = cfg or fake_config()
    batches = kw.pop("batches", None) or fake_batches(info, cfg)
    return ingest_batches(db, run_id, cfg, info=info, corpus="default", corpus_hash="c",
                          batches=batches, progress=False, **kw)


def ledger(db, run_id="r"):
    return read_sql(db.path, "SELECT batch, status FROM batches WHERE run_id = ? ORDER BY batch",
                    [run_id])["status"].to_list()


def test_fresh_run_fills_catalog(db):
    cfg = fake_config()
    rec = run(db, cfg=cfg)
    assert rec.status == "complete" and rec.n_batches == 3 and rec.batches_written == 3
    info = db.run_info("r")
    assert info["status"] == "complete" and info["finished_at"] is not None
    assert info["n_seqs"] == 5 and info["config_hash"] == rec.config_hash
    assert ledger(db) == ["complete"] * 3
    n = read_sql(db.path, "SELECT count(*) AS n, count(DISTINCT (layer, head, seq, query)) AS d "
                          "FROM row_stats")
    assert n["n"][0] == n["d"][0] == 2 * 3 * 5 * 6
    assert read_sql(db.path, "SELECT count(*) AS n FROM col_stats")["n"][0] == 2 * 3 * 5 * 6
    b = read_sql(db.path, "SELECT first_seq, n_seqs FROM batches ORDER BY batch")
    assert b["first_seq"].to_list() == [0, 2, 4] and b["n_seqs"].to_list() == [2, 2, 1]


def test_complete_run_not_recomputed(db):
    run(db)
    calls = []

    def batches(start):
        calls.append(start)
        return iter(())

    rec = run(db, batches=batches)
    assert rec.batches_written == 0 and rec.status == "complete"
    assert calls == []


def test_conflicting_config_refused_then_overwrite(db):
    run(db)
    before = read_sql(db.path, "SELECT * FROM runs")
    with pytest.raises(RunConfigConflictError) as exc:
        run(db, cfg=fake_config(seq_len=8))
    msg = str(exc.value)
    assert "\n" not in msg and "'r'" in msg and "seq_len 6 -> 8" in msg and "--overwrite" in msg
    assert read_sql(db.path, "SELECT * FROM runs").equals(before)
    rec = run(db, cfg=fake_config(seq_len=8), overwrite=True)
    assert rec.batches_written == 3
    assert db.run_info("r")["seq_len"] == 8
    assert read_sql(db.path, "SELECT max(query) AS q FROM row_stats")["q"][0] == 7
    assert RunStore(db.store_path("r"), "r").array("tokens").shape == (5, 8)


def test_failure_marks_failed_and_resume_continues(db):
    info, cfg = fake_info(), fake_config()
    with pytest.raises(RuntimeError, match="injected"):
        run(db, info=info, cfg=cfg, batches=fake_batches(info, cfg, fail_at=2))
    assert db.run_info("r")["status"] == "failed"
    assert ledger(db) == ["complete", "complete", "pending"]
    starts = []
    src = fake_batches(info, cfg)

    def batches(start):
        starts.append(start)
        return src(start)

    rec = run(db, info=info, cfg=cfg, batches=batches)
    assert starts == [2] and rec.batches_written == 1
    assert ledger(db) == ["complete"] * 3
    got = RunStore(db.store_path("r"), "r")
    for name, want in expected_arrays(info, cfg).items():
        np.testing.assert_array_equal(got.read(name), want)
    d = read_sql(db.path, "SELECT count(*) - count(DISTINCT (layer, head, seq, query)) AS dup, "
                          "count(*) AS n FROM row_stats")
    assert d["dup"][0] == 0 and d["n"][0] == 2 * 3 * 5 * 6


def test_stats_file_of_an_uncounted_batch_is_replaced(db):
    """A crash after a batch's statistics file but before its ledger mark leaves a file the
    ledger does not count: no reader sees it, and the resume replaces it (no row duplicated)."""
    from fakes import make_batch

    from attnbase.warehouse.runs import statfiles

    info, cfg = fake_info(), fake_config()
    with pytest.raises(RuntimeError):
        run(db, info=info, cfg=cfg, batches=fake_batches(info, cfg, fail_at=2))
    stale = make_batch(info, cfg, 2)
    half = {k: v[:7] for k, v in stale.row_stats.items()}  # a different, partial content
    statfiles.write_batch_stats(db.run("r"), 2, half, stale.col_stats)
    assert db.run("r").batch_file("row_stats", 2).exists()  # there, but not listed
    assert read_sql(db.path, "SELECT count(*) AS n FROM row_stats WHERE seq = 4")["n"][0] == 0
    assert read_sql(db.path, "SELECT count(*) AS n FROM row_stats WHERE seq = 2")["n"][0] > 0
    run(db, info=info, cfg=cfg)
    d = read_sql(db.path, "SELECT count(*) AS n FROM row_stats WHERE seq = 4")
    assert d["n"][0] == 2 * 3 * 6


def test_shape_mismatch_is_named(db):
    info, cfg = fake_info(), fake_config()
    from fakes import make_batch

    def batches(start):
        cb = make_batch(info, cfg, start)
        cb.arrays["queries"] = cb.arrays["queries"][..., :2]
        yield cb

    with pytest.raises(WarehouseError, match="array 'queries' has shape"):
        run(db, info=info, cfg=cfg, batches=batches)


def test_invalid_run_name_writes_nothing(tmp_path):
    db = Database(tmp_path / "db")
    with pytest.raises(WarehouseError, match="invalid run name"):
        run(db, run_id="../escape")
    assert not (tmp_path / "db").exists()


def test_orphan_directory_is_cleared(db):
    db.run_dir("r").mkdir(parents=True)
    (db.run_dir("r") / "junk").write_text("x")
    run(db)
    assert not (db.run_dir("r") / "junk").exists()


CRASHER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from fakes import fake_batches, fake_config, fake_info
    from attnbase.warehouse import Database
    from attnbase.runner import ingest_batches
    info, cfg = fake_info(), fake_config(n_seqs=9, batch_size=2)
    ingest_batches(Database(sys.argv[1]), "k", cfg, info=info, corpus="default", corpus_hash="c",
                   batches=fake_batches(info, cfg), progress=False)
""")


def test_crash_env_kills_after_durable_batch(db):
    env = {**os.environ, CRASH_ENV: "1"}
    here = str(Path(__file__).parent)
    p = subprocess.run([sys.executable, "-c", CRASHER, str(db.path), here], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, p.stderr
    assert ledger(db, "k") == ["complete", "complete", "pending", "pending", "pending"]
    assert db.run_info("k")["status"] == "running"
    p = subprocess.run([sys.executable, "-c", CRASHER, str(db.path), here],
                       env={k: v for k, v in env.items() if k != CRASH_ENV},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert ledger(db, "k") == ["complete"] * 5
    info, cfg = fake_info(), fake_config(n_seqs=9, batch_size=2)
    got = RunStore(db.store_path("k"), "k")
    for name, want in expected_arrays(info, cfg).items():
        np.testing.assert_array_equal(got.read(name), want)
    d = read_sql(db.path, "SELECT count(*) AS n, count(DISTINCT (layer, head, seq, query)) AS d "
                          "FROM row_stats WHERE run_id = 'k'")
    assert d["n"][0] == d["d"][0] == 2 * 3 * 9 * 6


def test_deferred_ledger_marks(db):
    """A streamed run counts its batches in one catalog transaction per interval (the first at
    once); flush_ledger, mark and finish count the deferred ones, which are already durable."""
    from attnbase.warehouse.runs.writer import RunWriter

    info, cfg = fake_info(), fake_config()
    w = RunWriter.open(db, "d", cfg.run_spec(info, corpus="default", corpus_hash="c"))
    staged = [w.stage(cb) for cb in fake_batches(info, cfg)(0)]
    w.commit(staged[0], ledger_every=3600)
    w.commit(staged[1], ledger_every=3600)
    assert ledger(db, "d") == ["complete", "pending", "pending"]
    assert w.flush_ledger() == 1 and ledger(db, "d") == ["complete", "complete", "pending"]
    w.commit(staged[2], ledger_every=3600)
    w.mark("interrupted")  # Ctrl-C: the durable batch is counted, the run is not complete
    assert ledger(db, "d") == ["complete"] * 3 and db.run_info("d")["status"] == "interrupted"
    w = RunWriter.open(db, "d", cfg.run_spec(info, corpus="default", corpus_hash="c"))
    assert w.pending == () and w.finish()["status"] == "complete"


def test_a_writer_uses_the_database_it_was_opened_with_until_it_is_pickled(db):
    """In the process that opened it a writer writes through the caller's Database (one
    migration check, one location cache); a copy sent to another process makes its own from
    the directory and lock wait it carries."""
    import pickle

    from attnbase.warehouse.runs.writer import RunWriter

    info, cfg = fake_info(), fake_config()
    w = RunWriter.open(db, "p", cfg.run_spec(info, corpus="default", corpus_hash="c"))
    assert w._db() is db
    sent = pickle.loads(pickle.dumps(w))
    assert sent._db() is not db  # negative control: rebuilt, not shared across processes
    assert (sent._db().path, sent._db().lock_timeout) == (db.path, db.lock_timeout)
    w.release()
