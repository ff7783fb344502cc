"""kill -9 at seeded points of the write path, then resume: the run ends bit-identical to an
uninterrupted one, with ledger and statistics consistent (``verify`` finds nothing).

The writer is a child process (tests/warehouse/fault_child.py) that feeds fake batches through
the real write path; ``ATTNBASE_KILL_AT=<point>:<n>`` SIGKILLs it at the n-th time it reaches a
point of ``faults.POINTS``. Three seeded cases run in the fast suite, 21 (three per point, at
seeded batch indices) in the slow one. The same over the real capture and CLI is in
tests/cli/test_faults_cli.py.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fakes import expected_arrays, fake_batches

from attnbase import faults
from attnbase.warehouse import Database, read_sql
from attnbase.runner import ingest_batches
from attnbase.warehouse.runs.store import RunStore
from attnbase.warehouse.runs.verify import verify

HERE = Path(__file__).parent
CHILD = HERE / "fault_child.py"
N_SEQS, BATCH = 7, 2  # 4 batches, the last one short
N_BATCHES = -(-N_SEQS // BATCH)
N_ARRAYS = 6  # tokens, keys, keys_rot, queries, attn_logits, hidden (rotary fake)


def max_hits(point: str, n_batches: int = N_BATCHES, n_arrays: int = N_ARRAYS) -> int:
    """How often one uninterrupted run reaches ``point``."""
    if point == "run_finishing":
        return 1
    if point == "chunk_written":  # once per array of every batch
        return n_batches * n_arrays
    return n_batches


def seeded_cases(n: int, seed: int, **kw) -> list[tuple[str, int]]:
    """``n`` (point, hit) pairs: points round-robin over POINTS from a seeded start, hits seeded."""
    rng = random.Random(seed)
    start = rng.randrange(len(faults.POINTS))
    out = []
    for i in range(n):
        point = faults.POINTS[(start + i * 3) % len(faults.POINTS)]  # 3 is coprime with 7
        out.append((point, rng.randint(1, max_hits(point, **kw))))
    return out


FAST = seeded_cases(3, seed=10)
SLOW = seeded_cases(21, seed=20)


def child(db: Path, *, kill_at: str | None = None, pause: float = 0.0, run="r1",
          n_seqs=N_SEQS, batch=BATCH, **popen) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    if kill_at:
        env[faults.ENV] = kill_at
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1] / "src"), env.get("PYTHONPATH", "")])
    return [sys.executable, str(CHILD), str(db), run, str(n_seqs), str(batch), str(pause)], env


def resume(db: Database):
    from fault_child import config

    info, cfg = config(N_SEQS, BATCH)
    rec = ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                         batches=fake_batches(info, cfg), progress=False)
    return rec, info, cfg


def assert_consistent(db: Database, info, cfg) -> None:
    res = verify(db, "r1")
    assert res.ok, [str(p) for p in res.problems]
    store = RunStore(db.store_path("r1"), "r1")
    for name, want in expected_arrays(info, cfg).items():
        np.testing.assert_array_equal(store.read(name), want, err_msg=name)
    ledger = read_sql(db, "SELECT count(*) FILTER (WHERE status = 'complete') AS done, "
                          "count(*) AS n FROM batches WHERE run_id = 'r1'")
    assert (ledger["done"][0], ledger["n"][0]) == (N_BATCHES, N_BATCHES)
    rows = info.n_layers * info.n_heads * cfg.n_seqs * cfg.seq_len
    counts = read_sql(db, "SELECT (SELECT count(*) FROM row_stats) AS r, "
                          "(SELECT count(*) FROM col_stats) AS c")
    assert (counts["r"][0], counts["c"][0]) == (rows, rows)
    assert db.run_info("r1")["status"] == "complete"


def assert_ledgered_rows(db: Database) -> None:
    """What readers see of a killed run: exactly its ledgered batches' rows, whatever files the
    kill left (a batch's files written before its ledger mark, a ``.partial`` file)."""
    from fault_child import config

    info, cfg = config(N_SEQS, BATCH)
    if not db.exists() or db.find_run("r1") is None:
        return  # killed before the run was registered
    got = read_sql(db, "SELECT (SELECT count(*) FROM row_stats) AS r, "
                       "(SELECT count(*) FROM col_stats) AS c, (SELECT coalesce(sum(n_seqs), 0) "
                       "FROM batches WHERE status = 'complete') AS seqs")
    want = info.n_layers * info.n_heads * int(got["seqs"][0]) * cfg.seq_len
    assert (got["r"][0], got["c"][0]) == (want, want)


def kill_and_resume(tmp_path: Path, point: str, hit: int, monkeypatch) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)  # never in this process
    db = Database(tmp_path / "db", lock_timeout=10)
    cmd, env = child(db.path, kill_at=f"{point}:{hit}")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, f"{point}:{hit} was not reached (rc {p.returncode}): {p.stderr[-2000:]}"
    assert_ledgered_rows(db)
    rec, info, cfg = resume(db)
    assert rec.status == "complete"
    assert_consistent(db, info, cfg)


@pytest.mark.parametrize("point,hit", FAST, ids=[f"{p}:{h}" for p, h in FAST])
def test_kill_at_seeded_point_then_resume(tmp_path, monkeypatch, point, hit):
    kill_and_resume(tmp_path, point, hit, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("point,hit", SLOW, ids=[f"{p}:{h}" for p, h in SLOW])
def test_kill_at_seeded_point_then_resume_slow(tmp_path, monkeypatch, point, hit):
    kill_and_resume(tmp_path, point, hit, monkeypatch)


def test_cases_are_spread():
    assert len(SLOW) >= 20 and len(FAST) >= 3
    assert {p for p, _ in SLOW} == set(faults.POINTS)
    per_point = {}
    for p, h in SLOW:
        per_point.setdefault(p, set()).add(h)
    # several batch indices per point, not always the first batch
    assert sum(len(h) for h in per_point.values()) >= 14
    assert all(1 <= h <= max_hits(p) for p, h in SLOW + FAST)


def test_every_point_is_called_by_the_write_path():
    """faults.POINTS (and MAINTENANCE_POINTS) and the calls in the source agree (a point no
    code reaches tests nothing)."""
    src = HERE.parents[1] / "src" / "attnbase"
    called = set()
    for path in src.rglob("*.py"):
        called |= set(re.findall(r'faults\.point\("([a-z_]+)"\)', path.read_text()))
    assert called == set(faults.POINTS) | set(faults.MAINTENANCE_POINTS)


def test_uninterrupted_child_matches_reference(tmp_path, monkeypatch):
    """The child without a kill point writes exactly the reference arrays (the oracle is sound)."""
    monkeypatch.delenv(faults.ENV, raising=False)
    db = Database(tmp_path / "db")
    cmd, env = child(db.path)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    from fault_child import config

    assert_consistent(db, *config(N_SEQS, BATCH))


def test_concurrent_readers_while_extraction_writes(tmp_path, monkeypatch):
    """SQL and array readers run while a writer process commits batches: every read sees whole
    batches only (row counts are multiples of a batch's rows, counted batches decode)."""
    monkeypatch.delenv(faults.ENV, raising=False)
    db = Database(tmp_path / "db", lock_timeout=20)
    n_seqs, batch = 16, 2
    cmd, env = child(db.path, pause=0.15, n_seqs=n_seqs, batch=batch)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    from fault_child import config

    info, cfg = config(n_seqs, batch)
    per_seq = info.n_layers * info.n_heads * cfg.seq_len
    seen: list[list[int]] = [[], []]
    errors = []

    def reader(mine: list[int]):
        while proc.poll() is None:
            try:
                if not db.exists() or db.find_run("r1") is None:
                    time.sleep(0.05)
                    continue
                df = read_sql(db, "SELECT (SELECT count(*) FROM row_stats) AS r, (SELECT "
                                  "list(first_seq + n_seqs) FROM batches WHERE status = 'complete') AS e")
                r = int(df["r"][0])
                ends = df["e"].to_list()[0] or []
                mine.append(r)
                assert r % (per_seq * batch) == 0 or r == per_seq * n_seqs, r
                store = RunStore(db.store_path("r1"), "r1")
                for end in ends:  # every counted batch reads back finite logits at its last seq
                    block = store.read("attn_logits", (0, slice(None), end - 1))
                    assert not np.isnan(block).any()
            except Exception as err:  # collected: an assert in a thread would be lost
                errors.append(repr(err))
                return

    threads = [threading.Thread(target=reader, args=(s,)) for s in seen]
    for t in threads:
        t.start()
    out, err = proc.communicate(timeout=300)
    for t in threads:
        t.join()
    assert proc.returncode == 0, err
    assert not errors, errors
    for mine in seen:  # a reader never sees the data go backwards
        assert mine == sorted(mine)
    assert len({r for mine in seen for r in mine}) >= 3, f"readers never overlapped the writes: {seen}"
    assert verify(db, "r1").ok
