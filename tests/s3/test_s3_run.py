"""A run on object storage (a real moto S3 server): the same bytes as a local run, and every
reader, verify and ``attnbase sql`` working on it unchanged."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from s3_server import SECRET, s3_client

from attnbase.warehouse import Database, RunStore, open_run, read_sql

TINY = ["--model", "tiny-llama", "--seqs", 4, "--seq-len", 16, "--batch-size", 2, "-q"]


def one_line_error(code, err):
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def runs(moto_endpoint, tmp_path_factory):
    """The same tiny-llama config extracted locally (run 'loc') and to s3 (run 's3'), once for
    the module (the flipped-byte test restores the byte it flips)."""
    from s3_server import aws_env, make_bucket

    from attnbase.extract.config import ExtractConfig
    from attnbase.runner import extract_run

    db = tmp_path_factory.mktemp("s3runs") / "db"
    cfg = ExtractConfig(model="tiny-llama", n_seqs=4, seq_len=16, batch_size=2)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in aws_env(moto_endpoint).items():
            mp.setenv(k, v)
        bucket = f"s3://{make_bucket(moto_endpoint)}"
        extract_run(Database(db), "loc", cfg, progress=False)
        rec = extract_run(Database(db), "s3", cfg, progress=False, store=f"{bucket}/runs")
        assert str(rec.store_path) == f"{bucket}/runs/s3/store.zarr"
        yield db, bucket


@pytest.fixture
def env(moto_endpoint, monkeypatch):
    from s3_server import aws_env

    for k, v in aws_env(moto_endpoint).items():
        monkeypatch.setenv(k, v)


def test_s3_run_equals_local_run_byte_for_byte(runs, env):
    db, bucket = runs
    d = Database(db)
    info = d.run_info("s3")
    assert info["store_url"] == f"{bucket}/runs/s3" and d.run_info("loc")["store_url"] is None
    assert not (db / "runs" / "s3").exists() and not (db / "row_stats" / "run_id=s3").exists()
    # credentials never enter the catalog
    assert SECRET.encode() not in (db / "catalog.duckdb").read_bytes()
    paths = read_sql(db, "SELECT name, path FROM arrays WHERE run_id = 's3'")
    assert all(p.startswith(f"{bucket}/runs/s3/store.zarr/") for p in paths["path"])
    local, remote = RunStore(d.store_path("loc"), "loc"), RunStore(d.store_path("s3"), "s3")
    assert remote.remote and not local.remote
    assert local.stored_names() == remote.stored_names()
    assert {"keys", "queries", "tokens"} <= set(local.stored_names())
    assert "attn_logits" in remote.derived()  # the default capture: formed on read
    for name in local.names():  # attn_logits: derived on read from both
        a, b = local.read(name), remote.read(name)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), name
    # every chunk object holds exactly the bytes of the local chunk file
    objs = remote.path.files()
    files = {str(p.relative_to(local.path)): p.read_bytes()
             for p in local.path.rglob("*") if p.is_file() and "/c/" in str(p.relative_to(local.path)) + "/"}
    chunk_keys = {k for k in objs if "/c/" in k}
    assert chunk_keys == set(files) and len(files) > 0
    for k in chunk_keys:
        assert (remote.path / k).read_bytes() == files[k], k
    ds_l, ds_s = open_run(db, "loc"), open_run(db, "s3")
    assert np.array_equal(ds_l["attn_logits"].values, ds_s["attn_logits"].values, equal_nan=True)
    assert ds_s.attrs["store_url"] == f"{bucket}/runs/s3"


def test_readers_verify_and_sql_on_an_s3_run(runs, cli, env):
    db, bucket = runs
    q = ("SELECT run_id, count(*) AS n, sum(entropy) AS e FROM row_stats "
         "GROUP BY run_id ORDER BY run_id")
    df = read_sql(db, q)
    assert df["run_id"].to_list() == ["loc", "s3"]
    info = Database(db).run_info("s3")
    rows = info["n_layers"] * info["n_heads"] * 4 * 16  # one per attention row
    assert df["n"].to_list() == [rows] * 2
    def rows_of(run):  # every statistic of every row, exactly
        return read_sql(db, "SELECT * EXCLUDE (run_id) FROM row_stats WHERE run_id = ? "
                        "ORDER BY layer, head, seq, query", [run])

    assert rows_of("s3").equals(rows_of("loc"))
    code, out, err = cli("sql", "--db", db, "SELECT count(*) AS n FROM col_stats WHERE run_id = 's3'")
    assert code == 0, err
    assert str(rows) in out
    code, out, err = cli("verify", "--db", db, "--run", "s3")
    assert code == 0, out + err


@pytest.mark.slow
def test_analyze_study_report_on_an_s3_run(runs, cli, env, tmp_path):
    """analyze, study distances and report read the s3 run unchanged: the same numbers as the
    local twin's (row_stats are equal exactly, test above; head metrics too, their sums taken in
    file order; head distances to 1e-12 relative, DuckDB's parallel sums being in free order)."""
    db, bucket = runs
    for run in ("s3", "loc"):
        code, out, err = cli("analyze", "--db", db, "--run", run, "--draws", 20,
                             "--gauss-draws", 20, "-q")
        assert code == 0, (run, out, err)
        code, out, err = cli("study", "distances", "--db", db, "--run", run, "--max-rows", 64, "-q")
        assert code == 0, (run, out, err)
    q = "SELECT layer, head, metric, value FROM head_metrics WHERE run_id = ? ORDER BY ALL"
    a, b = read_sql(db, q, ["loc"]), read_sql(db, q, ["s3"])
    assert a.height > 0 and a.drop("value").equals(b.drop("value"))
    assert a.equals(b)  # every value, exactly
    dist = read_sql(db, "SELECT study_id, dissimilarity, convention, layer_a, head_a, layer_b, "
                    "head_b, value FROM head_distances ORDER BY ALL")
    studies = dist["study_id"].unique().sort().to_list()
    assert len(studies) == 2  # one distances study of each run
    da, db_ = (dist.filter(dist["study_id"] == s).drop("study_id") for s in studies)
    assert da.height > 0 and da.drop("value").equals(db_.drop("value"))
    assert np.allclose(da["value"].to_numpy(), db_["value"].to_numpy(), rtol=1e-12, atol=1e-15,
                       equal_nan=True)
    code, out, err = cli("report", "--db", db, "--run", "s3", "--out", tmp_path / "rep")
    assert code == 0, out + err
    assert (tmp_path / "rep" / "report.html").exists()


def test_flipped_byte_in_one_object_is_named_by_verify(runs, cli, env):
    db, bucket = runs
    remote = RunStore(Database(db).store_path("s3"), "s3")
    key = "keys/c/1/0/1/0/0"  # layer 1, seq chunk 1 of keys (layer, head, seq, pos, d)
    obj = remote.path / key
    good = obj.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x10
    obj.put([bytes(data)])
    try:
        code, out, err = cli("verify", "--db", db, "--run", "s3")
    finally:
        obj.put([good])
    assert code != 0
    text = out + err
    assert f"{bucket}/runs/s3/store.zarr/{key}" in text and "checksum" in text
    assert "batch 1" in text
    code, out, err = cli("verify", "--db", db, "--run", "loc")
    assert code == 0, out + err  # the negative control: the local twin is clean


def test_unreachable_endpoint_one_line_exit_2(cli, tmp_path, monkeypatch, s3_bucket):
    from s3_server import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nobody listens
    code, out, err = cli("extract", "--db", tmp_path / "db", "--run", "x", "--store",
                         f"{s3_bucket}/runs", *TINY)
    one_line_error(code, err)
    assert "did not answer" in err and "run the same command again" in err
    assert SECRET not in err


def test_plain_http_to_a_remote_host_is_refused(cli, tmp_path, monkeypatch, s3_bucket):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://s3.example.org")
    code, out, err = cli("extract", "--db", tmp_path / "db", "--run", "x", "--store",
                         f"{s3_bucket}/runs", *TINY)
    one_line_error(code, err)
    assert "plain http" in err
    assert not (tmp_path / "db" / "catalog.duckdb").exists()


@pytest.mark.slow
def test_killed_extraction_resumes_on_s3(tmp_path, moto_endpoint, s3_bucket):
    """The writer SIGKILLed right after batch 0 is durable: the same command resumes, rewrites
    only what the ledger does not count, and the run equals a local one byte for byte."""
    import os
    import sys

    from s3_server import aws_env

    db = tmp_path / "db"
    base = [sys.executable, "-m", "attnbase.cli", "extract", "--db", str(db), "--run", "k",
            "--store", f"{s3_bucket}/runs", *map(str, TINY)]
    env = {**os.environ, **aws_env(moto_endpoint), "ATTNBASE_CRASH_AFTER_BATCH": "0"}
    r = subprocess.run(base, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr
    done = read_sql(db, "SELECT batch FROM batches WHERE run_id = 'k' AND status = 'complete'")
    assert done["batch"].to_list() == [0]
    env.pop("ATTNBASE_CRASH_AFTER_BATCH")
    r = subprocess.run(base, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "1/2 batches written this time" in r.stdout
    r = subprocess.run([sys.executable, "-m", "attnbase.cli", "extract", "--db", str(db), "--run",
                        "l", *map(str, TINY)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = Database(db)
    a, b = RunStore(d.store_path("k"), "k"), RunStore(d.store_path("l"), "l")
    for name in a.names():
        assert a.read(name).tobytes() == b.read(name).tobytes(), name
    r = subprocess.run([sys.executable, "-m", "attnbase.cli", "verify", "--db", str(db)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_minilm_64x128_on_s3_must_show(tmp_path, moto_endpoint, cli):
    """The issue's must-show: MiniLM 64 x 128 to s3://attnbase-test/runs, then analyze, study
    distances, report, verify and sql over row_stats; arrays equal a local run's bit for bit;
    a flipped byte in one object named by verify."""
    import boto3
    from s3_server import KEY, SECRET as SEC, aws_env

    mp = pytest.MonkeyPatch()
    try:
        for k, v in aws_env(moto_endpoint).items():
            mp.setenv(k, v)
        c = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id=KEY,
                         aws_secret_access_key=SEC, region_name="us-east-1")
        if "attnbase-test" not in [b["Name"] for b in c.list_buckets().get("Buckets", [])]:
            c.create_bucket(Bucket="attnbase-test")
        db = tmp_path / "D"
        args = ["--model", "minilm", "--corpus", "default", "--seqs", 64, "--seq-len", 128, "-q"]
        code, out, err = cli("extract", *args, "--run", "s3", "--db", db, "--store",
                             "s3://attnbase-test/runs")
        assert code == 0, err
        code, out, err = cli("extract", *args, "--run", "local", "--db", db)
        assert code == 0, err
        d = Database(db)
        a, b = RunStore(d.store_path("s3"), "s3"), RunStore(d.store_path("local"), "local")
        for name in a.stored_names():
            assert a.read(name).tobytes() == b.read(name).tobytes(), name
        for cmd in (("analyze", "--db", db, "--run", "s3", "-q"),
                    ("study", "distances", "--db", db, "--run", "s3", "--max-rows", 2000, "-q"),
                    ("report", "--db", db, "--run", "s3", "--out", tmp_path / "rep"),
                    ("verify", "--db", db, "--run", "s3"),
                    ("sql", "--db", db, "SELECT layer, avg(sink_mass) AS m FROM row_stats "
                     "WHERE run_id = 's3' GROUP BY layer ORDER BY layer")):
            code, out, err = cli(*cmd)
            assert code == 0, (cmd, out, err)
        obj = a.path / "keys/c/0/0/0/0/0"
        data = bytearray(obj.read_bytes())
        data[100] ^= 1
        obj.put([bytes(data)])
        code, out, err = cli("verify", "--db", db, "--run", "s3")
        assert code != 0 and "s3://attnbase-test/runs/s3/store.zarr/keys/c/0/0/0/0/0" in out + err
    finally:
        mp.undo()


@pytest.mark.slow
def test_verify_with_the_endpoint_down_is_one_line_not_corruption(runs, cli, env, monkeypatch):
    """The object store not answering is never reported as a corrupt chunk (whose repair would
    delete it): one line, exit 2, and the run is unchanged once the endpoint is back."""
    from s3_server import free_port

    db, bucket = runs
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    code, out, err = cli("verify", "--db", db, "--run", "s3")
    one_line_error(code, err)
    assert "did not answer" in err and "corrupt" not in err and "checksum" not in err


def test_resuming_a_local_run_elsewhere_is_refused(runs, cli, env, tmp_path):
    db, bucket = runs
    before = Database(db).run_info("loc")
    code, out, err = cli("extract", "--db", db, "--run", "loc", "--store", f"{bucket}/runs", *TINY)
    one_line_error(code, err)
    assert "lives at" in err and "no --store" in err
    assert Database(db).run_info("loc") == before


@pytest.mark.slow  # 5-7 s: run by `make test-slow`
def test_the_service_reads_an_s3_runs_statistics(runs, moto_endpoint):
    """``attnbase serve`` over a database with a run on S3: run-scoped SQL counts the S3 run's
    rows as the local twin's, and its head page shows its row statistics (read through the
    views, which on every connection of the service must include the S3 run's files)."""
    import sys
    from pathlib import Path

    import httpx
    from s3_server import aws_env

    sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))
    from serve_fixtures import Server

    db, _ = runs
    srv = Server(db, env=aws_env(moto_endpoint))
    try:
        r = httpx.post(srv.url + "/api/sql", timeout=60, json={
            "sql": "select run_id, count(*) n from row_stats group by 1 order by 1"})
        assert r.status_code == 200, r.text
        counts = dict(r.json()["rows"])
        assert counts.get("s3") == counts["loc"] > 0, counts
        pages = [httpx.get(f"{srv.url}/runs/{run}/heads/1/0", params={"seq": 1}, timeout=60)
                 for run in ("loc", "s3")]
        assert [p.status_code for p in pages] == [200, 200]
        tables = [p.text[p.text.index('id="row-stats"'):] for p in pages]
        tables = [t[:t.index("</table>")] for t in tables]
        assert tables[0].count("<tr>") == 17 and tables[1] == tables[0]  # header + 16 queries
    finally:
        srv.stop()
