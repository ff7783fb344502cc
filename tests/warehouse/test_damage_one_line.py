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
