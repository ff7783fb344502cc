"""The Zarr v3 store of one run: ``DIR/runs/<run_id>/store.zarr`` (or ``s3://bucket/prefix/
<run_id>/store.zarr``, :mod:`attnbase.warehouse.runs.location`).

Every array is preallocated at its full shape with named dimensions (``ARRAY_DIMS``), chunked as
one layer x one extraction batch (e.g. ``attn_logits`` chunks are ``(1, head, batch, query,
key)``) and protected by a crc32c checksum; zstd only where it pays (``ArraySpec.compressed``:
causal logits and tokens). A batch therefore writes whole
chunks only; zarr's local store writes each chunk to a temporary file and renames it, and
:meth:`RunStore.write_batch` fsyncs the batch's chunk files before the catalog ledger counts them.
Unwritten chunks read as the fill value (NaN for floats, 0 for tokens).

On object storage each chunk is one PUT of exactly the bytes the local file would hold (the
objects are byte-identical to local chunk files); a PUT that returned is durable, so
:meth:`RunStore.sync_batch` has nothing to do there and no ``.partial`` file ever exists.
"""

from __future__ import annotations

import itertools
import math
import os
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zarr
import zarr.codecs

from attnbase.contract import (ArraySpec, LogitsRecipe, array_specs,  # noqa: F401 (re-exported)
                               storage_dtype, stored_float_dtype)
from attnbase.errors import ArrayCorruptError, MissingExtraError, WarehouseError
from attnbase.warehouse.runs.decoded import CachedChunks, Decoded, full_index
from attnbase.warehouse.runs.derived import DerivedLogits, derived_attrs, open_derived, read_derived_attrs
from attnbase.warehouse.runs.location import Remote, resolve

#: zstd's fast level -3 for what is compressed (causal logits: half ``-inf``, tokens): nearly
#: level 1's ratio at about three times its speed (benchmarks/RESULTS.md: "zstd level -3"; float
#: activations barely compress at any level, docs/toolchain.md, so they are stored raw).
ZSTD_LEVEL = -3
#: Concurrent chunk PUTs of one array's batch on object storage (location.py;
#: benchmarks/RESULTS.md: "concurrent chunk PUTs").
REMOTE_PUTS = 8
#: Threads that encode and write one array's chunks (one per layer) on a local disk, unless the
#: caller sizes its own (:meth:`RunStore.write_batch` ``threads``; the runner's writer pool,
#: ``runner.writer_threads``): two, the figure that keeps a 2-core CPU box's staging between
#: forwards fastest (benchmarks/history/2026-12-01.md).
CHUNK_THREADS = 2


def _corrupt_message(run_id: str, name: str, coords: tuple[int, ...], path: Path, err: Exception) -> str:
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return (f"run {run_id!r}: array {name!r} chunk {coords} ({path}) is corrupt ({detail}); "
            f"rewrite its batch with `attnbase extract ... --run {run_id} --repair` "
            f"(or re-extract with --overwrite)")


#: Attribute of an array stored in another dtype than it holds (bfloat16 as uint16 bits).
DTYPE_ATTR = "attnbase_dtype"
#: bfloat16's quiet NaN, the fill value of bfloat16 arrays (unwritten seqs read as NaN).
BF16_NAN = 0x7FC0


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values given as ``uint16`` bits -> float32 (exact: bfloat16 is float32's top
    half)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


class BFloat16Array:
    """A bfloat16 array of the store read as float32 (``--store-dtype bfloat16``): zarr-like
    (``shape``, ``chunks``, ``dtype``, ``metadata``, ``attrs``, basic indexing)."""

    def __init__(self, raw: zarr.Array) -> None:
        self.raw = raw
        self.shape, self.chunks, self.ndim = raw.shape, raw.chunks, raw.ndim
        self.metadata, self.attrs = raw.metadata, raw.attrs
        self.dtype = np.dtype(np.float32)

    def __getitem__(self, index):
        return bf16_to_float32(self.raw[index])

    def __array__(self, dtype=None, copy=None):
        a = self[...]
        return a if dtype is None else a.astype(dtype)


class RunStore:
    """Read and write the Zarr v3 group of one run."""

    def __init__(self, path: "str | Path | Remote", run_id: str, *,
                 keep_open: bool = False, decoded: Decoded | None = None,
                 recipes: str | None = None,
                 written: "tuple[tuple[int, int, int], ...] | None" = None) -> None:
        """``keep_open``: a reader that opens each array once and keeps it (the service's, one
        per catalog snapshot); otherwise every :meth:`array` call opens it afresh. ``decoded``:
        a local store's arrays are read through that cache of decoded chunks
        (:class:`~attnbase.warehouse.runs.decoded.CachedChunks`; the service's). ``recipes``
        and ``written``: the catalog's facts about the run
        (:class:`~attnbase.warehouse.runs.handle.RunHandle`): the derived arrays are formed by
        the catalog's recipes (a store whose copy differs is refused), and a chunk of a batch
        the ledger counts complete that is missing is an :class:`ArrayCorruptError`, never
        the fill value; None (a store read alone): the store's own attributes, no ledger."""
        self.path = resolve(path)  # a Path, or a Remote for s3://
        self.run_id = run_id
        self._group = None
        self._open_arrays: dict | None = {} if keep_open else None
        self._decoded = decoded
        self._recipes = recipes
        self._written = written
        self._derived: dict[str, LogitsRecipe] | None = None
        self._differ: set[str] = set()  # derived arrays whose store copy of the recipe differs

    # --- opening -------------------------------------------------------------------------
    def _open(self, mode: str):
        if mode == "r" and not (self.path / "zarr.json").exists():
            raise WarehouseError(
                f"run {self.run_id!r} has no array store at {self.path}; "
                f"re-extract it with `attnbase extract ... --run {self.run_id} --overwrite`"
            )
        if isinstance(self.path, Remote):
            return zarr.open_group(store=self.path.zarr_store(read_only=mode == "r"), mode=mode,
                                   zarr_format=3)
        return zarr.open_group(str(self.path), mode=mode, zarr_format=3)

    def zarr_store(self):
        """What ``xarray.open_zarr`` opens: the local path, or the remote store (read-only)."""
        return self.path.zarr_store(read_only=True) if self.remote else str(self.path)

    @property
    def remote(self) -> bool:
        return isinstance(self.path, Remote)

    def group(self, mode: str = "r"):
        if self._group is None or (mode != "r" and self._group.read_only):
            self._group = self._open(mode)
            self._derived = None
        return self._group

    def names(self) -> list[str]:
        """Every array of the run, stored or derived (:meth:`derived`)."""
        return sorted({k for k, _ in self.group().arrays()} | set(self.derived()))

    def stored_names(self) -> list[str]:
        return sorted(k for k, _ in self.group().arrays())

    def derived(self) -> dict[str, LogitsRecipe]:
        """``{name: recipe}`` of the arrays formed on read (warehouse/runs/derived.py): the
        catalog's where it is known, else the store's (:meth:`array` refuses a derived array
        whose two copies of the recipe differ)."""
        if self._derived is None:
            own = read_derived_attrs(dict(self.group().attrs))
            if self._recipes is None:
                self._derived, self._differ = own, set()
            else:
                import json

                trusted = {n: LogitsRecipe.from_json(t)
                           for n, t in json.loads(self._recipes).items()}
                self._derived = trusted
                self._differ = {n for n, r in trusted.items() if n in own and own[n] != r}
        return self._derived

    def array(self, name: str, mode: str = "r") -> zarr.Array:
        """A stored array, or for a derived one (``attn_logits`` of a derived-logits run) a
        :class:`~attnbase.warehouse.runs.derived.DerivedLogits` read the same way (read-only)."""
        if mode == "r" and self._open_arrays is not None:
            if name not in self._open_arrays:
                self._open_arrays[name] = self._array(name, mode)
            return self._open_arrays[name]
        return self._array(name, mode)

    def _array(self, name: str, mode: str):
        grp = self.group(mode)
        recipe = self.derived().get(name) if mode == "r" else None
        if recipe is not None:
            if name in self._differ:  # one of the two copies is damaged: no value is trusted
                raise ArrayCorruptError(
                    f"run {self.run_id!r}: the recipe of the derived array {name!r} in "
                    f"{self.path.name}/zarr.json differs from the catalog's, so its values "
                    f"cannot be trusted; `attnbase verify --run {self.run_id}` names the damage "
                    "(re-extract the run with --overwrite to rewrite the store)")
            return open_derived(name, recipe, self.array)
        try:
            arr = grp[name]
        except KeyError:
            have = ", ".join(self.names()) or "none"
            raise WarehouseError(
                f"run {self.run_id!r} stores no array {name!r} (it has: {have}); "
                "choose arrays to capture with `attnbase extract --capture`"
            ) from None
        if mode != "r":
            return arr
        if arr.attrs.get(DTYPE_ATTR) == "bfloat16":
            arr = BFloat16Array(arr)
        if self._decoded is not None and not self.remote and CachedChunks.wraps(arr):
            return CachedChunks(arr, self.path / name, self._decoded)
        return arr

    # --- writing -------------------------------------------------------------------------
    def create(self, specs: list[ArraySpec]) -> None:
        """Create the group and every missing array; existing arrays must match their spec."""
        self.path.mkdir(parents=True, exist_ok=True)
        grp = self.group("a")
        existing = {k: a for k, a in grp.arrays()}
        derived = {s.name: s.derivation for s in specs if s.derived}
        if derived:
            grp.attrs.update(derived_attrs(derived))
        for spec in specs:
            if spec.derived:
                continue
            arr = existing.get(spec.name)
            held = storage_dtype(spec.dtype)
            if arr is not None:
                if (tuple(arr.shape) != spec.shape or tuple(arr.chunks) != spec.chunks
                        or str(arr.dtype) != held):
                    raise WarehouseError(
                        f"run {self.run_id!r}: stored array {spec.name!r} has shape {arr.shape}, "
                        f"chunks {arr.chunks}, dtype {arr.dtype} but this run needs {spec.shape}, "
                        f"{spec.chunks}, {spec.dtype}; use --overwrite"
                    )
                continue
            is_float = spec.dtype.startswith("float")
            attrs = {"run_id": self.run_id}
            if held != spec.dtype:  # bfloat16 as its raw bits
                attrs[DTYPE_ATTR] = spec.dtype
            grp.create_array(
                spec.name,
                shape=spec.shape,
                chunks=spec.chunks,
                dtype=held,
                compressors=((zarr.codecs.ZstdCodec(level=ZSTD_LEVEL), zarr.codecs.Crc32cCodec())
                             if spec.compressed else (zarr.codecs.Crc32cCodec(),)),
                dimension_names=spec.dims,
                # unwritten chunks read as NaN (bfloat16: the bits of its quiet NaN)
                fill_value=(BF16_NAN if held != spec.dtype else float("nan")) if is_float else 0,
                attributes=attrs,
            )
        self.remove_partials()

    def remove_partials(self) -> None:
        """Delete temporary chunk files a killed writer left behind (never counted anywhere);
        object storage has none (a PUT stores the whole object or nothing)."""
        if self.remote:
            return
        for p in self.path.rglob("*.partial"):
            p.unlink(missing_ok=True)

    def write_batch(self, cb: Any, specs: list[ArraySpec], *,
                    on_chunk: Callable[[], None] | None = None, release: bool = False,
                    threads: int = CHUNK_THREADS) -> int:
        """Write a CapturedBatch's arrays into their ``seq`` slice; return bytes of raw data.
        Nothing is fsynced here: :meth:`sync_batch` makes the batch's chunk files durable.

        Every array in ``specs`` must be present in the batch with the run's shape except
        ``seq`` = ``cb.n_seqs``; the batch must start on a chunk boundary. Each array's chunks of
        this batch (one per layer) are written (:func:`_write_chunks_direct`, else through zarr),
        then ``on_chunk()`` is called.
        ``release`` drops each array from ``cb.arrays`` once written (a writer that owns the
        batch: its memory goes back while the next batch is captured). ``threads``: how many
        chunks of an array are encoded and written at once on a local disk (one pool for the
        batch; the bytes do not depend on it).
        """
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(REMOTE_PUTS if self.remote else max(1, int(threads)),
                                thread_name_prefix="attnbase-chunk") as pool:
            return self._write_batch(cb, specs, on_chunk, release, pool)

    def _write_batch(self, cb: Any, specs: list[ArraySpec], on_chunk, release: bool,
                     pool) -> int:
        nbytes = 0
        grp = self.group("a")
        by_name = {s.name: s for s in specs}
        extra = sorted(set(cb.arrays) - set(by_name))
        missing = sorted(set(by_name) - set(cb.arrays))
        if extra or missing:
            raise WarehouseError(
                f"run {self.run_id!r} batch {cb.batch}: captured arrays {sorted(cb.arrays)} do not "
                f"match the store's {sorted(by_name)} (missing {missing}, unexpected {extra})"
            )
        for name, spec in by_name.items():
            data = cb.arrays[name]
            ax = spec.seq_axis
            want = list(spec.shape)
            want[ax] = cb.n_seqs
            if tuple(data.shape) != tuple(want):
                raise WarehouseError(
                    f"run {self.run_id!r} batch {cb.batch}: array {name!r} has shape "
                    f"{tuple(data.shape)}, expected {tuple(want)} {spec.dims}"
                )
            if cb.first_seq % spec.chunks[ax]:
                raise WarehouseError(
                    f"run {self.run_id!r} batch {cb.batch}: first_seq {cb.first_seq} is not on a "
                    f"chunk boundary of {spec.chunks[ax]} seqs"
                )
            index = [slice(None)] * len(spec.shape)
            index[ax] = slice(cb.first_seq, cb.first_seq + cb.n_seqs)
            # the chunks of the codec chains create() makes are encoded and written here (see
            # _write_chunks_direct); any other chain goes through zarr, told that every chunk is
            # real data (no compare-to-fill-value pass; an array's config is fixed when it is
            # opened, so a global config.set around the write would not be seen)
            arr = grp[name]
            files = self._chunk_files(spec, cb.first_seq // spec.chunks[ax])
            if not _write_chunks_direct(files, arr, spec, data, pool):  # zarr encodes it
                arr = arr.with_config({"write_empty_chunks": True})
                arr[tuple(index)] = np.ascontiguousarray(data, dtype=storage_dtype(spec.dtype))
            if on_chunk is not None:
                on_chunk()
            nbytes += data.size * np.dtype(storage_dtype(spec.dtype)).itemsize
            if release:
                del cb.arrays[name], data
        return nbytes

    def sync_batch(self, specs: list[ArraySpec], first_seq: int) -> None:
        """fsync the chunk files of the batch starting at ``first_seq`` (and their directories);
        on object storage every PUT had returned in :meth:`write_batch`: nothing to do."""
        if self.remote:
            return
        _fsync_files([p for spec in specs
                      for p in self._chunk_files(spec, first_seq // spec.chunks[spec.seq_axis])])

    def _chunk_files(self, spec: ArraySpec, seq_chunk: int) -> list[Path]:
        grid = [range(math.ceil(n / c)) for n, c in zip(spec.shape, spec.chunks)]
        grid[spec.seq_axis] = range(seq_chunk, seq_chunk + 1)
        base = self.path / spec.name / "c"
        return [base.joinpath(*map(str, coords)) for coords in itertools.product(*grid)]

    # --- reading -------------------------------------------------------------------------
    def read(self, name: str, index: Any = ...) -> np.ndarray:
        """``array[index]`` as numpy; a chunk failing checksum/decoding, or missing from a
        batch the ledger counts complete -> ArrayCorruptError."""
        arr = self.array(name)
        self.check_written(name, arr, index)
        try:
            return np.asarray(arr[index])
        except Exception as err:
            self._raise_corrupt(arr, name, err)
            raise

    def read_layer(self, name: str, layer: int) -> np.ndarray:
        """One layer's block of a layer-first array, e.g. ``attn_logits[layer]`` ->
        ``(head, seq, query, key)``."""
        arr = self.array(name)
        dims = tuple(arr.metadata.dimension_names or ())
        if not dims or dims[0] != "layer":
            raise WarehouseError(f"array {name!r} of run {self.run_id!r} has no layer axis {dims}")
        if not 0 <= layer < arr.shape[0]:
            raise WarehouseError(
                f"run {self.run_id!r}: layer {layer} out of range for {name!r} (0..{arr.shape[0] - 1})"
            )
        self.check_written(name, arr, layer)
        try:
            return np.asarray(arr[layer])
        except Exception as err:
            self._raise_corrupt(arr, name, err, first_axis=layer)
            raise

    def _chunk_batches(self, step: int) -> dict[int, int]:
        """``{seq chunk index: ledger batch}`` of the batches counted complete, for chunks of
        ``step`` sequences (made once per step)."""
        memo = self.__dict__.setdefault("_chunk_batches_memo", {})
        if step not in memo:
            memo[step] = {k: b for b, first, n in self._written
                          for k in range(first // step, (first + n - 1) // step + 1)}
        return memo[step]

    def check_written(self, name: str, arr, index: Any) -> None:
        """Raise :class:`ArrayCorruptError` naming the first chunk that ``arr[index]`` (of a
        derived array: its inputs) would read from a batch the ledger counts complete and that
        is not on disk: zarr would read it as the fill value (NaN, or token id 0) without a
        word. One stat per chunk; nothing to do without the ledger (a store read alone) or on
        object storage (an absent object is found by ``verify``)."""
        if not self._written or self.remote:
            return
        if isinstance(arr, DerivedLogits):
            index = full_index(index, arr.ndim)
            if index is None:
                return  # the read raises its own IndexError
            for inp in arr.recipe.inputs:  # (layer, head, seq): every head's chunk is one
                self.check_written(inp, self.array(inp), (index[0], slice(None), index[2]))
            return
        dims = tuple(arr.metadata.dimension_names or ())
        if "seq" not in dims or not CachedChunks.wraps(arr):
            return
        index = full_index(index, len(dims))
        if index is None:
            return
        per_axis = []
        for sel, n, c in zip(index, arr.shape, arr.chunks):
            try:  # an int or a slice picks from a range; anything else through numpy
                pos = (range(n)[sel] if isinstance(sel, (int, np.integer, slice))
                       else np.arange(n)[sel])
            except (IndexError, TypeError, ValueError):
                return  # the read raises its own error
            if isinstance(pos, (int, np.integer)):
                per_axis.append([int(pos) // c])
            elif isinstance(pos, range) and pos.step == 1:
                per_axis.append(list(range(pos.start // c, (pos.stop - 1) // c + 1)) if pos
                                else [])
            else:
                per_axis.append(sorted({int(p) // c for p in pos}))
        ax = dims.index("seq")
        batch_of = self._chunk_batches(arr.chunks[ax])
        per_axis[ax] = [k for k in per_axis[ax] if k in batch_of]
        base = f"{self.path}/{name}/c/"
        for coords in itertools.product(*per_axis):
            if not os.path.exists(base + "/".join(map(str, coords))):
                shown = "/".join([self.path.name, name, "c", *map(str, coords)])
                raise ArrayCorruptError(
                    f"run {self.run_id!r}: array {name!r} chunk {coords} ({shown}) is missing, "
                    f"though the ledger counts its batch {batch_of[coords[ax]]} complete; "
                    f"rewrite it with `attnbase extract ... --run {self.run_id} --repair` "
                    f"(`attnbase verify --run {self.run_id}` lists every damaged chunk; or "
                    "re-extract with --overwrite)")

    def _raise_corrupt(self, arr: zarr.Array, name: str, err: Exception,
                       first_axis: int | None = None) -> None:
        """Find the chunk that fails to decode and raise ArrayCorruptError naming it (for a
        derived array: the chunk of the stored input that fails)."""
        from attnbase.warehouse.runs.location import storage_error

        unreachable = storage_error(err, f"reading run {self.run_id!r} from {self.path}")
        if unreachable is not err:  # the object store failed, not a chunk: never "corrupt"
            raise unreachable from err
        if isinstance(err, (IndexError, MissingExtraError)):  # the caller's or the install's
            raise err
        if isinstance(arr, DerivedLogits):
            if isinstance(err, WarehouseError):
                raise err
            for inp in arr.recipe.inputs:  # the stored input whose chunk fails, whichever
                found = self._corrupt_chunk(self.array(inp), inp, first_axis)
                if found is not None:
                    raise found from err
        else:
            found = self._corrupt_chunk(arr, name, first_axis)
            if found is not None:
                raise found from err
        # not a chunk-local failure: report it against the array
        raise ArrayCorruptError(
            f"run {self.run_id!r}: array {name!r} cannot be read ({err}); re-extract the run with "
            f"`attnbase extract ... --run {self.run_id} --overwrite`"
        ) from err

    def _corrupt_chunk(self, arr: zarr.Array, name: str,
                       first_axis: int | None) -> ArrayCorruptError | None:
        """The error naming the first chunk of ``arr`` (of layer ``first_axis`` only, if given)
        that fails to decode; None when every one decodes."""
        grid = [range(math.ceil(n / c)) for n, c in zip(arr.shape, arr.chunks)]
        if first_axis is not None:
            c0 = first_axis // arr.chunks[0]
            grid[0] = range(c0, c0 + 1)
        for coords in itertools.product(*grid):
            sel = tuple(slice(i * c, min((i + 1) * c, n))
                        for i, c, n in zip(coords, arr.chunks, arr.shape))
            try:
                arr[sel]
            except Exception as chunk_err:
                path = self.path / name / "c" / "/".join(map(str, coords))
                return ArrayCorruptError(_corrupt_message(self.run_id, name, coords, path,
                                                          chunk_err))
        return None

    def nbytes_stored(self) -> int:
        if self.remote:
            return sum(self.path.files().values())
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())


def _chunk_encoder(arr: zarr.Array) -> Callable[[np.ndarray], list] | None:
    """``block -> [buffers]`` of one chunk's file for the codec chains :meth:`RunStore.create`
    makes -- ``bytes`` (little-endian, native here), optionally ``zstd``, then ``crc32c`` of what
    precedes it -- or None for any other chain. The bytes are exactly zarr's (a test compares
    the files); what is skipped is zarr's per-chunk machinery, which costs more CPU than the checksum and
    the write together (benchmarks/RESULTS.md: "chunk encoder")."""
    import sys

    import google_crc32c
    from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

    codecs = tuple(arr.metadata.codecs)
    if (sys.byteorder != "little" or len(codecs) not in (2, 3)
            or not isinstance(codecs[0], BytesCodec) or not isinstance(codecs[-1], Crc32cCodec)
            or (codecs[0].endian is not None and codecs[0].endian.value != "little")
            or not arr.dtype.isnative):
        return None
    zstd = None
    if len(codecs) == 3:
        if not isinstance(codecs[1], ZstdCodec):
            return None
        from numcodecs.zstd import Zstd

        zstd = Zstd(level=codecs[1].level, checksum=codecs[1].checksum)

    def encode(block: np.ndarray) -> list:
        body = block.reshape(-1).view(np.uint8) if zstd is None else zstd.encode(block)
        return [body, np.uint32(google_crc32c.value(body)).tobytes()]

    return encode


def _write_chunks_direct(files: list[Path], arr: zarr.Array, spec: ArraySpec,
                         data: np.ndarray, pool) -> bool:
    """Encode one batch of ``arr`` and write its chunks to ``files`` (the batch's chunk files,
    one per layer, :meth:`RunStore._chunk_files`) in the threads of ``pool`` (a local disk:
    :data:`CHUNK_THREADS` or the caller's count; object storage: :data:`REMOTE_PUTS`), each to a
    temporary file renamed into place (as zarr's local store does), or on object storage
    (``files`` are :class:`Remote`) as one PUT of the same bytes. False (nothing written) when
    :func:`_chunk_encoder` does not know the array's codecs or the chunks are not the store's
    layout (one layer x one batch x every other axis whole)."""
    layered = spec.dims[0] == "layer"
    whole = all(c == n for i, (c, n) in enumerate(zip(spec.chunks, spec.shape))
                if i != spec.seq_axis and not (layered and i == 0))
    keys = arr.metadata.chunk_key_encoding  # the "c/i/j/..." paths _chunk_files spells out
    ours = (whole and (not layered or spec.chunks[0] == 1) and keys.name == "default"
            and getattr(keys, "separator", None) == "/")
    encode = _chunk_encoder(arr) if ours else None
    if encode is None:
        return False
    data = np.ascontiguousarray(data, dtype=storage_dtype(spec.dtype))
    blocks = list(data) if layered else [data]
    if len(blocks) != len(files):
        raise WarehouseError(f"run store {spec.name!r}: {len(blocks)} chunks for {len(files)} files")
    ax = spec.seq_axis - (1 if layered else 0)  # the seq axis of one chunk
    full = spec.chunks[spec.seq_axis]

    def put(block: np.ndarray, path: Path) -> None:
        if block.shape[ax] < full:  # the last batch of a run: the edge chunk is padded
            pad = [(0, 0)] * block.ndim
            pad[ax] = (0, full - block.shape[ax])
            block = np.pad(block, pad, constant_values=arr.metadata.fill_value)
        if isinstance(path, Remote):
            path.put(encode(block))
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
        try:
            with open(tmp, "wb") as f:
                for part in encode(block):
                    f.write(part)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    list(pool.map(put, blocks, files))
    return True


def _fsync_files(paths: list[Path]) -> None:
    """fsync every file, then their directories (the renames). Issued from a thread pool: the
    calls release the GIL and the disk merges concurrent flushes (benchmarks/RESULTS.md: "fsync
    from a thread pool")."""
    from concurrent.futures import ThreadPoolExecutor

    def sync(p: Path) -> Path | None:
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:  # a chunk equal to the fill value is not written by zarr
            return None
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return p.parent

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(paths))),
                            thread_name_prefix="attnbase-fsync") as pool:
        dirs = {d for d in pool.map(sync, paths) if d is not None}
        list(pool.map(sync, sorted(dirs)))  # make the renames durable too
