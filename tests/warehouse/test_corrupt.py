from __future__ import annotations

import pytest

from attnbase.errors import ArrayCorruptError
from attnbase.warehouse import open_run
from attnbase.warehouse.runs.store import RunStore


def flip(path, offset=10):
    b = bytearray(path.read_bytes())
    b[offset % len(b)] ^= 0xFF
    path.write_bytes(bytes(b))


def test_corrupt_chunk_is_named(fake_run):
    db, _, _ = fake_run
    # attn_logits chunk (layer 1, head-block 0, seq-chunk 2, 0, 0): the last batch of layer 1
    chunk = db.store_path("r1") / "attn_logits" / "c" / "1" / "0" / "2" / "0" / "0"
    assert chunk.exists()
    flip(chunk)
    db.read_layer("r1", "attn_logits", 0)  # other layers are fine
    with pytest.raises(ArrayCorruptError) as exc:
        db.read_layer("r1", "attn_logits", 1)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "'r1'" in msg and "'attn_logits'" in msg and "(1, 0, 2, 0, 0)" in msg
    assert "--overwrite" in msg
    with pytest.raises(ArrayCorruptError, match=r"\(1, 0, 2, 0, 0\)"):
        RunStore(db.store_path("r1"), "r1").read("attn_logits")


def test_corrupt_tokens_chunk(fake_run):
    db, _, _ = fake_run
    flip(db.store_path("r1") / "tokens" / "c" / "0" / "0", offset=3)
    with pytest.raises(ArrayCorruptError, match=r"'tokens' chunk \(0, 0\)"):
        RunStore(db.store_path("r1"), "r1").read("tokens")


def test_truncated_chunk(fake_run):
    db, _, _ = fake_run
    chunk = db.store_path("r1") / "hidden" / "c" / "0" / "1" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:5])
    with pytest.raises(ArrayCorruptError, match=r"'hidden' chunk \(0, 1, 0, 0\)"):
        db.read_layer("r1", "hidden", 0)


def test_missing_store(fake_run):
    import shutil

    from attnbase.errors import WarehouseError

    db, _, _ = fake_run
    shutil.rmtree(db.store_path("r1"))
    with pytest.raises(WarehouseError, match="no array store"):
        open_run(db.path, "r1")
