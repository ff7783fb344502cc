"""``attnbase catalog copy --from DIR --to postgresql://...``: every run's bytes and rows, verify
clean after, nothing lost when stopped and run again."""

from __future__ import annotations

import pytest
from fakes import fake_batches, fake_config, fake_info

from attnbase.errors import WarehouseError


def _local(tmp_path):
    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database

    db = Database(tmp_path / "local")
    info, cfg = fake_info(rotary=True, n_kv_heads=1), fake_config()
    for run, seed in (("a", 0), ("b", 1)):
        ingest_batches(db, run, cfg, info=info, corpus="default", corpus_hash="c0",
                       batches=fake_batches(info, cfg, seed=seed), progress=False)
    db.replace_rows("run_metrics", "a", {"metric": ["probe"], "value": [1.5]})
    return db


def _tables(db, run):
    from attnbase.warehouse.sandbox.sql import read_sql

    out = {}
    for t in ("row_stats", "col_stats", "batches", "arrays", "run_metrics"):
        df = read_sql(db, f"SELECT * EXCLUDE (run_id) FROM {t} WHERE run_id = ?", [run])
        out[t] = df.sort(df.columns)
    return out


def test_copy_moves_every_run_and_a_rerun_adds_nothing(team, tmp_path, cli, pg):
    from attnbase.warehouse import Database

    url, data = team
    local = _local(tmp_path)
    code, out, err = cli("catalog", "copy", "--from", local.path, "--to", url)
    assert code == 0, err
    assert "copied 2 run(s)" in out and pg.password not in out + err
    team_db = Database(url)
    for run in ("a", "b"):
        mine, theirs = _tables(local, run), _tables(team_db, run)
        for t in mine:
            assert theirs[t].equals(mine[t]), t
        import numpy as np

        assert np.array_equal(team_db.read_layer(run, "keys", 0), local.read_layer(run, "keys", 0))
    code, out, err = cli("verify", "--db", url)
    assert code == 0 and out.startswith("ok: 2 run(s)"), out + err
    code, out, _ = cli("catalog", "copy", "--from", local.path, "--to", url)
    assert code == 0 and "copied 0 run(s)" in out and "2 run(s) already there" in out
    assert _tables(team_db, "a")["batches"].height == _tables(local, "a")["batches"].height


def test_a_copy_stopped_midway_is_finished_by_the_same_command(team, tmp_path, monkeypatch, cli):
    from attnbase.warehouse import Database, copy

    url, _ = team
    local = _local(tmp_path)
    real = copy._copy_rows
    calls = []

    def stopped(dst, run_id):  # the second run's rows never written: stopped after its bytes
        calls.append(run_id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(dst, run_id)

    monkeypatch.setattr(copy, "_copy_rows", stopped)
    with pytest.raises(KeyboardInterrupt):
        copy.copy_database(local, Database(url))
    assert Database(url).run_ids() == ["a"]  # the stopped run is not half there
    monkeypatch.setattr(copy, "_copy_rows", real)
    result = copy.copy_database(local, Database(url))
    assert result.copied == ["b"] and result.skipped == ["a"]
    code, out, err = cli("verify", "--db", url)
    assert code == 0 and out.startswith("ok: 2 run(s)"), out + err


def test_copy_refuses_the_wrong_way_round_in_one_line(team, tmp_path, cli):
    url, _ = team
    local = _local(tmp_path)
    code, out, err = cli("catalog", "copy", "--from", local.path, "--to", tmp_path / "other")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    with pytest.raises(WarehouseError, match="exists in"):
        from attnbase.warehouse import Database
        from attnbase.warehouse.copy import copy_database

        copy_database(local, Database(url))
        with Database(url).transaction(stats=False) as con:
            con.execute("UPDATE runs SET created_at = created_at - INTERVAL 1 DAY "
                        "WHERE run_id = 'a'")
        copy_database(local, Database(url))
