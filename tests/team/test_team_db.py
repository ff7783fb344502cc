"""A team database: the catalog in PostgreSQL through DuckLake, runs under a shared data
directory; the same commands as a directory database, and the password in no output."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import attnbase, tiny_extract_args

from attnbase.errors import WarehouseError


def _row_stats(db: str, run: str) -> pl.DataFrame:
    from attnbase.warehouse.sandbox.sql import read_sql

    df = read_sql(db, "SELECT * FROM row_stats WHERE run_id = ?", [run])
    return df.sort(["layer", "head", "seq", "query"])


def test_a_run_in_a_team_database_has_the_rows_of_a_local_one(team, tmp_path, child_env, pg):
    url, data = team
    env = child_env("one")
    out = [attnbase(*tiny_extract_args(url, "r1"), env=env)]
    out.append(attnbase(*tiny_extract_args(tmp_path / "local", "r1"), env=env))
    local, shared = _row_stats(str(tmp_path / "local"), "r1"), _row_stats(url, "r1")
    assert shared.height == local.height > 0
    assert shared.columns == local.columns
    assert shared.equals(local)  # every column, every row
    # the run's bytes live under the data directory the catalog records
    assert (data / "runs" / "r1" / "store.zarr").is_dir()
    out.append(attnbase("runs", "--db", url, env=env))
    assert "r1" in out[-1].stdout and "complete" in out[-1].stdout
    out.append(attnbase("analyze", "--db", url, "--run", "r1", "--draws", 20, "--gauss-draws", 20,
                        env=env))
    out.append(attnbase("sql", "--db", url, "SELECT count(*) AS n FROM head_metrics "
                        "WHERE run_id = 'r1'", "--format", "csv", env=env))
    assert int(out[-1].stdout.split()[-1]) > 0
    out.append(attnbase("verify", "--db", url, env=env))
    assert out[-1].stdout.startswith("ok: 1 run(s)")
    for proc in out:
        assert pg.password not in proc.stdout + proc.stderr


def test_attnbase_db_sets_the_default_database(team, child_env, pg):
    url, _ = team
    env = {**child_env("env"), "ATTNBASE_DB": url}
    attnbase(*[a for a in tiny_extract_args(url, "e1") if a != url and a != "--db"], env=env)
    proc = attnbase("runs", "--format", "csv", env=env)
    assert "e1" in proc.stdout


def test_init_refuses_in_one_line_and_never_shows_a_password(pg, tmp_path, child_env):
    env = child_env("init")
    url = pg.createdb("initcheck")
    secret_url = url.replace("postgres@", f"postgres:{pg.password}@")
    bad = [
        attnbase("init", "--db", secret_url, "--data", tmp_path / "d", env=env, check=False),
        attnbase("init", "--db", url, env=env, check=False),
        attnbase("runs", "--db", url, env=env, check=False),
        attnbase("extract", "--db", secret_url, "--model", "tiny-gpt2", "--run", "x", env=env,
                 check=False),
    ]
    for proc in bad:
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert pg.password not in proc.stdout + proc.stderr
    assert "PGPASSWORD" in bad[0].stderr and "--data" in bad[1].stderr
    assert "attnbase init --db " + url in bad[2].stderr
    wrong = {**env, "PGPASSWORD": "not-the-password"}
    proc = attnbase("runs", "--db", url, env=wrong, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    made = attnbase("init", "--db", url, "--data", tmp_path / "d", env=env)
    again = attnbase("init", "--db", url, "--data", tmp_path / "d", env=env)
    assert "made" in made.stdout and "exists" in again.stdout
    other = attnbase("init", "--db", url, "--data", tmp_path / "elsewhere", env=env, check=False)
    assert other.returncode == 2 and "exists with its data at" in other.stderr


def test_sql_over_a_team_database_cannot_reach_the_lakes_metadata(team, child_env, pg):
    url, _ = team
    env = child_env("sql")
    ok = attnbase("sql", "--db", url, "SELECT count(*) AS n FROM runs", "--format", "csv", env=env)
    assert ok.stdout.split()[-1] == "0"
    for q in ("SELECT * FROM __ducklake_metadata_lake.public.ducklake_metadata",
              "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'select 1')",
              "SELECT * FROM ducklake_snapshots('lake')",
              "SELECT * FROM duckdb_databases()",
              "ATTACH 'postgres:dbname=postgres' AS p"):
        proc = attnbase("sql", "--db", url, q, env=env, check=False)
        assert proc.returncode == 2, (q, proc.stdout)
        assert pg.password not in proc.stdout + proc.stderr


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
