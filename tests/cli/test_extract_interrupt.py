"""Ctrl-C during ``attnbase extract``: one line, status 'interrupted', exit 130, then resume.

And ``attnbase sql`` answers while an extraction writes (its statistics are files beside the
catalog; the writer holds the catalog once per 10 s of batches, for their ledger rows only).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from cli_paths import ATTNBASE

from attnbase.warehouse import Database, read_sql

ARGS = ["extract", "--model", "tiny-gpt2", "--seqs", "96", "--seq-len", "64", "--batch-size", "2",
        "--run", "ci", "-q"]
N_BATCHES = 48


def _done(db) -> int:
    try:
        return int(read_sql(db, "SELECT count(*) FILTER (WHERE status = 'complete') AS n "
                                "FROM batches WHERE run_id = 'ci'")["n"][0])
    except Exception:  # catalog not created yet, or held for a moment by the writer
        return 0


def _written(db) -> int:
    """Batches whose statistics files exist (step 2 of a batch's durability): progress as the
    writer makes it, while the ledger counts the streamed batches once per 10 s."""
    return len(list((db / "row_stats" / "run_id=ci").glob("b*.parquet")))


def _start(db):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([str(ATTNBASE), *ARGS, "--db", str(db)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigint_marks_interrupted_and_the_same_command_resumes(tmp_path):
    """Two extract processes (~1-3 min on 2 loaded cores): ``slow``."""
    db = tmp_path / "db"
    p = _start(db)
    try:
        deadline = time.monotonic() + 240
        while _written(db) < 2 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        assert p.poll() is None, p.communicate()
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    k = _done(db)
    assert 2 <= k < N_BATCHES
    assert lines[0] == f"interrupted after {k}/{N_BATCHES} batches; run the same command to resume"
    assert took < 20, took  # "within seconds" (the batch being written is finished first)
    assert Database(db).run_info("ci")["status"] == "interrupted"

    p = _start(db)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    assert f"{N_BATCHES - k}/{N_BATCHES} batches written this time" in out
    assert Database(db).run_info("ci")["status"] == "complete"
    n = read_sql(db, "SELECT count(*) AS n, count(DISTINCT (layer, head, seq, query)) AS d "
                     "FROM row_stats WHERE run_id = 'ci'")
    assert n["n"][0] == n["d"][0] == 4 * 4 * 96 * 64


@pytest.mark.slow
def test_sql_answers_while_an_extraction_writes(tmp_path):
    """Readers are never blocked by the writer for more than 1 s (issue 11): a reader whose
    ``lock_timeout`` is 1 s raises CatalogLockedError if the writer ever holds the catalog
    longer than that while it waits, so every answered query below is the proof."""
    db = tmp_path / "db"
    p = _start(db)
    answers = 0
    try:
        deadline = time.monotonic() + 240
        while _done(db) < 1 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        reader = Database(db, lock_timeout=1.0)
        seen = []
        until = time.monotonic() + 180  # at least 40 answers, and on until a batch has landed
        while p.poll() is None and time.monotonic() < until and (
                answers < 40 or seen[-1] == seen[0]):
            n = read_sql(reader, "SELECT count(*) AS n FROM row_stats WHERE run_id = 'ci'")["n"][0]
            seen.append(int(n))
            answers += 1
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=120)
    assert answers >= 5, answers
    assert seen == sorted(seen) and seen[-1] > seen[0]  # it did read while batches landed
