"""A team database whose data location is on S3 (moto in server mode, PostgreSQL on loopback):
runs, statistics files and the lake's own Parquet files go to the bucket; nothing goes to a
local data directory; the credentials appear in no output."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from teamhelpers import tiny_extract_args

sys.path.insert(0, str(Path(__file__).parent.parent / "s3"))
from s3_server import SECRET, aws_env, make_bucket, moto_endpoint, s3_client  # noqa: E402,F401


@pytest.fixture
def s3_team(pg, moto_endpoint, tmp_path, monkeypatch):
    """``(url, s3 data location, moto endpoint)`` of a new team database on S3."""
    for k, v in aws_env(moto_endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PGPASSWORD", pg.password)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bucket = make_bucket(moto_endpoint)
    return pg.createdb("s" + uuid.uuid4().hex[:10]), f"s3://{bucket}/team", moto_endpoint


def _keys(endpoint: str, data: str, under: str) -> list[str]:
    bucket, _, prefix = data[len("s3://"):].partition("/")
    pages = s3_client(endpoint).get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/{under}")
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


@pytest.mark.slow
def test_a_team_database_on_s3_holds_runs_and_lake_files_in_the_bucket(s3_team, tmp_path, cli, pg,
                                                                      monkeypatch):
    url, data, endpoint = s3_team
    out = [cli("init", "--db", url, "--data", data + "/")]
    assert "made" in out[0][1] and data in out[0][1], out[0]
    out.append(cli(*tiny_extract_args(url, "r1")))
    out.append(cli(*tiny_extract_args(tmp_path / "local", "r1")))
    from attnbase.warehouse.sandbox.sql import read_sql

    def rows(db):
        return read_sql(db, "SELECT * FROM row_stats WHERE run_id = 'r1'").sort(
            ["layer", "head", "seq", "query"])

    shared, local = rows(url), rows(str(tmp_path / "local"))
    assert shared.height == local.height > 0 and shared.equals(local)
    # the run's store and statistics files are objects under DATA/runs/r1/
    keys = _keys(endpoint, data, "runs/r1/")
    assert any("/store.zarr/" in k for k in keys)
    assert any("/row_stats/" in k and k.endswith(".parquet") for k in keys)
    # the lake's own Parquet files (an insert over the inlining limit) land under DATA/lake/
    from attnbase.warehouse import Database

    with Database(url).catalog.transaction() as con:
        con.execute("CREATE TABLE bulk AS SELECT range AS i FROM range(5000)")
    assert any(k.endswith(".parquet") for k in _keys(endpoint, data, "lake/"))
    out.append(cli("sql", "--db", url, "SELECT count(*) AS n, sum(i) AS s FROM bulk",
                   "--format", "csv"))
    assert out[-1][1].split()[-1] == f"5000,{sum(range(5000))}", out[-1]
    out.append(cli("analyze", "--db", url, "--run", "r1", "--draws", 20, "--gauss-draws", 20))
    out.append(cli("verify", "--db", url))
    assert out[-1][1].startswith("ok: 1 run(s)"), out[-1]
    # a distances study's partial sums go to the run's prefix: a study that reads them runs on
    # another machine (another cache directory)
    out.append(cli("study", "distances", "--db", url, "--run", "r1"))
    assert any("/distance_parts/" in k and k.endswith(".npz") for k in _keys(endpoint, data,
                                                                               "runs/r1/"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-machine"))
    out.append(cli("study", "reversal", "--db", url, "--run", "r1", "--draws", 200))
    for code, stdout, stderr in out:
        assert code == 0, stderr
        assert pg.password not in stdout + stderr and SECRET not in stdout + stderr
    # the secret DuckDB holds is not readable from the SQL sandbox
    code, o, e = cli("sql", "--db", url, "SELECT * FROM duckdb_secrets()", "--format", "csv")
    assert SECRET not in o + e
    # moving a directory database in is for a team database whose data is a directory
    code, o, e = cli("catalog", "copy", "--from", tmp_path / "local", "--to", url)
    assert code == 2 and "attnbase init --data DIR" in e and len(e.strip().splitlines()) == 1, e


def test_a_bad_s3_data_location_is_one_line(pg, moto_endpoint, tmp_path, cli, monkeypatch):
    for k, v in aws_env(moto_endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PGPASSWORD", pg.password)
    url = pg.createdb("s" + uuid.uuid4().hex[:10])
    for data, says in (("s3://No_Such/x", "not an S3 bucket name"), ("gs://b/x", "s3://BUCKET")):
        code, out, err = cli("init", "--db", url, "--data", data)
        assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    code, out, err = cli("runs", "--db", url)  # nothing was made
    assert code == 2 and "attnbase init" in err
