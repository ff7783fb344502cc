"""A damaged statistics file, met by any reader of the command line, is one line naming the file
and the fix (exit 2), never a traceback; ``verify`` names it among its problems."""

from __future__ import annotations

import pytest


@pytest.fixture
def damaged(fake_run):
    db, info, cfg = fake_run
    path = db.run("r1").batch_file("row_stats", 1)
    path.write_bytes(path.read_bytes()[:-40])  # truncated: its footer gone
    return db, path


def _one_line(code, out, err, rel):
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("error: run 'r1': row_stats file ") and rel in err, err
    assert "attnbase verify --run r1" in err and "--repair" in err, err


def test_sql_over_a_damaged_file_is_one_line(damaged, cli):
    db, path = damaged
    code, out, err = cli("sql", "--db", db.path, "SELECT count(*) AS n FROM row_stats")
    _one_line(code, out, err, "row_stats/run_id=r1/b000001.parquet")
    # control: a question the damaged file plays no part in answers
    code, out, err = cli("sql", "--db", db.path, "SELECT count(*) AS n FROM col_stats")
    assert code == 0 and err == "", err


def test_analyze_and_report_over_a_damaged_file_are_one_line(damaged, cli):
    db, path = damaged
    for args in (("analyze", "--db", db.path, "--run", "r1", "-q"),
                 ("report", "--db", db.path, "--run", "r1", "--out", db.path / "r.html")):
        code, out, err = cli(*args)
        assert code == 2, (args, out, err)
        assert "Traceback" not in err and err.count("\n") == 1, err
        assert "row_stats" in err and "b000001.parquet" in err, err


def test_verify_names_the_damaged_file(damaged, cli):
    db, path = damaged
    code, out, err = cli("verify", "--db", db.path, "--run", "r1")
    assert code == 1 and "Traceback" not in out + err
    lines = [ln for ln in (out + err).splitlines() if str(path) in ln]
    assert len(lines) == 1 and "table 'row_stats', batch 1" in lines[0]
    assert "truncated or replaced" in lines[0] and "--repair" in lines[0]


def test_a_missing_file_blocks_no_writer_and_fails_only_its_runs_questions(fake_run, cli):
    from fakes import fake_batches

    from attnbase.runner import ingest_batches

    db, info, cfg = fake_run
    path = db.run("r1").batch_file("row_stats", 1)
    path.unlink()
    rel = "row_stats/run_id=r1/b000001.parquet"
    # a writer of another run ledgers its batches (the views are rebuilt in its transactions)
    ingest_batches(db, "r2", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    code, out, err = cli("sql", "--db", db.path, "--format", "csv",
                         "SELECT count(*) AS n FROM row_stats WHERE run_id = 'r2'")
    assert code == 0 and err == "", err
    n_r2 = int(out.split()[-1])
    assert n_r2 > 0
    # any question that does not rule r1 out fails in one line naming the file, never a count
    # that leaves the missing rows out
    for sql in ("SELECT count(*) AS n FROM row_stats",
                "SELECT count(*) AS n FROM row_stats WHERE layer = 0",
                "SELECT count(*) AS n FROM row_stats WHERE run_id = 'r1'"):
        code, out, err = cli("sql", "--db", db.path, sql)
        _one_line(code, out, err, rel)
        assert "missing" in err and err.count("it is damaged") == 1, err
    # control: col_stats lost nothing and answers for both runs
    code, out, err = cli("sql", "--db", db.path, "--format", "csv",
                         "SELECT count(DISTINCT run_id) AS n FROM col_stats")
    assert code == 0 and err == "" and out.split()[-1] == "2", (out, err)
    # deleting the damaged run gives the other its whole answer back
    db.delete_run("r1")
    code, out, err = cli("sql", "--db", db.path, "--format", "csv",
                         "SELECT count(*) AS n FROM row_stats")
    assert code == 0 and int(out.split()[-1]) == n_r2, (out, err)


def _two_runs(fake_run):
    from fakes import fake_batches

    from attnbase.runner import ingest_batches

    db, info, cfg = fake_run
    ingest_batches(db, "r2", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    return db


def _csv_count(cli, db, sql):
    code, out, err = cli("sql", "--db", db.path, "--format", "csv", sql)
    assert code == 0 and err == "", (sql, out, err)
    return int(out.split()[-1])


def test_another_runs_file_deleted_after_the_last_write_fails_only_its_questions(fake_run, cli):
    """Issue 44 item 5: a statistics file of run r2 deleted after the last ledger transaction
    (so the catalog's views still list it): a question that rules r2 out by its run_id answers,
    and ``verify --run r1`` checks r1 alone; questions that take r2 in fail in one line naming
    its file (never a count without its rows)."""
    db = _two_runs(fake_run)
    per_run = _csv_count(cli, db, "SELECT count(*) AS n FROM col_stats WHERE run_id = 'r1'")
    rows_all = _csv_count(cli, db, "SELECT count(*) AS n FROM row_stats")
    assert per_run > 0 and rows_all > 0
    path = db.run("r2").batch_file("col_stats", 1)
    saved = path.read_bytes()
    path.unlink()
    rel = "col_stats/run_id=r2/b000001.parquet"
    # the questions that exclude r2 answer, with r1's whole count
    for sql in ("SELECT count(*) AS n FROM col_stats WHERE run_id = 'r1'",
                "SELECT count(*) AS n FROM col_stats WHERE run_id IN ('r1')"):
        assert _csv_count(cli, db, sql) == per_run, sql
    assert _csv_count(cli, db, "SELECT count(*) AS n FROM row_stats") == rows_all  # other table
    code, out, err = cli("verify", "--db", db.path, "--run", "r1")
    assert code == 0 and "r2" not in out + err, (out, err)
    # a question that takes r2 in: one line naming its file and the fix
    for sql in ("SELECT count(*) AS n FROM col_stats",
                "SELECT count(*) AS n FROM col_stats WHERE run_id = 'r2'"):
        code, out, err = cli("sql", "--db", db.path, sql)
        assert code == 2 and "Traceback" not in err and err.count("\n") == 1, (sql, err)
        assert err.startswith("error: run 'r2': col_stats file ") and rel in err, err
        assert "missing" in err and "attnbase verify --run r2" in err, err
    code, out, err = cli("verify", "--db", db.path, "--run", "r2")
    assert code == 1 and str(path) in out + err and "missing" in out + err, (out, err)
    # control: the file back, every question answers again
    path.write_bytes(saved)
    assert _csv_count(cli, db, "SELECT count(*) AS n FROM col_stats") == 2 * per_run
