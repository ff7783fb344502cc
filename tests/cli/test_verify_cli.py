"""``attnbase verify`` and ``attnbase extract --repair`` on real tiny-gpt2 runs; kill -9 of the
real CLI at every fault point (slow)."""

from __future__ import annotations

import os
import random
import subprocess

import numpy as np
import pytest
from cli_paths import ATTNBASE

from attnbase import faults
from attnbase.errors import ArrayCorruptError
from attnbase.warehouse import Database
from attnbase.warehouse.runs.store import RunStore

ARGS = ["--model", "tiny-gpt2", "--seqs", 6, "--seq-len", 16, "--batch-size", 2, "-q"]
N_BATCHES, N_ARRAYS = 3, 5  # tokens, keys, queries, attn_logits (derived), hidden (gpt2: no keys_rot)


def arrays(db, run):
    store = RunStore(Database(db).store_path(run), run)
    return {name: store.read(name) for name in store.names()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run 't' of ARGS (in-process), read back."""
    from attnbase.extract.config import ExtractConfig
    from attnbase.runner import extract_run

    db = tmp_path_factory.mktemp("ref") / "db"
    cfg = ExtractConfig(model="tiny-gpt2", corpus="default", n_seqs=6, seq_len=16, batch_size=2)
    extract_run(Database(db), "t", cfg, progress=False)
    return arrays(db, "t")


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_verify_names_damage_and_repair_restores(cli, tmp_path, reference, damage):
    db = tmp_path / "db"
    assert cli("extract", "--db", db, "--run", "t", *ARGS)[0] == 0
    code, out, err = cli("verify", "--db", db)
    assert code == 0 and out.startswith("ok: 1 run(s) (t)"), err
    # the queries chunk of layer 2, batch 1 (the default capture derives attn_logits from it)
    chunk = db / "runs" / "t" / "store.zarr" / "queries" / "c" / "2" / "0" / "1" / "0" / "0"
    raw = chunk.read_bytes()
    if damage == "flip":
        b = bytearray(raw)
        b[len(b) // 2] ^= 0x55
        chunk.write_bytes(bytes(b))
    else:
        chunk.write_bytes(raw[: len(raw) // 3])

    code, out, err = cli("verify", "--db", db, "--run", "t")
    assert code == 1
    lines = out.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("run 't', array 'queries', chunk (2, 0, 1, 0, 0), batch 1")
    assert str(chunk) in lines[0]
    assert "1 problem(s) in run(s) t" in err and "--repair" in err
    # the derived logits of that layer name the stored chunk they cannot be formed from
    with pytest.raises(ArrayCorruptError, match=r"'queries' chunk \(2, 0, 1, 0, 0\)"):
        Database(db).read_layer("t", "attn_logits", 2)

    mtime_other = (db / "runs" / "t" / "store.zarr" / "keys" / "c" / "0" / "0" / "0" / "0" / "0").stat().st_mtime_ns
    code, out, err = cli("extract", "--db", db, "--run", "t", *ARGS, "--repair")
    assert code == 0, err
    assert "rewriting broken batches [1]" in err
    assert "1/3 batches written this time" in out
    assert cli("verify", "--db", db)[0] == 0
    assert_same(arrays(db, "t"), reference)
    # batch 0 was not rewritten
    assert (db / "runs" / "t" / "store.zarr" / "keys" / "c" / "0" / "0" / "0" / "0" / "0").stat().st_mtime_ns == mtime_other


def test_verify_and_repair_errors(cli, tmp_path):
    code, out, err = cli("verify", "--db", tmp_path / "none")
    assert code == 2 and "no attnbase database" in err and err.count("\n") == 1
    assert not (tmp_path / "none").exists()
    db = tmp_path / "db"
    code, out, err = cli("extract", "--db", db, "--run", "t", *ARGS, "--repair", "--overwrite")
    assert code == 2 and "pass one of them" in err and not db.exists()


# --- kill -9 of the real CLI at every fault point, then resume (slow) --------------------------
def _cases():
    rng = random.Random(7)
    out = []
    for point in faults.POINTS:
        top = 1 if point == "run_finishing" else N_BATCHES * (N_ARRAYS if point == "chunk_written" else 1)
        out.append((point, rng.randint(1, top)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("point,hit", _cases(), ids=[f"{p}:{h}" for p, h in _cases()])
def test_cli_kill_at_point_then_resume(cli, tmp_path, reference, monkeypatch, point, hit):
    monkeypatch.delenv(faults.ENV, raising=False)
    db = tmp_path / "db"
    env = {**os.environ, faults.ENV: f"{point}:{hit}"}
    p = subprocess.run([str(ATTNBASE), "extract", "--db", str(db), "--run", "t", *map(str, ARGS)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == -9, p.stderr[-2000:]
    code, out, err = cli("extract", "--db", db, "--run", "t", *ARGS)
    assert code == 0, err
    assert cli("verify", "--db", db)[0] == 0
    assert_same(arrays(db, "t"), reference)
    assert Database(db).run_info("t")["status"] == "complete"
