"""The recorder of one capture's forward: what the attention function and the key hooks hand
it is copied into the batch's output arrays, layer by layer, with the row statistics.

A :class:`Recorder` is the context (:data:`attnbase.extract.attention_call.active`) of one
forward: it installs forward hooks on each block's key projection (the adapter's
``key_source``) for pre-RoPE keys, receives each attention call's queries, rotated keys and
logits (:meth:`Recorder.on_attention`), checks a derived-logits run's recipe against every call,
and computes each layer's row and column statistics (the compiled kernel on the CPU, or every
layer on the device: :func:`stats_backend`). The non-finite checks name the capture and layer.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from attnbase.contract import DEFAULT_SINK
from attnbase.errors import ExtractError, NonFiniteActivationError
from attnbase.extract import rowkernel
from attnbase.extract.attention_call import CAPTURE_ATTN, active, mask_terms
from attnbase.extract.batchstats import BatchStats
from attnbase.extract.buffers import Buffers, Fresh
from attnbase.extract.rowstats import row_col_stats_set
from attnbase.extract.threads import kept
from attnbase.logits import blocked_mask

#: ``ATTNBASE_ROWSTATS=torch`` computes row/col statistics with the torch reference path.
ROWSTATS_ENV = "ATTNBASE_ROWSTATS"


class Recorder:
    """Per-forward capture: the attention function and the key hooks copy each layer's tensors
    into its slot of the batch's output arrays (``[layer, head, batch, ...]``) as the layer runs.

    Nothing per layer is held past its layer: the fused projection outputs that queries and
    keys are views of, and the layer's logits, are freed as in a bare forward, so the batch's
    memory is its output arrays plus one layer's working set, and no stacking pass follows."""

    def __init__(self, lm, want: set[str], bufs: "Buffers | Fresh", dtype: torch.dtype,
                 recipe=None):
        self.lm = lm
        self.want = want
        self.bufs = bufs
        self.dtype = dtype
        #: the LogitsRecipe a derived-logits run relies on: checked against every attention call
        self.recipe = recipe
        self._rules_checked: set[tuple] = set()
        self._stream = None  # the side stream of device -> host copies (CUDA only)
        #: the torch path (a GPU, or ``ATTNBASE_ROWSTATS=torch``): every layer's statistics on
        #: the logits' device, read back once per batch (:meth:`stats_to_host`)
        #: a sink set other than key 0 (vision families) takes the two-pass reference path
        #: (:func:`attnbase.extract.rowstats.row_col_stats_set`) per layer
        self.sink = (None if tuple(lm.info.sink_positions) == DEFAULT_SINK
                     else tuple(lm.info.sink_positions))
        self.batch_stats = (BatchStats(lm.info.n_layers)
                            if stats_backend(lm.device) == "torch" and self.sink is None else None)
        #: the numba path, per layer: row statistics [head, batch, query], received [head, batch, key]
        self.rows: dict[int, dict[str, torch.Tensor]] = {}
        self.recv: dict[int, torch.Tensor] = {}
        self.layer_of: dict[int, int] = {}
        self.out: dict[str, torch.Tensor] = {}
        self.seen: dict[str, set[int]] = {}
        self.handles: list[Any] = []
        self._masks: dict[tuple, tuple[Any, tuple]] = {}
        #: the generic capture: the layer whose attention module runs, and its rotary call
        self.generic = bool(getattr(lm.adapter, "generic", False))
        self.current: int | None = None
        self.rope: dict[int, tuple] = {}

    def put(self, name: str, layer: int, t: torch.Tensor) -> None:
        """Copy layer ``layer``'s ``t`` into array ``name`` (allocated at its first layer, on
        ``t``'s device, in the stored dtype: a bfloat16 -> float32 copy is exact)."""
        buf = self.out.get(name)
        if buf is None:
            # on a GPU: pinned host memory, filled by asynchronous copies on a side stream while
            # the forward goes on (one synchronisation per batch, :meth:`wait_copies`)
            where = "cpu" if t.is_cuda else t.device
            buf = self.bufs.get(name, (self.lm.info.n_layers, *t.shape), self.dtype, where,
                                pin=t.is_cuda)
            self.out[name] = buf
            self.seen[name] = set()
        if t.is_cuda:
            self._copy_async(buf[layer], t)
        else:
            buf[layer].copy_(t)
        self.seen[name].add(layer)

    def _copy_async(self, dst: torch.Tensor, t: torch.Tensor) -> None:
        """``dst.copy_(t)`` from the device into pinned ``dst`` on the side stream, after what
        the current stream has queued (valid after :meth:`wait_copies`)."""
        side = self._side_stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side):
            dst.copy_(t, non_blocking=True)
        t.record_stream(side)  # the allocator keeps t until the copy has read it

    def put_stacked(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A whole stacked array (``hidden``) on the host: on a GPU copied asynchronously into
        a pinned buffer (valid after :meth:`wait_copies`), on the CPU ``t`` itself."""
        if not t.is_cuda:
            return t
        buf = self.bufs.get(name, tuple(t.shape), self.dtype, "cpu", pin=True)
        self._copy_async(buf, t)
        return buf

    def _side_stream(self, device):
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        return self._stream

    def wait_copies(self) -> None:
        """Wait for the device -> host copies of this forward (a no-op on the CPU)."""
        if self._stream is not None:
            self._stream.synchronize()

    def missing(self, name: str) -> list[int]:
        seen = self.seen.get(name, set())
        return [l for l in range(self.lm.info.n_layers) if l not in seen]

    def mask_terms(self, attention_mask, key, query):
        """:func:`~attnbase.extract.attention_call.mask_terms` of each mask object of this forward
        (one, or Gemma-3's sliding and global pair), computed at the first layer that uses it;
        the mask is held so its ``id`` cannot be reused within the forward."""
        if attention_mask is None:
            return None
        sig = (id(attention_mask), key.shape[-2], query.dtype)
        if sig not in self._masks:
            self._masks[sig] = (attention_mask,
                                mask_terms(attention_mask, key.shape[-2], query.dtype))
        return self._masks[sig][1]

    def __enter__(self) -> Recorder:
        model, adapter = self.lm.model, self.lm.adapter
        if self.generic:
            adapter.install(active)
        for layer in range(self.lm.info.n_layers):
            attn = adapter.attention_module(model, layer)
            self.layer_of[id(attn)] = layer
            if self.generic:
                self.handles.append(attn.register_forward_pre_hook(self._enter_layer(layer)))
            elif hasattr(adapter, "observe"):  # attention outside the interface (BLOOM, Falcon)
                self.handles.extend(adapter.observe(self, layer))
            if not self.generic and adapter.key_source and "keys" in self.want:
                mod = adapter.key_module(model, layer)
                self.handles.append(mod.register_forward_hook(self._key_hook(layer)))
        self.token = active.set(self)
        return self

    def __exit__(self, *exc) -> None:
        active.reset(self.token)
        for h in self.handles:
            h.remove()

    def _enter_layer(self, layer: int):
        def hook(_mod, _args):
            if active.get() is self:
                self.current = layer
                self.rope.pop(layer, None)

        return hook

    def on_rope(self, k_in: torch.Tensor, out) -> None:
        """The generic capture's ``apply_rotary_pos_emb`` call inside the current layer."""
        if self.current is not None:
            self.rope[self.current] = (k_in, out)

    def _key_hook(self, layer: int):
        def hook(_mod, _inp, out):
            if active.get() is not self:  # another thread's forward through a shared model
                return
            k = self.lm.adapter.split_keys(out, self.lm.model.config)  # [batch, pos, kv_head, d_head]
            self.put("keys", layer, k.permute(2, 0, 1, 3))

        return hook

    def on_attention(self, module, query, key, logits: torch.Tensor, scaling, terms,
                     softcap: float | None = None) -> None:
        layer = self.layer_of.get(id(module))
        if layer is None:
            raise ExtractError(
                f"attention call from unregistered module {type(module).__name__}; the "
                f"{self.lm.adapter.name!r} adapter's attention path {self.lm.adapter.attention!r} is wrong"
            )
        if self.recipe is not None:
            self._check_recipe(layer, query, logits, scaling, terms, softcap)
        if self.generic:
            self.lm.adapter.check_shapes(layer, query, key)
            if "keys" in self.want:  # [kv_head, batch, pos, d_head]
                pre = self.lm.adapter.pre_rope_keys(layer, module, key, self.rope.pop(layer, None))
                self.put("keys", layer, pre.transpose(0, 1))
        if "queries" in self.want:
            self.put("queries", layer, query.transpose(0, 1))  # [head, batch, pos, d_head]
        if "keys" in self.want and self.lm.adapter.rotary:
            self.put("keys_rot", layer, key.transpose(0, 1))
        if "logits" in self.want:
            # [head, batch, query, key]: the stored layout
            self.put("attn_logits", layer, logits.transpose(0, 1))
        # row statistics of this layer now, from the logits the softmax sees (each row alone:
        # the [batch, head] order of the leading axes changes no value); nothing of the layer's
        # logits outlives the layer unless they are stored
        if self.batch_stats is not None:  # on the device, no host read (checked after the batch)
            self.batch_stats.add(layer, logits)
            return
        if self.sink is None:
            r, c = _row_col_stats(logits)
        else:
            r, c = row_col_stats_set(logits.detach(), self.sink)
            r, c = {k: v.cpu() for k, v in r.items()}, c.cpu()
        # a NaN or +inf logit makes its row's max_prob NaN; only then scan the logits (a fully
        # masked row is NaN too and passes the scan, as before)
        if bool(torch.isnan(r["max_prob"]).any()):
            self.check_layer(layer, logits)
        self.rows[layer] = {k: v.transpose(0, 1) for k, v in r.items()}
        self.recv[layer] = c.transpose(0, 1)

    def check_layer(self, layer: int, logits: torch.Tensor | None) -> None:
        """A layer with a NaN row statistic: name the non-finite capture (keys, queries, then
        the logits where they are still at hand)."""
        for name in ("keys", "keys_rot", "queries"):  # name the cause where it was captured
            if name in self.out:
                check_finite(name, layer, self.out[name][layer])
        if logits is not None:
            check_finite("attn_logits", layer, logits, allow_neg_inf=True)

    def stats_to_host(self) -> tuple[dict, np.ndarray] | None:
        """The torch path's ``(row_stats, received)`` columns of every layer, read back in one
        copy (on a GPU: enqueued on the side stream, so they are valid after
        :meth:`wait_copies`); None on the numba path."""
        if self.batch_stats is None:
            return None
        missing = [l for l in range(self.lm.info.n_layers) if l not in self.batch_stats.seen]
        if missing:
            raise ExtractError(f"no attention logits captured for layer(s) {missing}; the model "
                               f"did not call the {CAPTURE_ATTN!r} attention function")
        return self.batch_stats.to_host(self._side_stream(self.batch_stats.rows.device)
                                        if self.batch_stats.rows.is_cuda else None)

    def check_host_stats(self, max_prob: np.ndarray) -> None:
        """The torch path's non-finite test, on the host copy: a NaN ``max_prob`` (``[layer,
        ...]``) names the first such layer's non-finite capture."""
        flat = max_prob.reshape(self.lm.info.n_layers, -1)
        if not np.isnan(flat).any():
            return
        layer = int(np.isnan(flat).any(-1).argmax())
        self.check_layer(layer, None)
        raise NonFiniteActivationError(
            f"non-finite values in attn_logits at layer {layer}; try --dtype float32 "
            "or check the model weights")

    def _check_recipe(self, layer: int, query, logits, scaling, terms, softcap=None) -> None:
        """A derived-logits run stores no logits: its recipe must be what this call computed
        (scale, soft-cap and mask rule), else the reader would form other values. The mask is
        checked once per mask object and layer rule."""
        r = self.recipe
        scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
        if scale != r.scale[layer]:
            raise ExtractError(
                f"layer {layer} scales its logits by {scale!r}, not {r.scale[layer]!r} as the "
                f"{self.lm.adapter.name!r} adapter's logits recipe says; store them with "
                "--capture ...,logits")
        cap = None if softcap is None else float(softcap)
        if cap != r.softcap_of(layer):
            raise ExtractError(
                f"layer {layer} soft-caps its logits at {cap!r}, not {r.softcap_of(layer)!r} as "
                f"the {self.lm.adapter.name!r} logits recipe says; store them with "
                "--capture ...,logits")
        n_q, n_k = logits.shape[-2:]
        key = (id(terms[1]) if terms is not None else None, n_q, n_k, r.window[layer])
        if key in self._rules_checked:
            return
        want = torch.from_numpy(blocked_mask(n_q, n_k, causal=r.causal, window=r.window[layer]))
        got = (terms[1] if terms is not None else torch.zeros((n_q, n_k), dtype=torch.bool))
        if not bool((got.to(want.device) == want).all()):
            raise ExtractError(
                f"layer {layer}: the model's attention mask is not the rule its logits recipe "
                f"declares (causal={r.causal}, window={r.window[layer]}); store the logits with "
                "--capture ...,logits")
        self._rules_checked.add(key)


def _all_finite(t: torch.Tensor) -> bool:
    """Cheap sufficient test: a finite sum means every entry is finite (NaN and +-inf propagate).

    An overflowing sum of finite entries reads as "maybe not": callers then run the exact check.
    """
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    return bool(torch.isfinite(t.sum(dtype=acc)))


def check_finite_stack(name: str, stacked: torch.Tensor) -> None:
    """:func:`check_finite` on every layer of ``stacked`` ``[layer, ...]``, paid only when its
    sum is not finite."""
    if not _all_finite(stacked):
        for l, t in enumerate(stacked):
            check_finite(name, l, t)


def check_finite(name: str, layer: int | None, t: torch.Tensor, *, allow_neg_inf: bool = False) -> None:
    bad = torch.isnan(t) if allow_neg_inf else ~torch.isfinite(t)
    if allow_neg_inf:
        bad = bad | torch.isposinf(t)
    if bool(bad.any()):
        where = f"layer {layer}" if layer is not None else "all layers"
        raise NonFiniteActivationError(
            f"non-finite values in {name} at {where} ({int(bad.sum())} entries); try --dtype float32 "
            "or check the model weights"
        )


def stats_backend(device: str) -> str:
    """Which path computes the row statistics on ``device``: ``numba`` (the compiled one-pass
    kernel, CPU) or ``torch`` (the reference path: on a GPU, where it stays on the device, or
    forced with ``ATTNBASE_ROWSTATS=torch``). Recorded in every run's config."""
    if str(device).startswith("cpu") and os.environ.get(ROWSTATS_ENV) != "torch":
        return "numba"
    return "torch"


def _row_col_stats(z: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Row/col statistics of one layer's logits ``[batch, head, query, key]`` (any leading axes:
    each row is computed alone) by the compiled one-pass kernel
    (:mod:`attnbase.extract.rowkernel`), the CPU's path; the torch path is
    :class:`~attnbase.extract.batchstats.BatchStats` (same formulas, every layer on the device)."""
    with kept():  # numba's OpenMP launch would leave the thread its own thread count
        r, c = rowkernel.row_col_stats_np(z.detach().to(torch.float32).numpy())
    return {k: torch.from_numpy(v) for k, v in r.items()}, torch.from_numpy(c)
