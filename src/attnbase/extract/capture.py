"""Capture attention activations during one ordinary forward pass.

Two mechanisms, both on the model's real modules:

- a custom attention function registered with ``transformers.AttentionInterface`` under
  :data:`CAPTURE_ATTN` (plus the eager mask function under the same name in
  ``AttentionMaskInterface`` -- without it transformers passes ``attention_mask=None`` and the model
  silently runs non-causal). HF calls it as ``fn(module, query, key, value, attention_mask,
  scaling=..., dropout=..., **kwargs)`` with ``query [batch, head, pos, d_head]`` and ``key``
  ``[batch, kv_head, pos, d_head]`` after RoPE. It records queries, rotated keys and the scaled
  logits, then returns exactly what the family's own ``eager_attention_forward`` returns, so the
  model's outputs are those of eager attention. For the families whose eager function is known
  (:data:`_EAGER_SOFTMAX_FP32`) the output is computed from the recorded logits with the same
  operations as that function (softmax in its dtype, ``@ value``, transpose), so ``Q K^T`` is
  computed once; masked entries are ``-inf`` instead of eager's ``finfo.min`` added, which softmax
  maps to the same exact zeros. Any other modeling file, or a row with every key masked, runs the
  family's own eager function.
- forward hooks on each block's key projection (the adapter's ``key_source``) for pre-RoPE keys.

Registration happens lazily (:func:`ensure_registered`), never at import.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import math
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from attnbase import faults
from attnbase.errors import ExtractError, NonFiniteActivationError
from attnbase.extract import rowkernel
from attnbase.extract.batchstats import BatchStats, host_columns
from attnbase.extract.buffers import Buffers, Fresh
from attnbase.contract import (
    CAPTURE_CHOICES, DEFAULT_SINK, CapturedBatch, logits_mode, stored_capture, stored_float_dtype,
)
from attnbase.extract.rowstats import row_col_stats_set
from attnbase.logits import blocked_mask, scaled_scores

#: ``ATTNBASE_ROWSTATS=torch`` computes row/col statistics with the torch reference path.
ROWSTATS_ENV = "ATTNBASE_ROWSTATS"

#: The ``attn_implementation`` name under which the capture function is registered.
CAPTURE_ATTN = "attnbase_capture"

_registered = False
_active: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar("attnbase_recorder", default=None)


def ensure_registered() -> str:
    """Register the capture attention + mask functions with transformers (idempotent)."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask

        AttentionInterface.register(CAPTURE_ATTN, capture_attention_forward)
        AttentionMaskInterface.register(CAPTURE_ATTN, eager_mask)
        _registered = True
    return CAPTURE_ATTN


def _family_eager(module: torch.nn.Module):
    """The ``eager_attention_forward`` of the modeling file that defines ``module``'s class."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return fn if fn is not None else _eager_reference


def _eager_reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    # Used only when a modeling file has no eager function of its own (llama's semantics).
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    w = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        w = w + attention_mask[..., : key.shape[-2]]
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    w = torch.nn.functional.dropout(w, p=dropout, training=module.training)
    return torch.matmul(w, value).transpose(1, 2).contiguous(), w


#: Modeling files whose ``eager_attention_forward`` is ``softmax(q k^T * scaling + mask) @ v``
#: (``repeat_kv`` for GQA), transposed to ``[batch, pos, head, d_head]``: True where the softmax
#: runs in float32 and is cast to the query dtype (llama, gpt_neox), False where it runs in the
#: logits' dtype and is cast to the value dtype (gpt2, bert). The capture computes their output
#: itself from the logits it records.
_EAGER_SOFTMAX_FP32 = {
    "transformers.models.gpt2.modeling_gpt2": False,
    "transformers.models.bert.modeling_bert": False,
    "transformers.models.gpt_neox.modeling_gpt_neox": True,
    "transformers.models.llama.modeling_llama": True,
    "transformers.models.gemma3.modeling_gemma3": True,  # no softcap passed by Gemma3Attention
    __name__: True,  # _eager_reference
}


def _mask_terms(attention_mask, n_keys: int, dtype) -> tuple[torch.Tensor | None, torch.Tensor, bool]:
    """``(additive, blocked, some_row_fully_blocked)`` of one attention mask: ``additive`` is
    the mask with blocked entries ``-inf`` (so one add masks the logits), or for an sdpa-style
    boolean mask (True = attend) None, applied with ``masked_fill``. Computed once per forward
    (every layer sees the same mask object)."""
    mask = attention_mask[..., :n_keys]
    if mask.dtype == torch.bool:
        blocked = ~mask
        return None, blocked, bool(blocked.all(-1).any())
    blocked = mask <= torch.finfo(mask.dtype).min / 2  # eager_mask writes finfo.min for blocked
    additive = mask.masked_fill(blocked, -math.inf).to(dtype)
    return additive, blocked, bool(blocked.all(-1).any())


def _masked_logits(query, key, attention_mask, scaling, terms=None,
                   softcap: float | None = None, alibi=None) -> tuple[torch.Tensor, bool]:
    """Scaled (soft-capped), masked logits and whether some row has every key blocked.

    ``terms`` are :func:`_mask_terms` of ``attention_mask`` when the caller caches them."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    # the formula derived logits reuse
    z = scaled_scores(query, key, scaling, head_axis=1, softcap=softcap, alibi=alibi)
    if attention_mask is None:
        return z, False
    additive, blocked, full = terms or _mask_terms(attention_mask, key.shape[-2], z.dtype)
    if additive is None:
        return z.masked_fill_(blocked, -math.inf), full
    # z + m where the mask allows (as eager adds it), -inf where it blocks: one in-place add
    return z.add_(additive), full


_HALF = (torch.float16, torch.bfloat16)

#: attention-function keyword arguments that change no logit (read by flash kernels, caches or
#: the output); ``softcap`` is applied to the logits; any other one stops a capture
_NEUTRAL_KWARGS = frozenset({
    "sliding_window", "position_ids", "output_attentions", "use_cache", "cache_position",
    "is_causal", "layer_idx", "past_key_values", "past_key_value", "deterministic",
    "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "head_mask",
    "position_embeddings", "return_dict", "output_hidden_states", "token_type_ids"})


def _eager_semantics(eager) -> bool | None:
    """:data:`_EAGER_SOFTMAX_FP32` of ``eager``: by its module, or by a source text equal to a
    known function's (most modeling files copy llama's); None where it is not known."""
    mod = getattr(eager, "__module__", None)
    if mod in _EAGER_SOFTMAX_FP32:
        return _EAGER_SOFTMAX_FP32[mod]
    try:
        return _eager_by_source()[inspect.getsource(eager)]
    except (KeyError, OSError, TypeError):
        return None


@functools.lru_cache(maxsize=1)
def _eager_by_source() -> dict[str, bool]:
    out = {}
    for mod, fp32 in _EAGER_SOFTMAX_FP32.items():
        fn = getattr(sys.modules.get(mod) or _import(mod), "eager_attention_forward", None)
        if fn is not None and mod != __name__:
            out[inspect.getsource(fn)] = fp32
    return out


def _import(name: str):
    import importlib

    return importlib.import_module(name)


def _check_weights(module, weights: torch.Tensor, z: torch.Tensor) -> None:
    """The family's own eager weights against ``softmax(z)`` of the recorded logits: a term the
    capture does not form (a bias, a sink, a cap applied inside the modeling file) stops here."""
    w = weights.float()
    p = torch.softmax(z.float(), dim=-1)
    tol = 1e-4 if weights.dtype == torch.float32 else 2e-2
    err = float((w - p).abs().max()) if w.numel() else 0.0
    if w.shape != p.shape or not err <= tol:
        raise ExtractError(
            f"{type(module).__name__}: the model's attention weights differ from the softmax of "
            f"the captured logits by {err:.3g}; its attention adds a term the capture does not "
            "form, so it cannot be captured exactly (write a family adapter for it)")


def capture_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: record, then compute the family's eager attention."""
    rec = _active.get()
    eager = _family_eager(module)
    if rec is None:
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if isinstance(rec, Probe):
        rec.on_attention(module, query, key, scaling, kwargs)
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    unknown = sorted(k for k, v in kwargs.items()
                     if v is not None and k not in _NEUTRAL_KWARGS and k != "softcap")
    # half-precision models: the logits are formed in float32 from the half q and k (no inf
    # where q.k overflows float16, as the model's fused kernels keep float32 scores too); the
    # row statistics and the softmax below read these float32 logits
    if unknown:
        raise ExtractError(
            f"{type(module).__name__} passes {', '.join(unknown)} to its attention function, a "
            "term the capture's logits do not form; this model cannot be captured exactly "
            "(write a family adapter for it)")
    softcap = kwargs.get("softcap")
    q32, k32 = ((query.float(), key.float()) if query.dtype in _HALF else (query, key))
    terms = rec.mask_terms(attention_mask, k32, q32)
    z, fully_blocked = _masked_logits(q32, k32, attention_mask, scaling, terms, softcap)
    del q32, k32
    rec.on_attention(module, query, key, z, scaling, terms, softcap)
    fp32 = _eager_semantics(eager)
    if fp32 is None or fully_blocked:
        # unknown eager semantics, or a fully masked row (softmax of all -inf is NaN, eager's
        # finfo.min rows are not): let the family's own function compute the output; its
        # weights must be the softmax of the recorded logits
        out = eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if not fully_blocked and isinstance(out, tuple) and isinstance(out[1], torch.Tensor):
            _check_weights(module, out[1], z)
        return out
    if fp32:
        w = torch.nn.functional.softmax(z, dim=-1, dtype=torch.float32).to(query.dtype)
    else:
        w = torch.nn.functional.softmax(z, dim=-1).type(value.dtype)
    w = torch.nn.functional.dropout(w, p=dropout, training=module.training)
    groups = query.shape[1] // value.shape[1]
    if groups > 1:
        value = value.repeat_interleave(groups, dim=1)
    return torch.matmul(w, value).transpose(1, 2).contiguous(), w


def probe_inputs(model) -> dict:
    """The smallest input of ``model``: four token ids, or one blank image where its main input
    is ``pixel_values`` (config ``num_channels`` and ``image_size``)."""
    device = next(model.parameters()).device
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        c = model.config
        size = c.image_size if isinstance(c.image_size, int) else tuple(c.image_size)
        hw = (size, size) if isinstance(size, int) else size
        return {"pixel_values": torch.zeros((1, c.num_channels, *hw), device=device,
                                            dtype=next(model.parameters()).dtype)}
    return {"input_ids": torch.zeros((1, 4), dtype=torch.long, device=device), "use_cache": False}


class Probe:
    """One short forward that reads, per attention module, what its attention call receives:
    ``calls[id(module)] = {scaling, softcap, heads, kv_heads, d_head, rope}`` (``rope``: the
    module called the wrapped ``apply_rotary_pos_emb`` before it). The generic capture's
    discovery (extract/families/generic.py) builds its recipe from these facts."""

    def __init__(self, modules) -> None:
        self.modules = list(modules)
        self.calls: dict[int, dict] = {}
        self.current: int | None = None
        self.roped: set[int] = set()

    def on_rope(self, k_in, out) -> None:
        if self.current is not None:
            self.roped.add(self.current)

    def on_attention(self, module, query, key, scaling, kwargs) -> None:
        softcap = kwargs.get("softcap")
        self.calls.setdefault(id(module), dict(
            scaling=query.shape[-1] ** -0.5 if scaling is None else float(scaling),
            softcap=None if softcap is None else float(softcap), heads=query.shape[1],
            kv_heads=key.shape[1], d_head=query.shape[-1], rope=id(module) in self.roped))

    def run(self, model, install) -> dict[int, dict]:
        """Forward four tokens through ``model`` (capture attention) and return the calls;
        ``install(active)`` wraps the modeling module's rotary function first."""
        ensure_registered()
        install(_active)
        hooks = [m.register_forward_pre_hook(self._enter(id(m))) for m in self.modules]
        token = _active.set(self)
        try:
            with torch.inference_mode():
                model(**probe_inputs(model))
        finally:
            _active.reset(token)
            for h in hooks:
                h.remove()
        return self.calls

    def _enter(self, key: int):
        def hook(_mod, _args):
            self.current = key

        return hook


class _Recorder:
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
        """:func:`_mask_terms` of each mask object of this forward (one, or Gemma-3's sliding and
        global pair), computed at the first layer that uses it; the mask is held so its ``id``
        cannot be reused within the forward."""
        if attention_mask is None:
            return None
        sig = (id(attention_mask), key.shape[-2], query.dtype)
        if sig not in self._masks:
            self._masks[sig] = (attention_mask,
                                _mask_terms(attention_mask, key.shape[-2], query.dtype))
        return self._masks[sig][1]

    def __enter__(self) -> _Recorder:
        model, adapter = self.lm.model, self.lm.adapter
        if self.generic:
            adapter.install(_active)
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
        self.token = _active.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.reset(self.token)
        for h in self.handles:
            h.remove()

    def _enter_layer(self, layer: int):
        def hook(_mod, _args):
            if _active.get() is self:
                self.current = layer
                self.rope.pop(layer, None)

        return hook

    def on_rope(self, k_in: torch.Tensor, out) -> None:
        """The generic capture's ``apply_rotary_pos_emb`` call inside the current layer."""
        if self.current is not None:
            self.rope[self.current] = (k_in, out)

    def _key_hook(self, layer: int):
        def hook(_mod, _inp, out):
            if _active.get() is not self:  # another thread's forward through a shared model
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
                _check_finite(name, layer, self.out[name][layer])
        if logits is not None:
            _check_finite("attn_logits", layer, logits, allow_neg_inf=True)

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


#: dtype name -> torch dtype (models.py loads models with the same map)
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _host(t: torch.Tensor) -> np.ndarray:
    """A captured array as numpy; bfloat16 (no numpy dtype) as its raw bits, ``uint16``
    (contract.STORAGE_DTYPES: the store keeps the bits and reads them back as float32)."""
    t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _all_finite(t: torch.Tensor) -> bool:
    """Cheap sufficient test: a finite sum means every entry is finite (NaN and +-inf propagate).

    An overflowing sum of finite entries reads as "maybe not": callers then run the exact check.
    """
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    return bool(torch.isfinite(t.sum(dtype=acc)))


def _check_finite_stack(name: str, stacked: torch.Tensor) -> None:
    """:func:`_check_finite` on every layer of ``stacked`` ``[layer, ...]``, paid only when its
    sum is not finite."""
    if not _all_finite(stacked):
        for l, t in enumerate(stacked):
            _check_finite(name, l, t)


def _check_finite(name: str, layer: int | None, t: torch.Tensor, *, allow_neg_inf: bool = False) -> None:
    bad = torch.isnan(t) if allow_neg_inf else ~torch.isfinite(t)
    if allow_neg_inf:
        bad = bad | torch.isposinf(t)
    if bool(bad.any()):
        where = f"layer {layer}" if layer is not None else "all layers"
        raise NonFiniteActivationError(
            f"non-finite values in {name} at {where} ({int(bad.sum())} entries); try --dtype float32 "
            "or check the model weights"
        )


def _validate_capture(capture: Iterable[str]) -> set[str]:
    want = set(capture)
    bad = sorted(want - set(CAPTURE_CHOICES))
    if bad:
        raise ExtractError(f"unknown capture name(s) {', '.join(bad)}; choose from {', '.join(CAPTURE_CHOICES)}")
    return want


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
    r, c = rowkernel.row_col_stats_np(z.detach().to(torch.float32).numpy())
    return {k: torch.from_numpy(v) for k, v in r.items()}, torch.from_numpy(c)


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
    impl = getattr(model.config, "_attn_implementation", None)
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
    with torch.inference_mode(), _Recorder(lm, want, bufs, out_torch, recipe) as rec:
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
        _check_finite_stack(label, t)
        return t

    if "keys" in want:
        arrays["keys"] = _host(checked("keys", "keys"))
        if lm.adapter.rotary:
            arrays["keys_rot"] = _host(checked("keys_rot", "keys_rot"))
    if "queries" in want:
        arrays["queries"] = _host(checked("queries", "queries"))
    if hidden is not None:
        _check_finite_stack("hidden", hidden)
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
                    rec: _Recorder) -> torch.Tensor:
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
