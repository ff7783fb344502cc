"""Decoded data kept for a reader that asks again (the service): zarr chunks and parquet row
groups, held in one least-recently-used cache bounded in bytes.

Each entry is keyed by the identity of the file it was decoded from (path, inode, mtime, size).
Every writer here replaces a file whole, by rename: a chunk of a resumed or repaired batch, a
statistics file that was merged. A replaced file has another key, so it is read afresh and
never served stale. A missing file (a chunk not yet written: zarr's fill value) is never kept.
Object storage has no cheap identity, so its reads are not kept.

Values are numpy arrays set read-only (or pyarrow tables, immutable): a caller that writes into
what it was given fails loudly instead of changing what the next reader sees.

Without it, a head page decodes and checksums its layer's queries' and keys' chunks (16
sequences each) on every read (benchmarks/RESULTS.md: "decoded-chunk cache").
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cachetools import LRUCache


def file_key(path: Path) -> tuple | None:
    """``(path, inode, mtime_ns, size)`` of a local file, or None where it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (str(path), st.st_ino, st.st_mtime_ns, st.st_size)


def full_index(index, ndim: int) -> tuple | None:
    """A basic index as one entry per axis: a lone index as a tuple, its Ellipsis expanded, the
    axes left ``slice(None)``; None where it has more entries than ``ndim``."""
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (ndim - len(index) + 1) + index[k + 1:]
    if len(index) > ndim:
        return None
    return index + (slice(None),) * (ndim - len(index))


class Decoded:
    """Least-recently-used values by key, at most ``max_bytes`` of them in all (a value larger
    than that is not kept): a :class:`cachetools.LRUCache` sized by each value's ``nbytes``,
    behind a lock. Thread-safe; two threads missing the same key both decode it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.hits = self.misses = 0
        self._items: LRUCache = LRUCache(maxsize=self.max_bytes, getsizeof=_held_bytes)
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes of the values held now."""
        return int(self._items.currsize)

    def get(self, key):
        with self._lock:
            try:
                item = self._items[key]
            except KeyError:
                self.misses += 1
                return None
            self.hits += 1
            return item[0]

    def put(self, key, value, nbytes: int) -> None:
        if nbytes > self.max_bytes:
            return
        if isinstance(value, np.ndarray):
            value.setflags(write=False)
        with self._lock:
            self._items[key] = (value, int(nbytes))


def _held_bytes(item: tuple[Any, int]) -> int:
    return item[1]


@dataclass(frozen=True)
class _Plan:
    path: Path  # the chunk's file
    chunk: tuple  # the chunk's selection of the array
    local: tuple  # the caller's selection of the chunk


class CachedChunks:
    """A stored array of a local run store (a ``zarr.Array``, or a bfloat16 wrapper read as
    float32) read through :class:`Decoded`: a selection inside one chunk reads that chunk whole
    once and is sliced from it after; any other selection goes to the array itself. Reads like
    the array (``shape``, ``chunks``, ``dtype``, ``metadata``, ``attrs``, basic indexing)."""

    def __init__(self, arr, chunk_dir: Path, cache: Decoded) -> None:
        self.arr, self.chunk_dir, self.cache = arr, Path(chunk_dir), cache
        self.shape, self.chunks, self.ndim = arr.shape, arr.chunks, arr.ndim
        self.metadata, self.attrs, self.dtype = arr.metadata, arr.attrs, arr.dtype

    def __repr__(self) -> str:
        return f"<CachedChunks {self.arr!r}>"

    @staticmethod
    def wraps(arr) -> bool:
        """Whether ``arr``'s chunks lie in files ``c/i/j/...`` (zarr v3's default key encoding
        with ``/``), one per chunk (no sharding): what :meth:`plan` can name."""
        meta = getattr(arr, "raw", arr).metadata
        keys = getattr(meta, "chunk_key_encoding", None)
        codecs = [type(c).__name__ for c in getattr(meta, "codecs", ())]
        return (keys is not None and keys.name == "default"
                and getattr(keys, "separator", None) == "/" and "ShardingCodec" not in codecs)

    def plan(self, index) -> _Plan | None:
        """The one chunk ``index`` (ints and unit-step slices) lies in, or None (several
        chunks, an empty selection, another kind of index)."""
        index = full_index(index, self.ndim)
        if index is None:
            return None
        coords, chunk, local = [], [], []
        for sel, n, c in zip(index, self.shape, self.chunks):
            if isinstance(sel, (int, np.integer)):
                i = int(sel)
                if not -n <= i < n:
                    return None  # the array's own IndexError
                i %= n
                lo, hi = i, i + 1
            elif isinstance(sel, slice):
                lo, hi, step = sel.indices(n)
                if step != 1 or hi <= lo:
                    return None
            else:
                return None
            k = lo // c
            if (hi - 1) // c != k:
                return None
            start = k * c
            coords.append(k)
            chunk.append(slice(start, min(start + c, n)))
            local.append(i - start if isinstance(sel, (int, np.integer)) else
                         slice(lo - start, hi - start))
        return _Plan(self.chunk_dir.joinpath("c", *map(str, coords)), tuple(chunk), tuple(local))

    def __getitem__(self, index):
        return read_many([(self, index)])[0]

    def __array__(self, dtype=None, copy=None):
        a = self.arr[...]
        return a if dtype is None else a.astype(dtype)


def read_many(reads: list[tuple[Any, Any]]) -> list[np.ndarray]:
    """``arr[sel]`` for each ``(arr, sel)``; what :class:`CachedChunks` holds is sliced from its
    cache, and every read left is done in one pass of zarr's event loop where each array has one
    (each synchronous zarr read is a round trip to its I/O thread; benchmarks/RESULTS.md: "one
    synchronous zarr read"); others (bfloat16 wrappers) one after the other."""
    out: list = [None] * len(reads)
    todo = []  # (position, array to read, selection, plan, file key)
    for n, (arr, sel) in enumerate(reads):
        plan = arr.plan(sel) if isinstance(arr, CachedChunks) else None
        if plan is None:
            todo.append((n, arr.arr if isinstance(arr, CachedChunks) else arr, sel, None, None))
            continue
        key = file_key(plan.path)  # before the read: a file replaced after it has a new key
        block = None if key is None else arr.cache.get(key)
        if block is not None:
            out[n] = block[plan.local]
        else:
            todo.append((n, arr.arr, plan.chunk, plan, key))
    for (n, arr, sel, plan, key), got in zip(todo, _read_zarr([(t[1], t[2]) for t in todo])):
        if plan is None:
            out[n] = got
            continue
        if key is not None:
            reads[n][0].cache.put(key, got, got.nbytes)
        out[n] = got[plan.local]
    return out


def _read_zarr(reads: list[tuple[Any, Any]]) -> list[np.ndarray]:
    if len(reads) < 2 or not all(hasattr(a, "async_array") for a, _ in reads):
        return [np.asarray(a[sel]) for a, sel in reads]
    import asyncio

    from zarr.core.sync import sync

    async def every():
        return await asyncio.gather(*(a.async_array.getitem(sel) for a, sel in reads))

    return [np.asarray(x) for x in sync(every())]
