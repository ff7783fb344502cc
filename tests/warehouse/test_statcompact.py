"""``compact_stats``: a finished run's statistics files merged into one per table, sorted by
(layer, head) with a row group per head; the same rows, one catalog transaction for the swap,
repair still exact."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from fakes import fake_batches, fake_config, fake_info

from attnbase.errors import WarehouseError
from attnbase.runner import ingest_batches
from attnbase.warehouse.runs import statfiles
from attnbase.warehouse.runs.statcompact import MERGED_PREFIX, compact_stats
from attnbase.warehouse.catalog.statledger import listed
from attnbase.warehouse.runs.verify import prepare_repair, verify

ORDERED = {"row_stats": "SELECT * FROM row_stats ORDER BY run_id, layer, head, seq, query",
           "col_stats": "SELECT * FROM col_stats ORDER BY run_id, layer, head, seq, key"}


def _rows(db):
    """Every row of both views in key order (NaN as a string: NaN != NaN)."""
    with db.connect(read_only=True) as con:
        return {t: [tuple("nan" if v != v else v for v in r) for r in con.execute(q).fetchall()]
                for t, q in ORDERED.items()}


def _listed(db, table="row_stats"):
    with db.connect(read_only=True) as con:
        return listed(con, "r1", table)


def merged_file(db, table="row_stats"):
    """The run's one listed merged file of ``table``."""
    (f,) = [f for f in _listed(db, table) if f.batch is None]
    assert f.path.rsplit("/", 1)[1].startswith(MERGED_PREFIX)
    return db.run("r1").at(f.path)


def _paths(db, batch, table="row_stats"):
    return ([f.path for f in _listed(db, table) if f.batch == batch]
            + [f.path for f in _listed(db, table) if f.batch is None])


@pytest.fixture
def big_run(db):
    """4 heads x 2 layers, 32 seqs x 64 tokens in 8 batches: 2,048 rows per head."""
    info, cfg = fake_info(n_layers=2, n_heads=4), fake_config(n_seqs=32, seq_len=64, batch_size=4)
    ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    return db, info, cfg


def test_merge_keeps_every_row_and_gives_each_head_its_row_group(big_run):
    db, info, cfg = big_run
    before = _rows(db)
    d = db.run("r1").table_dir("row_stats")
    assert len(list(d.glob("*.parquet"))) == 8
    res = compact_stats(db, "r1")
    assert (res.files_before, res.files_after) == (16, 2)
    assert res.rows == 2 * 4 * 32 * 64
    assert [p.name for p in d.glob("*")] == [merged_file(db).name]  # the batch files are gone
    assert _rows(db) == before  # the same rows, values and types
    md = pq.ParquetFile(merged_file(db)).metadata
    groups = []
    for g in range(md.num_row_groups):
        st = [md.row_group(g).column(i).statistics for i in (0, 1)]  # layer, head
        assert st[0].min == st[0].max and st[1].min == st[1].max  # one head per row group
        groups.append((st[0].min, st[1].min))
    assert groups == [(layer, head) for layer in range(2) for head in range(4)]
    # negative control: a batch file's row groups hold a layer's every head
    assert verify(db, "r1").ok
    again = compact_stats(db, "r1")
    assert (again.files_before, again.files_after) == (2, 2)  # merged already: nothing to do


def test_a_head_page_reads_its_rows_from_the_merged_file(big_run):
    db, _, _ = big_run
    cols = ("query", "sink_mass", "entropy")
    where = {"layer": 1, "head": 2, "seq": 9}
    from_batch = statfiles.read_batch_table(db.run("r1"), _paths(db, 2), cols, where).to_pylist()
    assert len(from_batch) == 64
    compact_stats(db, "r1")
    assert not db.run("r1").batch_file("row_stats", 2).exists()
    assert _paths(db, 2) == [db.run("r1").relpath(merged_file(db))]
    assert statfiles.read_batch_table(db.run("r1"), _paths(db, 2), cols, where
                                      ).to_pylist() == from_batch
    with db.connect(read_only=True) as con:
        via_view = con.execute("SELECT query, sink_mass, entropy FROM row_stats WHERE run_id = "
                               "'r1' AND layer = 1 AND head = 2 AND seq = 9 ORDER BY query"
                               ).fetchall()
    assert [tuple(r.values()) for r in from_batch] == via_view


def test_repair_of_a_merged_run_rewrites_exactly_its_batches(big_run):
    db, info, cfg = big_run
    before = _rows(db)
    compact_stats(db, "r1")
    chunk = db.store_path("r1") / "keys" / "c" / "0" / "0" / "3" / "0" / "0"  # batch 3
    chunk.write_bytes(b"garbage")
    _, marked = prepare_repair(db, "r1")
    assert marked == [3]
    with db.connect(read_only=True) as con:  # its seqs left the merged file, nothing else did
        n = con.execute("SELECT count(*) FROM row_stats WHERE seq BETWEEN 12 AND 15").fetchone()
        total = con.execute("SELECT count(*) FROM row_stats").fetchone()[0]
    assert n == (0,) and total == len(before["row_stats"]) - 2 * 4 * 4 * 64
    ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    assert verify(db, "r1").ok
    assert _rows(db) == before  # no row twice, none lost
    res = compact_stats(db, "r1")  # the rewritten batch's file merged in again
    assert (res.files_before, res.files_after) == (4, 2) and _rows(db) == before


def test_a_pending_batch_keeps_its_file_and_a_running_run_is_refused(big_run):
    db, info, cfg = big_run
    before = _rows(db)
    # an interrupted run whose batch 5 was written but never ledgered: its file stays apart
    with db.ledger() as con:
        con.execute("UPDATE batches SET status = 'pending' WHERE batch = 5")
        con.execute("UPDATE runs SET status = 'interrupted'")
        con.execute("DELETE FROM stat_files WHERE batch = 5")
    unledgered = _rows(db)
    assert len(unledgered["row_stats"]) == len(before["row_stats"]) - 2 * 4 * 4 * 64
    res = compact_stats(db, "r1")
    d = db.run("r1").table_dir("row_stats")
    assert (res.files_before, res.files_after) == (14, 2) and _rows(db) == unledgered
    # batch 5's file is not listed: never read, and left for the resume to replace
    assert sorted(p.name for p in d.glob("*")) == sorted(["b000005.parquet",
                                                          merged_file(db).name])
    ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)  # the resume rewrites it
    assert verify(db, "r1").ok and _rows(db) == before
    with db.transaction() as con:
        con.execute("UPDATE runs SET status = 'running'")
    with pytest.raises(WarehouseError, match=r"is being written.*--resume") as err:
        compact_stats(db, "r1")
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in d.glob("*")) == sorted(["b000005.parquet",
                                                          merged_file(db).name])


def test_a_stopped_merge_leaves_nothing_the_views_read(big_run):
    db, info, cfg = big_run
    before = _rows(db)
    # what a merge killed before its ledger transaction leaves: a complete, unlisted file
    d = db.run("r1").table_dir("row_stats")
    stray = d / f"{MERGED_PREFIX}0badf00d.parquet"
    stray.write_bytes(db.run("r1").batch_file("row_stats", 0).read_bytes())
    (d / ".spill").mkdir()
    assert _rows(db) == before  # not listed: not read
    compact_stats(db, "r1")
    assert not (d / ".spill").exists() and _rows(db) == before
    with db.transaction() as con:  # the next writer of the run removes what is not listed
        con.execute("UPDATE runs SET status = 'interrupted'")
    ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    assert not stray.exists() and _rows(db) == before
    assert not (db.path / "row_stats" / ".merging").exists()


def test_compact_command_merges_and_says_so(big_run, cli):
    db, _, _ = big_run
    # the fake model has no recipe to check its stored logits with: the statistics alone
    code, out, err = cli("compact", "--db", db.path, "--run", "r1", "--stats-only")
    assert code == 0, err
    assert "16 files -> 2" in out and "a row group per head" in out
    code, out, _ = cli("compact", "--db", db.path, "--run", "r1", "--stats-only")
    assert code == 0 and "nothing to compact" in out


@pytest.mark.parametrize("keep", [False, True], ids=["footers", "decoded row groups"])
def test_kept_footers_follow_a_replaced_file(big_run, keep):
    """The footers read_batch_table keeps (and, given a cache, the row groups it decoded) are
    keyed by the file's identity: a file replaced whole (a repair's rewrite) is read again,
    never through the old footer or the old rows."""
    import os

    import pyarrow.compute as pc

    from attnbase.warehouse.runs.decoded import Decoded

    db, _, _ = big_run
    compact_stats(db, "r1")
    cols, where = ("query", "sink_mass"), {"layer": 0, "head": 1, "seq": 4}
    cache = Decoded(64 << 20) if keep else None

    def read():
        return statfiles.read_batch_table(db.run("r1"), _paths(db, 2), cols, where,
                                          decoded=cache).to_pylist()

    first = read()
    assert statfiles.read_batch_table(db.run("r1"), _paths(db, 2), cols, where).to_pylist() == first
    assert read() == first and len(first) == 64
    if keep:
        assert (cache.hits, cache.misses) == (1, 1)
    path = merged_file(db)
    tbl = pq.read_table(path)
    tbl = tbl.set_column(tbl.schema.get_field_index("sink_mass"), "sink_mass",
                         pc.add(tbl["sink_mass"], 1.0))
    tmp = path.with_name("x.partial")
    pq.write_table(tbl, tmp, row_group_size=2048)
    st = os.stat(path)
    os.replace(tmp, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # never the same mtime
    again = read()
    assert [r["sink_mass"] for r in again] == [r["sink_mass"] + 1.0 for r in first]
