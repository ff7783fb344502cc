"""``--db`` naming a file (not a directory) is one line and exit 2 before any work, for the
commands that write and those that read; a directory path (new or existing) is not refused."""

from __future__ import annotations

import subprocess

import pytest

from cli_paths import ATTNBASE


@pytest.mark.parametrize("args", [
    ["extract", "--model", "tiny-gpt2", "--run", "x", "--seqs", "2", "--seq-len", "16", "-q"],
    ["runs"],
    ["analyze", "--run", "x"],
])
def test_a_file_as_db_is_one_line(tmp_path, args):
    f = tmp_path / "not-a-db"
    f.write_text("x")
    p = subprocess.run([str(ATTNBASE), *args, "--db", str(f)], capture_output=True, text=True,
                       timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "is a file, not a database directory" in p.stderr
    assert f.read_text() == "x"  # nothing written over it


def test_a_new_directory_is_not_refused(tmp_path):
    from attnbase.warehouse import Database

    db = Database(tmp_path / "new")  # negative control: a path that does not exist yet
    assert not db.exists()
