"""``attnbase report --out`` a directory nobody may create (sysfs refuses it, root included):
one line naming the path and what to do, exit 2 (before: PermissionError as a traceback)."""

from __future__ import annotations

from serve_fixtures import RUN


def test_report_into_unwritable_directory_is_one_line(cli, serve_db):
    code, out, err = cli("report", "--db", serve_db, "--run", RUN, "--out",
                         "/sys/attnbase-test-report")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "/sys/attnbase-test-report; choose a directory you can write" in err
