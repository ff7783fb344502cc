"""A team database: the catalog in PostgreSQL through DuckLake, runs under a shared data
directory; the same commands as a directory database, and the password in no output."""

from __future__ import annotations

import polars as pl
import pytest
from teamhelpers import tiny_extract_args

from attnbase.errors import WarehouseError


def _row_stats(db: str, run: str) -> pl.DataFrame:
    from attnbase.warehouse.sandbox.sql import read_sql

    df = read_sql(db, "SELECT * FROM row_stats WHERE run_id = ?", [run])
    return df.sort(["layer", "head", "seq", "query"])


def test_a_run_in_a_team_database_has_the_rows_of_a_local_one(team, tmp_path, cli, pg):
    url, data = team
    out = [cli(*tiny_extract_args(url, "r1")), cli(*tiny_extract_args(tmp_path / "local", "r1"))]
    assert [o[0] for o in out] == [0, 0], out
    local, shared = _row_stats(str(tmp_path / "local"), "r1"), _row_stats(url, "r1")
    assert shared.height == local.height > 0
    assert shared.columns == local.columns
    assert shared.equals(local)  # every column, every row
    # the run's bytes live under the data directory the catalog records
    assert (data / "runs" / "r1" / "store.zarr").is_dir()
    out.append(cli("runs", "--db", url))
    assert "r1" in out[-1][1] and "complete" in out[-1][1]
    out.append(cli("analyze", "--db", url, "--run", "r1", "--draws", 20, "--gauss-draws", 20))
    out.append(cli("sql", "--db", url, "SELECT count(*) AS n FROM head_metrics "
                   "WHERE run_id = 'r1'", "--format", "csv"))
    assert int(out[-1][1].split()[-1]) > 0
    out.append(cli("verify", "--db", url))
    assert out[-1][1].startswith("ok: 1 run(s)")
    for code, stdout, stderr in out:
        assert code == 0, stderr
        assert pg.password not in stdout + stderr


def test_attnbase_db_sets_the_default_database(team, cli, monkeypatch):
    url, _ = team
    monkeypatch.setenv("ATTNBASE_DB", url)
    code, _, err = cli(*[a for a in tiny_extract_args(url, "e1") if a not in (url, "--db")])
    assert code == 0, err
    code, out, _ = cli("runs", "--format", "csv")
    assert code == 0 and "e1" in out


def test_init_refuses_in_one_line_and_never_shows_a_password(pg, tmp_path, cli, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", pg.password)
    url = pg.createdb("initcheck")
    secret_url = url.replace("postgres@", f"postgres:{pg.password}@")
    bad = [
        cli("init", "--db", secret_url, "--data", tmp_path / "d"),
        cli("init", "--db", url),
        cli("runs", "--db", url),
        cli("extract", "--db", secret_url, "--model", "tiny-gpt2", "--run", "x"),
    ]
    for code, out, err in bad:
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1, err
        assert pg.password not in out + err
    assert "PGPASSWORD" in bad[0][2] and "--data" in bad[1][2]
    assert "attnbase init --db " + url in bad[2][2]
    monkeypatch.setenv("PGPASSWORD", "not-the-password")
    code, _, err = cli("runs", "--db", url)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("PGPASSWORD", pg.password)
    made = cli("init", "--db", url, "--data", tmp_path / "d")
    again = cli("init", "--db", url, "--data", tmp_path / "d")
    assert "made" in made[1] and "exists" in again[1]
    code, _, err = cli("init", "--db", url, "--data", tmp_path / "elsewhere")
    assert code == 2 and "exists with its data at" in err


def test_sql_over_a_team_database_cannot_reach_the_lakes_metadata(team, cli, pg):
    url, _ = team
    code, out, err = cli("sql", "--db", url, "SELECT count(*) AS n FROM runs", "--format", "csv")
    assert code == 0 and out.split()[-1] == "0", err
    for q in ("SELECT * FROM __ducklake_metadata_lake.public.ducklake_metadata",
              "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'select 1')",
              "SELECT * FROM ducklake_snapshots('lake')",
              "SELECT * FROM duckdb_databases()",
              "ATTACH 'postgres:dbname=postgres' AS p"):
        code, out, err = cli("sql", "--db", url, q)
        assert code == 2, (q, out)
        assert pg.password not in out + err


def test_a_lease_is_judged_by_the_servers_clock(team, monkeypatch, tmp_path):
    """A writer whose clock runs 120 s ahead does not take over a live lease of another host;
    a lease whose heartbeat the server saw 120 s ago is taken over. The embedded catalog,
    judging by the writer's clock, is the negative control."""
    import datetime as dt

    from attnbase.errors import RunBusyError
    from attnbase.warehouse import Database
    from attnbase.warehouse.catalog import lease, pg_lease

    url, _ = team
    db = Database(url)
    with db.catalog.pg() as pg:
        pg.execute(f"INSERT INTO {pg_lease.TABLE} VALUES ('busy', 4242, 'other-host', 'extract', "
                   "NULL, 'tok', now(), now())")
        pg.execute(f"INSERT INTO {pg_lease.TABLE} VALUES ('dead', 4242, 'other-host', 'extract', "
                   "NULL, 'tok', now() - interval '120 s', now() - interval '120 s')")
    ahead = lease._now() + dt.timedelta(seconds=120)
    monkeypatch.setattr(lease, "_now", lambda: ahead)
    with pytest.raises(RunBusyError, match="other-host"):
        db.catalog.acquire_lease("busy", "extract")
    assert db.catalog.lease_holder("busy")["host"] == "other-host"
    taken = db.catalog.acquire_lease("dead", "extract")
    assert db.catalog.lease_holder("dead")["pid"] != 4242
    taken.release()
    assert db.catalog.lease_holder("dead") is None
    # negative control: the embedded catalog takes the live lease by the writer's fast clock
    local = Database(tmp_path / "local")
    local.migrate()
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    with local.transaction(stats=False) as con:
        con.execute(f"INSERT INTO {lease.TABLE} VALUES ('busy', 4242, 'other-host', 'extract', "
                    "NULL, 'tok', ?, ?)", [now, now])
    local.catalog.acquire_lease("busy", "extract").release()


def test_a_missing_team_database_is_one_line(pg, monkeypatch):
    from attnbase.warehouse import Database

    monkeypatch.setenv("PGPASSWORD", pg.password)
    db = Database(pg.url("nosuchdb"))
    with pytest.raises(WarehouseError) as err:
        db.run_ids()
    assert pg.password not in str(err.value) and "nosuchdb" in str(err.value)


def test_a_refused_connection_is_retried_and_a_wrong_name_is_not(pg, monkeypatch):
    """A server that refuses connections (restarting) is waited for, up to RETRY_S; a database
    that does not exist fails at once. Both in one line."""
    import time

    from pgserver import free_port

    from attnbase.warehouse import Database
    from attnbase.warehouse.catalog import ducklake

    monkeypatch.setattr(ducklake, "RETRY_S", 1.5)
    monkeypatch.setenv("PGPASSWORD", pg.password)
    t = time.monotonic()
    with pytest.raises(WarehouseError) as refused:
        Database(f"postgresql://postgres@127.0.0.1:{free_port()}/x").exists()
    assert time.monotonic() - t >= 1.5 and "\n" not in str(refused.value)
    t = time.monotonic()
    with pytest.raises(WarehouseError, match="does not exist"):
        Database(pg.url("no_such_database")).exists()
    assert time.monotonic() - t < 1.5
