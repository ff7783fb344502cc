"""Capture attention activations during one ordinary forward pass per batch.

:func:`capture_batches` runs the model over token windows in batches; each forward runs inside a
:class:`~attnbase.extract.recorder.Recorder`, which the registered attention function
(:mod:`attnbase.extract.attention_call`) and the key-projection hooks feed layer by layer. This
module checks what came back (every layer captured, every value finite), casts to the stored
dtype, and yields one :class:`~attnbase.contract.CapturedBatch` per batch with its row and column
statistics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from attnbase import faults
from attnbase.contract import (
    CAPTURE_CHOICES, CapturedBatch, logits_mode, stored_capture, stored_float_dtype,
)
from attnbase.errors import ExtractError
from attnbase.extract.attention_call import CAPTURE_ATTN, ensure_registered
from attnbase.extract.batchstats import host_columns
from attnbase.extract.buffers import Buffers, Fresh
from attnbase.extract.recorder import Recorder, check_finite_stack
from attnbase.private_api import read

#: dtype name -> torch dtype (models.py loads models with the same map)
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _host(t: torch.Tensor) -> np.ndarray:
    """A captured array as numpy; bfloat16 (no numpy dtype) as its raw bits, ``uint16``
    (contract.STORAGE_DTYPES: the store keeps the bits and reads them back as float32)."""
    t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _validate_capture(capture: Iterable[str]) -> set[str]:
    want = set(capture)
    bad = sorted(want - set(CAPTURE_CHOICES))
    if bad:
        raise ExtractError(f"unknown capture name(s) {', '.join(bad)}; choose from {', '.join(CAPTURE_CHOICES)}")
    return want


def _index_columns(shape: tuple[int, ...], names: tuple[str, ...], seq_axis: int, first_seq: int) -> dict:
    idx = np.indices(shape, dtype=np.int32).reshape(len(shape), -1)
    cols = {n: idx[i] for i, n in enumerate(names)}
    cols[names[seq_axis]] = cols[names[seq_axis]] + np.int32(first_seq)
    return cols


def capture_batches(
    lm, tokens: np.ndarray, batch_size: int, capture: Iterable[str], start_batch: int = 0,
    reuse_buffers: bool | int = False, store_dtype: str | None = None,
    pixels: np.ndarray | None = None,
) -> Iterator[CapturedBatch]:
    """Run ``lm`` over ``tokens`` ``[seq, pos]`` in batches and yield one :class:`CapturedBatch` each.

    Batch ``b`` covers sequences ``b*batch_size .. (b+1)*batch_size - 1``; iteration starts at
    ``start_batch`` (resume). ``capture`` selects arrays (:data:`CAPTURE_CHOICES`); ``tokens`` is
    always included and row/col stats are always computed. Array shapes per batch of B sequences:
    ``tokens [B, pos]``, ``keys``/``keys_rot [layer, kv_head, B, pos, d_head]``, ``queries [layer,
    head, B, pos, d_head]``, ``attn_logits [layer, head, B, query, key]`` (masked = -inf),
    ``hidden [layer+1, B, pos, d_model]`` (layer 0 = embeddings).

    Without ``logits`` in ``capture``, ``attn_logits`` are still stored where the run will hold
    them (:func:`attnbase.contract.logits_mode`: queries and keys captured, logits not
    derivable); where they are derived, the batch carries none and every attention call is
    checked against the model's logits recipe (scale, mask rule), so a derived run reads back
    what was captured.

    ``store_dtype``: the dtype of the float arrays (``float32 | float16 | bfloat16``; default
    :func:`attnbase.contract.stored_float_dtype` of the model's); bfloat16 arrays come as their
    raw bits (``uint16``). Row statistics are always taken from the float32 (or the model's)
    logits before any cast.

    ``pixels``: an image model's windows ``(seq, channel, height, width)`` (extract/vision.py),
    fed as ``pixel_values``; ``tokens`` then holds the position indices the run stores.

    ``reuse_buffers``: every batch's arrays are written into the same buffers, so a yielded
    batch's ``arrays`` are valid only until the next batch is requested; for a consumer that
    writes each batch out before asking for the next (the runner), not for one that collects
    them. An int ``n`` > 1 keeps ``n`` sets used in turn: a batch's arrays stay valid while the
    next ``n - 1`` are captured (a writer staging in the background).

    On a GPU the captures go into pinned host buffers by asynchronous copies on a side stream
    as each layer runs, the row statistics of every layer are computed on the device with no
    host read (:class:`~attnbase.extract.batchstats.BatchStats`) and copied back with the
    hidden states in the same stream, and the batch waits for one event; the NaN check reads
    the host copy.
    """
    want = _validate_capture(capture)
    ensure_registered()
    if batch_size < 1:
        raise ExtractError(f"batch_size must be >= 1, got {batch_size}")
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ExtractError(f"tokens must be [seq, pos], got shape {tokens.shape}")
    model = lm.model
    impl = read(model.config, "transformers.PretrainedConfig._attn_implementation")
    if impl != CAPTURE_ATTN:
        raise ExtractError(
            f"model runs attn_implementation={impl!r}, not {CAPTURE_ATTN!r}; load it with "
            "attnbase.extract.load_model() or call model.set_attn_implementation()"
        )
    param_dtype = next(model.parameters()).dtype
    dtype_name = str(param_dtype).removeprefix("torch.")
    out_torch = TORCH_DTYPES[stored_float_dtype(dtype_name, store_dtype)]
    mode = logits_mode(lm.info, want, dtype_name, store_dtype)
    want = set(stored_capture(lm.info, want, dtype_name, store_dtype))
    recipe = lm.info.logits_recipe if mode == "derived" else None
    n_batches = math.ceil(len(tokens) / batch_size)
    if pixels is not None and len(pixels) != len(tokens):
        raise ExtractError(f"pixels hold {len(pixels)} images for {len(tokens)} windows")
    bufs = Buffers(slots=int(reuse_buffers)) if reuse_buffers else Fresh()
    for b in range(start_batch, n_batches):
        first = b * batch_size
        tok = tokens[first : first + batch_size]
        faults.point("batch_start")
        px = None if pixels is None else pixels[first : first + batch_size]
        cb = _capture_one(lm, tok, b, first, want, out_torch, bufs, recipe, px)
        faults.point("after_forward")
        yield cb
        bufs.next_batch()


def _capture_one(lm, tok: np.ndarray, batch: int, first_seq: int, want: set[str],
                 out_torch: torch.dtype, bufs: Buffers | Fresh = Fresh(),
                 recipe=None, pixels: np.ndarray | None = None) -> CapturedBatch:
    n_layers = lm.info.n_layers
    if pixels is None:
        # no KV cache: nothing reads it, and building one costs a copy of every layer's k, v
        inputs = {"input_ids": torch.as_tensor(tok.astype(np.int64), device=lm.device),
                  "use_cache": False}
    else:  # an image model (extract/vision.py): the windows' pixels, in the model's dtype
        inputs = {"pixel_values": torch.as_tensor(pixels, device=lm.device).to(
            next(lm.model.parameters()).dtype)}
    # float32 -> float32 and float16 -> float16 are plain copies; bfloat16 -> float32 is exact;
    # what --store-dtype rounds (float32 -> float16 / bfloat16) is rounded here, after the
    # row statistics were taken from the float32 logits
    with torch.inference_mode(), Recorder(lm, want, bufs, out_torch, recipe) as rec:
        out = lm.model(**inputs, output_hidden_states="hidden" in want)
        # the torch path: every layer's statistics, in one copy (asynchronous on a GPU)
        host_stats = rec.stats_to_host()
        hidden = _stacked_hidden(out, bufs, out_torch, rec) if "hidden" in want else None
        del out
    rec.wait_copies()  # the one event a GPU batch waits for before its arrays are staged
    if host_stats is not None:
        rows_np, recv_np = host_columns(*host_stats)
        rec.check_host_stats(rows_np["max_prob"])
    arrays: dict[str, np.ndarray] = {"tokens": tok.astype(np.int32)}

    def checked(name: str, label: str) -> torch.Tensor:
        missing = rec.missing(name)
        if missing:
            raise ExtractError(f"no {label} were captured for layer(s) {missing}; the family adapter "
                               f"{lm.adapter.name!r} does not match the model")
        t = rec.out[name]
        check_finite_stack(label, t)
        return t

    if "keys" in want:
        arrays["keys"] = _host(checked("keys", "keys"))
        if lm.adapter.rotary:
            arrays["keys_rot"] = _host(checked("keys_rot", "keys_rot"))
    if "queries" in want:
        arrays["queries"] = _host(checked("queries", "queries"))
    if hidden is not None:
        check_finite_stack("hidden", hidden)
        arrays["hidden"] = _host(hidden)
    if "logits" in want:
        arrays["attn_logits"] = _host(rec.out["attn_logits"])

    if host_stats is not None:
        _, n_heads, n_seqs, n_q = host_stats[0].shape[1:]
        n_k = host_stats[1].shape[-1]
    else:
        missing = [l for l in range(n_layers) if l not in rec.rows]
        if missing:
            raise ExtractError(f"no attention logits captured for layer(s) {missing}; the model "
                               f"did not call the {CAPTURE_ATTN!r} attention function")
        rows = [rec.rows[l] for l in range(n_layers)]  # [head, batch, query] each
        recv = [rec.recv[l] for l in range(n_layers)]  # [head, batch, key] each
        n_heads, n_seqs, n_q = rows[0]["n_keys"].shape
        n_k = recv[0].shape[-1]
        rows_np = {}
        for name in rows[0]:
            v = torch.stack([r[name] for r in rows]).reshape(-1).cpu().numpy()
            rows_np[name] = v.astype(np.int32) if v.dtype == np.int64 else v
        recv_np = torch.stack(recv).reshape(-1).cpu().numpy()
    row_stats = _index_columns((n_layers, n_heads, n_seqs, n_q), ("layer", "head", "seq", "query"), 2, first_seq)
    row_stats.update(rows_np)
    col_stats = _index_columns((n_layers, n_heads, n_seqs, n_k), ("layer", "head", "seq", "key"), 2, first_seq)
    col_stats["received"] = recv_np
    return CapturedBatch(batch=batch, first_seq=first_seq, n_seqs=n_seqs, arrays=arrays,
                         row_stats=row_stats, col_stats=col_stats)


def _stacked_hidden(out, bufs: Buffers | Fresh, out_torch: torch.dtype,
                    rec: Recorder) -> torch.Tensor:
    """The hidden states ``[layer + 1, batch, pos, d_model]`` in the stored dtype, on the host
    (on a GPU: stacked there, then one asynchronous copy, valid after ``rec.wait_copies()``)."""
    hs = list(out.hidden_states)
    if hs[0].is_cuda:
        return rec.put_stacked("hidden", torch.stack(hs).to(out_torch))
    h = bufs.get("hidden", (len(hs), *hs[0].shape), out_torch, hs[0].device)
    if hs[0].dtype == out_torch:
        torch.stack(hs, out=h)
    else:  # a cast (bfloat16 -> float32)
        h.copy_(torch.stack(hs))
    return h
