"""A query process's kept connection to a snapshot of the catalog reads the catalog's list of
statistics files once, and makes its views again only when a listed directory changed: a file
deleted is still left out of the views at the next question, and a directory changed within
``RACY_S`` of a question is listed afresh."""

from __future__ import annotations

import os
import time

import pytest
from fakes import fake_batches, fake_config, fake_info

from attnbase.runner import ingest_batches
from attnbase.warehouse import Database
from attnbase.warehouse.runs import statfiles
from attnbase.warehouse.sandbox import querychild


@pytest.fixture
def held(tmp_path, monkeypatch):
    db = Database(tmp_path / "db")
    info, cfg = fake_info(), fake_config()
    for run in ("a", "g"):
        ingest_batches(db, run, cfg, info=info, corpus="default", corpus_hash="c0",
                       batches=fake_batches(info, cfg), progress=False)
    calls = []
    real = statfiles.list_stat_files

    def counted(con):
        calls.append(1)
        return real(con)

    monkeypatch.setattr(statfiles, "list_stat_files", counted)
    con = db.catalog.open(read_only=True)
    yield db, {"con": con, "views": [], "fixed": True}, calls
    con.close()


def _age(db, listing, seconds=3600):
    then = time.time() - seconds
    for d in listing.dirs:
        os.utime(db.path / d, (then, then))


def test_a_snapshot_connection_lists_once_and_still_sees_a_file_deleted(held):
    db, h, calls = held
    path = db.run("g").batch_file("col_stats", 1)
    _age(db, statfiles.list_stat_files(h["con"]))
    calls.clear()
    for _ in range(5):
        querychild._refresh_stat_views(h)
    assert len(calls) == 1 and h["views"] == []  # nothing gone: the catalog's own views
    n_a = h["con"].execute("SELECT count(*) FROM col_stats WHERE run_id = 'a'").fetchone()[0]
    path.unlink()  # its directory's time is now: the next question lists it afresh
    querychild._refresh_stat_views(h)
    assert len(calls) == 1 and h["views"], "the deleted file left the views"
    assert h["con"].execute(
        "SELECT count(*) FROM col_stats WHERE run_id = 'a'").fetchone()[0] == n_a
    with pytest.raises(Exception, match="b000001.parquet"):
        h["con"].execute("SELECT count(*) FROM col_stats").fetchall()


def test_a_live_connection_lists_the_catalog_at_every_question(held):
    db, h, calls = held  # control: a catalog that may change is read every time
    h["fixed"] = False
    _age(db, statfiles.list_stat_files(h["con"]))
    calls.clear()
    for _ in range(3):
        querychild._refresh_stat_views(h)
    assert len(calls) == 3


def test_a_directory_changed_just_now_is_listed_afresh(held):
    db, h, calls = held
    listing = statfiles.list_stat_files(h["con"])
    _age(db, listing, seconds=statfiles.RACY_S / 4)
    assert listing.signature() is None
    _age(db, listing)
    assert listing.signature() is not None
