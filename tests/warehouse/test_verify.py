"""``verify`` names every broken thing of a run; ``mark_for_repair`` + resume restores it bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import expected_arrays, fake_batches

from attnbase.errors import ArrayCorruptError, RunNotFoundError, WarehouseError
from attnbase.runner import ingest_batches
from attnbase.warehouse.runs.store import RunStore
from attnbase.warehouse.runs.verify import broken_batches, mark_for_repair, prepare_repair, verify


def flip(path, offset=10):
    b = bytearray(path.read_bytes())
    b[offset % len(b)] ^= 0xFF
    path.write_bytes(bytes(b))


def truncate(path, keep=5):
    path.write_bytes(path.read_bytes()[:keep])


def resume(db, info, cfg):
    return ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                          batches=fake_batches(info, cfg), progress=False)


def assert_identical(db, info, cfg):
    want = expected_arrays(info, cfg)
    store = RunStore(db.store_path("r1"), "r1")
    for name, arr in want.items():
        np.testing.assert_array_equal(store.read(name), arr, err_msg=name)


def test_clean_run_verifies(fake_run):
    db, info, cfg = fake_run
    res = verify(db)
    assert res.ok, [str(p) for p in res.problems]
    assert res.runs == ["r1"]
    # every chunk of every array was decoded: tokens 3 + 5 layer-first arrays x 2 layers x 3
    n_arrays_layered = len(db.array_rows("r1")) - 1
    assert res.chunks_checked == 3 + n_arrays_layered * 2 * 3 + 3  # hidden has 3 layer entries


@pytest.mark.parametrize("damage", [flip, truncate])
def test_damaged_chunk_named_read_raises_repair_restores(fake_run, damage):
    db, info, cfg = fake_run
    rel = ("attn_logits", (1, 0, 2, 0, 0))
    chunk = db.store_path("r1") / "attn_logits" / "c" / "1" / "0" / "2" / "0" / "0"
    damage(chunk)
    res = verify(db, "r1")
    assert len(res.problems) == 1
    p = res.problems[0]
    assert (p.run_id, p.array, p.chunk, p.batch, p.kind) == ("r1", *rel, 2, "chunk")
    line = str(p)
    assert "\n" not in line and "'r1'" in line and "'attn_logits'" in line
    assert "(1, 0, 2, 0, 0)" in line and str(chunk) in line and "batch 2" in line
    with pytest.raises(ArrayCorruptError, match=r"'attn_logits' chunk \(1, 0, 2, 0, 0\).*--repair"):
        db.read_layer("r1", "attn_logits", 1)
    assert broken_batches(res.problems, "r1") == [2]

    # repair: the ledger sends exactly batch 2 back; the resume rewrites exactly it
    before = {p: p.stat().st_mtime_ns for p in db.store_path("r1").rglob("c/*/*/0/*/*") if p.is_file()}
    _, marked = prepare_repair(db, "r1")
    assert marked == [2]
    assert db.run_info("r1")["status"] == "running"
    rec = resume(db, info, cfg)
    assert rec.batches_written == 1 and rec.status == "complete"
    assert verify(db, "r1").ok
    assert_identical(db, info, cfg)
    after = {p: p.stat().st_mtime_ns for p in db.store_path("r1").rglob("c/*/*/0/*/*") if p.is_file()}
    assert before == after  # chunks of batch 0 untouched


def test_missing_chunk_of_a_counted_batch(fake_run):
    db, info, cfg = fake_run
    chunk = db.store_path("r1") / "keys" / "c" / "0" / "0" / "1" / "0" / "0"
    chunk.unlink()
    res = verify(db, "r1")
    assert [(p.kind, p.array, p.chunk, p.batch) for p in res.problems] == [
        ("missing_chunk", "keys", (0, 0, 1, 0, 0), 1)]
    prepare_repair(db, "r1")
    resume(db, info, cfg)
    assert verify(db, "r1").ok
    assert_identical(db, info, cfg)


def test_row_stats_count_against_ledger(fake_run):
    db, info, cfg = fake_run
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = db.run("r1").batch_file("row_stats", 1)  # seqs 2-3: lose some rows
    tbl = pq.read_table(path)
    keep = pc.invert(pc.and_(pc.equal(tbl["seq"], 3), pc.equal(tbl["layer"], 1)))
    pq.write_table(tbl.filter(keep), path)
    res = verify(db, "r1")  # the file is not the one the ledger listed
    assert [(p.kind, p.batch, p.table) for p in res.problems] == [("stats_file", 1, "row_stats")]
    # a writer that listed a file of too few rows: the counts against the ledger name it
    crc, size = db.run("r1").checksum(path)
    with db.transaction() as con:
        con.execute("UPDATE stat_files SET crc32c = ?, size = ? WHERE path = ?",
                    [crc, size, db.run("r1").relpath(path)])
    res = verify(db, "r1")
    assert [(p.kind, p.batch) for p in res.problems] == [("stats", 1)]
    assert "row_stats has" in str(res.problems[0])
    prepare_repair(db, "r1")
    resume(db, info, cfg)
    assert verify(db, "r1").ok
    n = 2 * 3 * cfg.n_seqs * cfg.seq_len
    with db.connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM row_stats").fetchone() == (n,)


def test_ledger_claims_complete_with_pending(fake_run):
    db, _, _ = fake_run
    with db.transaction() as con:
        con.execute("UPDATE batches SET status = 'pending' WHERE batch = 0")
    kinds = sorted((p.kind, p.batch) for p in verify(db, "r1").problems)
    # the run says complete with a pending batch; that batch's statistics file is not a problem
    # (a write stopped between the file and the ledger mark leaves one; the resume rewrites it)
    assert kinds == [("ledger", None)]


def test_shape_mismatch_needs_overwrite(fake_run):
    db, _, _ = fake_run
    with db.transaction() as con:
        con.execute("UPDATE arrays SET shape = [9, 9] WHERE name = 'tokens'")
    res = verify(db, "r1")
    assert [(p.kind, p.array) for p in res.problems] == [("array", "tokens")]
    assert "(9, 9)" in str(res.problems[0]) and "chunks" in str(res.problems[0])
    with pytest.raises(WarehouseError, match="--overwrite"):
        prepare_repair(db, "r1")


def test_repair_of_unknown_run(fake_run):
    db, _, _ = fake_run
    with pytest.raises(RunNotFoundError, match="--repair"):
        prepare_repair(db, "nope")
    with pytest.raises(RunNotFoundError):
        verify(db, "nope")


def test_mark_for_repair_refuses_unknown_batches(fake_run):
    db, _, _ = fake_run
    with pytest.raises(WarehouseError, match=r"no batches \[7\]"):
        mark_for_repair(db, "r1", [7])
