"""Statistics files: checksummed in the catalog and checked by ``verify``; readers see exactly the
files the catalog lists for ledgered batches (never a stray, pending or partial file)."""

from __future__ import annotations

import shutil

import pytest
from fakes import fake_batches

from attnbase.runner import ingest_batches
from attnbase.warehouse import read_sql
from attnbase.warehouse.catalog.statledger import listed
from attnbase.warehouse.runs.verify import prepare_repair, verify


def _count(db, table="row_stats"):
    return read_sql(db, f"SELECT count(*) AS n FROM {table}")["n"][0]


def _resume(db, info, cfg):
    return ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                          batches=fake_batches(info, cfg), progress=False)


def _flip(path, at=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("table", ["row_stats", "col_stats"])
@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_verify_names_a_damaged_statistics_file_and_repair_rewrites_it(fake_run, table, damage):
    db, info, cfg = fake_run
    n = _count(db, table)
    assert verify(db, "r1").ok  # negative control: the untouched run
    path = db.run("r1").batch_file(table, 1)
    if damage == "flipped byte":
        _flip(path)
    else:
        path.write_bytes(path.read_bytes()[:-40])
    problems = verify(db, "r1").problems
    assert len(problems) == 1, [str(p) for p in problems]
    p = problems[0]
    assert (p.kind, p.table, p.batch, p.file) == ("stats_file", table, 1, str(path))
    text = str(p)
    assert text.startswith(f"run 'r1', table '{table}', batch 1 ({path}): statistics file ")
    assert ("fails its checksum" if damage == "flipped byte" else "truncated or replaced") in text
    assert "--repair" in text and "\n" not in text
    _, marked = prepare_repair(db, "r1")
    assert marked == [1]
    _resume(db, info, cfg)
    assert verify(db, "r1").ok and _count(db, table) == n


def test_stray_pending_and_partial_files_are_invisible(fake_run):
    """A copy dropped beside the files, a file of a batch the ledger calls pending and a
    ``.partial`` file: SQL and the analysis's per-run reader count the ledgered rows only; the
    next writer of the run removes them."""
    from attnbase.warehouse.runs.statfiles import run_files_connection

    db, info, cfg = fake_run
    run = db.run("r1")
    n = _count(db)
    per_batch = info.n_layers * info.n_heads * cfg.batch_size * cfg.seq_len
    last = info.n_layers * info.n_heads * 1 * cfg.seq_len  # batch 2: the fifth seq alone
    d = run.table_dir("row_stats")
    shutil.copy(run.batch_file("row_stats", 0), d / "b000000 (copy).parquet")
    shutil.copy(run.batch_file("row_stats", 1), d / "b000099.parquet")
    shutil.copy(run.batch_file("row_stats", 2), d / "b000002.parquet.partial")
    with db.ledger() as con:  # batch 2 pending: its file written before a mark that never came
        con.execute("UPDATE batches SET status = 'pending' WHERE batch = 2")
        con.execute("UPDATE runs SET status = 'interrupted'")
        con.execute("DELETE FROM stat_files WHERE batch = 2")
    # negative control: every one of them is a readable file of rows a glob would count
    with db.connect(read_only=True) as con:
        globbed = con.execute(f"SELECT count(*) FROM read_parquet('{d}/*.parquet')").fetchone()[0]
        files = [(f.table, f.path) for f in listed(con, "r1")]
    assert globbed == n + 2 * per_batch
    assert _count(db) == n - last  # batch 2 no longer counted, no stray counted
    con = run_files_connection(run.absolute(), files)
    try:
        assert con.execute("SELECT count(*) FROM row_stats").fetchone()[0] == n - last
    finally:
        con.close()
    rec = _resume(db, info, cfg)
    assert rec.batches_written == 1 and _count(db) == n
    assert sorted(p.name for p in d.iterdir()) == [f"b{b:06d}.parquet" for b in range(3)]
    assert verify(db, "r1").ok


def test_each_listed_file_has_its_checksum(fake_run):
    import google_crc32c

    db, _, _ = fake_run
    with db.connect(read_only=True) as con:
        files = listed(con, "r1")
    assert sorted((f.table, f.batch) for f in files) == sorted(
        (t, b) for t in ("row_stats", "col_stats") for b in range(3))
    for f in files:
        data = db.run("r1").at(f.path).read_bytes()
        assert (f.crc32c, f.size) == (google_crc32c.value(data), len(data))


def test_a_damaged_merged_file_is_named_with_the_batches_it_holds(fake_run):
    from attnbase.warehouse.runs.statcompact import compact_stats

    db, info, cfg = fake_run
    n = _count(db)
    compact_stats(db, "r1")
    assert verify(db, "r1").ok
    (merged,) = [f for f in listed_files(db) if f.table == "col_stats"]
    _flip(db.run("r1").at(merged.path))
    (p,) = verify(db, "r1").problems
    assert p.table == "col_stats" and p.batch is None and p.covers == (0, 1, 2)
    assert "holds batches 0-2" in str(p) and "re-extracts batches 0-2" in str(p)
    _, marked = prepare_repair(db, "r1")
    assert marked == [0, 1, 2]
    _resume(db, info, cfg)
    assert verify(db, "r1").ok and _count(db, "col_stats") == n


def listed_files(db):
    with db.connect(read_only=True) as con:
        return listed(con, "r1")


def test_migration_lists_the_files_of_complete_batches(fake_run):
    """A catalog from before ``stat_files``: the migration lists (and checksums) the files of
    complete batches, not a pending batch's."""
    from attnbase.warehouse import Database

    db, info, cfg = fake_run
    n = _count(db)
    run = db.run("r1")
    with db.transaction() as con:
        con.execute("DROP TABLE stat_files")
        con.execute("DELETE FROM schema_migrations WHERE version = 20")
        con.execute("UPDATE batches SET status = 'pending' WHERE batch = 2")
    fresh = Database(db.path)
    assert 20 in {m.version for m in fresh.migrate()}
    with fresh.connect(read_only=True) as con:
        got = sorted((f.table, f.batch) for f in listed(con, "r1"))
    assert got == sorted((t, b) for t in ("row_stats", "col_stats") for b in (0, 1))
    last = info.n_layers * info.n_heads * 1 * cfg.seq_len  # batch 2: the fifth seq alone
    assert _count(fresh) == n - last and run.batch_file("row_stats", 2).exists()


@pytest.mark.slow
def test_derived_logits_over_a_damaged_keys_chunk_name_keys(tmp_path):
    """``attn_logits`` formed from queries and keys: a flipped byte in a ``keys`` chunk is named
    as that chunk of ``keys`` (not ``queries``, the first input)."""
    from attnbase.errors import ArrayCorruptError
    from attnbase.extract import ExtractConfig
    from attnbase.runner import extract_run
    from attnbase.warehouse import Database

    cfg = ExtractConfig(model="tiny-gpt2", n_seqs=4, seq_len=16, batch_size=2, device="cpu")
    extract_run(Database(tmp_path / "db"), "d", cfg, progress=False)
    db = Database(tmp_path / "db")
    store = db.run("d").store()
    assert "attn_logits" in store.derived()
    good = store.read("attn_logits", (1, slice(None), 2))  # control: it reads
    chunk = db.run("d").store_path / "keys" / "c" / "1" / "0" / "1" / "0" / "0"  # seqs 2-3
    _flip(chunk, at=20)
    for read in (lambda s: s.read("attn_logits", (1, slice(None), 2)),
                 lambda s: s.read_layer("attn_logits", 1)):
        with pytest.raises(ArrayCorruptError) as err:
            read(db.run("d").store())
        assert "array 'keys' chunk (1, 0, 1, 0, 0)" in str(err.value), str(err.value)
    assert good.shape[-1] == 16


def test_no_empty_folders_are_left(fake_run):
    """Merging, repairing and deleting a run leave no empty directory in the statistics trees."""
    from attnbase.warehouse.runs.statcompact import compact_stats

    db, info, cfg = fake_run

    def empty_dirs():
        return sorted(str(p.relative_to(db.path)) for t in ("row_stats", "col_stats")
                      for p in (db.path / t).rglob("*") if p.is_dir() and not any(p.iterdir()))

    compact_stats(db, "r1")
    assert empty_dirs() == [] and not (db.path / "row_stats" / ".merging").exists()
    db.delete_run("r1")
    assert empty_dirs() == []
    assert sorted(p.name for p in (db.path / "row_stats").iterdir()) == ["run_id="]
