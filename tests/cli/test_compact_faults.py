"""``attnbase compact`` when its merged file cannot be written, and after a kill -9 (issue 44,
one-line list): a full disk is one line saying so and that nothing was lost (the batch files
stay listed and readable, no ``.partial`` left); a ``.partial`` file a killed merge left is
named by ``verify`` (never read) and removed by the next ``compact``, which says so."""

from __future__ import annotations

import os
import subprocess

import pytest
from cli_paths import ATTNBASE

from attnbase import faults


def listed(db) -> list[tuple]:
    with db.connect(read_only=True) as con:
        return con.execute("SELECT table_name, path, crc32c FROM stat_files ORDER BY path"
                           ).fetchall()


def total(db) -> tuple:
    with db.connect(read_only=True) as con:
        n, s = con.execute("SELECT count(*), sum(sink_mass) FROM row_stats").fetchone()
    return n, round(s, 9)  # (the sum's order may differ)


def compact(db, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in (faults.ENV, faults.DISK_FULL_ENV)}
    return subprocess.run([str(ATTNBASE), "compact", "--db", str(db.path), "--run", "r1",
                           "--stats-only"], env={**clean, **env}, capture_output=True,
                          text=True, timeout=300)


def partials(db) -> list[str]:
    return sorted(p.name for p in db.path.glob("*_stats/run_id=r1/*.partial"))


@pytest.mark.slow
def test_compact_on_a_full_disk_is_one_line_and_loses_nothing(fake_db, cli):
    db = fake_db
    files, rows = listed(db), total(db)
    p = compact(db, **{faults.DISK_FULL_ENV: "merge_write:2000"})
    assert p.returncode == 2, (p.stdout, p.stderr)
    line = p.stderr.strip()
    assert "\n" not in line and line.startswith("error: run 'r1': cannot write the merged "), line
    assert "(EFBIG)" in line and "nothing was lost" in line and "damaged" not in line, line
    assert "stay listed and readable" in line and "attnbase compact --run r1" in line, line
    assert listed(db) == files and total(db) == rows and partials(db) == []
    code, out, err = cli("verify", "--db", db.path)
    assert code == 0 and out.startswith("ok"), (out, err)
    p = compact(db)  # control: with room, the same merge is made
    assert p.returncode == 0 and "merged, 6 files -> 2" in p.stdout, (p.stdout, p.stderr)
    assert total(db) == rows


@pytest.mark.slow
def test_a_partial_left_by_a_killed_compact_is_named_then_removed(fake_db, cli):
    db = fake_db
    rows = total(db)
    p = compact(db, **{faults.ENV: "merge_written"})
    assert p.returncode == -9, (p.stdout, p.stderr)
    (left,) = partials(db)
    assert total(db) == rows  # never read
    code, out, err = cli("verify", "--db", db.path)
    assert code == 0 and f"note: run 'r1': row_stats/run_id=r1/{left} is a file a stopped " \
        "write left" in out and "ok: 1 run(s)" in out, (out, err)
    code, out, err = cli("compact", "--db", db.path, "--run", "r1", "--stats-only")
    assert code == 0, err
    assert f"removed 1 file(s) a stopped write left (never read): row_stats/run_id=r1/{left}" \
        in out and "merged, 6 files -> 2" in out, out
    assert partials(db) == [] and total(db) == rows
    code, out, err = cli("verify", "--db", db.path)  # control: nothing left to name
    assert code == 0 and "note:" not in out, out
