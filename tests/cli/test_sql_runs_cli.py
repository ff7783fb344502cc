from __future__ import annotations

import json
import subprocess

import pytest
from cli_paths import ATTNBASE

WRITES = ["INSERT INTO runs (run_id) VALUES ('x')", "UPDATE runs SET status = 'failed'",
          "DELETE FROM runs", "CREATE TABLE t (a INT)", "DROP TABLE runs",
          "ATTACH 'other.duckdb' AS o", "COPY runs TO 'out.csv'", "INSTALL httpfs", "LOAD json",
          "SET threads = 1"]


@pytest.mark.parametrize("query", WRITES)
def test_sql_refuses_writes(cli, fake_db, query):
    code, out, err = cli("sql", "--db", fake_db.path, query)
    assert code != 0
    assert err.startswith("error: attnbase sql is read-only") and err.count("\n") == 1
    assert out == ""
    code, out, _ = cli("sql", "--db", fake_db.path, "SELECT count(*) AS n FROM runs", "-f", "csv")
    assert out == "n\n1\n"
    assert not (fake_db.path / "out.csv").exists() and not (fake_db.path / "other.duckdb").exists()


def test_sql_formats(cli, fake_db):
    q = "SELECT run_id, n_seqs, status FROM runs"
    code, out, _ = cli("sql", "--db", fake_db.path, q, "--format", "csv")
    assert code == 0 and out == "run_id,n_seqs,status\nr1,5,complete\n"
    code, out, _ = cli("sql", "--db", fake_db.path, q, "--format", "json")
    assert code == 0 and json.loads(out) == [{"run_id": "r1", "n_seqs": 5, "status": "complete"}]
    code, out, _ = cli("sql", "--db", fake_db.path, q)
    assert code == 0 and "r1" in out and "complete" in out and "1 row" in out
    code, _, err = cli("sql", "--db", fake_db.path, q, "--format", "xml")
    assert code != 0 and "unknown --format 'xml'" in err


def test_sql_missing_db_writes_nothing(cli, tmp_path):
    code, _, err = cli("sql", "--db", tmp_path / "none", "SELECT 1")
    assert code != 0 and "no attnbase database" in err and err.count("\n") == 1
    assert not (tmp_path / "none").exists()


def test_runs_lists_progress(cli, fake_db):
    code, out, _ = cli("runs", "--db", fake_db.path)
    assert code == 0 and "r1" in out and "complete" in out and "3/3" in out


def test_console_script_entry_point(fake_db):
    """The installed script is ``attnbase.cli:main``: one error line, exit 2, no traceback."""
    text = ATTNBASE.read_text()
    assert "from attnbase.cli import main" in text, "reinstall: pip install -e . --no-deps"
    p = subprocess.run([str(ATTNBASE), "sql", "--db", str(fake_db.path), "DROP TABLE runs"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    p = subprocess.run([str(ATTNBASE), "sql", "--db", str(fake_db.path),
                        "SELECT count(*) AS n FROM row_stats", "-f", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout) == [{"n": 2 * 3 * 5 * 6}]
    p = subprocess.run([str(ATTNBASE), "sql", "--bogus"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "No such option" in p.stderr


@pytest.mark.parametrize("value", ["[red]hi[/red] :smile:", ":x: [bold]b[/bold]", "[/]", "[link=x]y"])
def test_sql_table_prints_values_verbatim(cli, fake_db, value):
    """Rich markup and emoji codes inside data are printed as typed, not rendered."""
    code, out, err = cli("sql", "--db", fake_db.path, "SELECT ? AS v".replace("?", "'" + value + "'"))
    assert code == 0, err
    assert value in out
    assert "\N{SMILING FACE WITH SMILING EYES}" not in out and "\N{CROSS MARK}" not in out


def test_sql_file_readers_refused(cli, fake_db):
    code, out, err = cli("sql", "--db", fake_db.path, "SELECT * FROM read_csv('/etc/passwd', header=false)")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: attnbase sql reads only the catalog") and "root:" not in err
    code, out, err = cli("sql", "--db", fake_db.path, "SELECT * FROM glob('/etc/*')")
    assert code == 2 and out == "" and err.count("\n") == 1
