"""The service's cache of decoded chunks (warehouse/runs/decoded.py): the same values as zarr, read
again only when a chunk file is replaced, nothing kept of a chunk not written yet, bounded in
bytes, and read-only."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from attnbase.warehouse.runs.decoded import CachedChunks, Decoded, file_key
from attnbase.warehouse.runs.store import RunStore

SELECTIONS = [
    (0,), (1, 2), (1, 2, 3), (-1, 0, slice(2, 4)), (0, slice(None), slice(0, 2)), (Ellipsis,),
    (slice(None), 0), (0, Ellipsis, 1), (1, 0, 4, slice(1, 5), 2), (0, 0, slice(0, 0)),
    (0, 0, slice(0, 5, 2)), (slice(0, 2), 0, slice(1, 3)),
]


def _stores(db, run="r1", max_bytes=64 << 20):
    cache = Decoded(max_bytes)
    return (RunStore(db.store_path(run), run),
            RunStore(db.store_path(run), run, keep_open=True, decoded=cache), cache)


def test_cached_reads_are_zarrs_reads(fake_run):
    """Every stored array and the derived logits, under ints, slices, Ellipsis, negative and
    empty selections, inside one chunk and across several: the values zarr reads, bit for bit
    (NaN and -inf alike); the cache was used (hits), and an index out of range fails as zarr's."""
    db, _, _ = fake_run
    plain, cached, cache = _stores(db)
    names = plain.names()
    assert {"attn_logits", "queries", "tokens"} <= set(names)
    for name in names:
        arr = plain.array(name)
        for sel in SELECTIONS:
            if len([s for s in sel if s is not Ellipsis]) > arr.ndim:
                continue
            try:
                want = np.asarray(arr[sel])
            except IndexError as err:  # out of range for this array: the same error
                with pytest.raises(type(err)):
                    cached.read(name, sel)
                continue
            for _ in range(2):  # a miss, then a hit
                got = cached.read(name, sel)
                assert got.shape == want.shape and got.dtype == want.dtype, (name, sel)
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {sel}")
    assert isinstance(cached.array("queries"), CachedChunks)
    assert cache.hits > 0 and cache.misses > 0 and 0 < cache.nbytes <= cache.max_bytes
    with pytest.raises(IndexError):
        cached.read("tokens", 99)


def test_a_replaced_chunk_is_read_afresh(fake_run):
    """A chunk file written again (a resumed or repaired batch: a new file renamed into place)
    has another identity, so the next read decodes it; the earlier read was a hit (negative
    control: without the file's identity in the key the old tokens would still be served)."""
    db, _, _ = fake_run
    _, cached, cache = _stores(db)
    first = cached.read("tokens", 0).copy()
    hits = cache.hits
    np.testing.assert_array_equal(cached.read("tokens", 0), first)
    assert cache.hits == hits + 1
    chunk = db.store_path("r1") / "tokens" / "c" / "0" / "0"
    before = file_key(chunk)
    zarr.open_group(str(db.store_path("r1")), mode="r+")["tokens"][0:2] = first[None] + 7
    assert file_key(chunk) != before
    np.testing.assert_array_equal(cached.read("tokens", 0), first + 7)
    np.testing.assert_array_equal(cached.read("tokens", 1), first + 7)


def test_a_chunk_not_written_is_not_kept(fake_run):
    """A missing chunk file reads as zarr's fill value and is not kept: once its batch is
    written, its values are read."""
    db, _, _ = fake_run
    _, cached, cache = _stores(db)
    chunk = db.store_path("r1") / "tokens" / "c" / "2" / "0"  # seqs 4..5: the last batch
    data = chunk.read_bytes()
    want = RunStore(db.store_path("r1"), "r1").read("tokens", 4)
    chunk.unlink()
    held = cache.nbytes
    fill = cached.read("tokens", 4)
    assert not np.array_equal(fill, want) and cache.nbytes == held
    chunk.write_bytes(data)
    np.testing.assert_array_equal(cached.read("tokens", 4), want)
    assert cache.nbytes > held


def test_the_cache_is_bounded_and_least_recently_used_goes_first():
    cache = Decoded(1000)
    for k in range(5):
        cache.put(k, np.zeros(50), 400)  # 400 bytes each
        assert cache.nbytes <= 1000
    assert [cache.get(k) is not None for k in range(5)] == [False, False, False, True, True]
    cache.get(3)  # 3 used last: 4 goes first
    cache.put(5, np.zeros(50), 400)
    assert cache.get(4) is None and cache.get(3) is not None and cache.get(5) is not None
    cache.put("big", np.zeros(200), 1600)  # larger than the whole cache: not kept, none dropped
    assert cache.get("big") is None and cache.nbytes == 800
    cache.put(5, np.zeros(50), 400)  # again under the same key: counted once
    assert cache.nbytes == 800


def test_what_the_cache_hands_out_is_read_only(fake_run):
    """A caller writing into a cached block fails loudly; the next reader sees the values."""
    db, _, _ = fake_run
    _, cached, _ = _stores(db)
    for _ in range(2):  # from the chunk just read, then from the cache
        block = cached.read("queries", (0, 0, 1))
        with pytest.raises(ValueError, match="read-only"):
            block[0] = 1.0
    np.testing.assert_array_equal(cached.read("queries", (0, 0, 1)),
                                  RunStore(db.store_path("r1"), "r1").read("queries", (0, 0, 1)))


def test_no_cache_for_an_array_whose_chunk_files_it_cannot_name(tmp_path):
    """Sharded arrays (several chunks per file) and v2-style keys ('.'): read through zarr."""
    plain = zarr.create_array(str(tmp_path / "a"), shape=(4, 4), chunks=(2, 2), dtype="f4")
    dotted = zarr.create_array(str(tmp_path / "b"), shape=(4, 4), chunks=(2, 2), dtype="f4",
                               chunk_key_encoding={"name": "default", "separator": "."})
    sharded = zarr.create_array(str(tmp_path / "c"), shape=(4, 4), chunks=(2, 2),
                                shards=(4, 4), dtype="f4")
    assert [CachedChunks.wraps(a) for a in (plain, dotted, sharded)] == [True, False, False]
