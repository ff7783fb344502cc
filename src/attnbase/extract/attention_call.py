"""The attention function attnbase registers with transformers, and what it computes per call.

:func:`capture_attention_forward` is registered with ``transformers.AttentionInterface`` under
:data:`CAPTURE_ATTN` (plus the eager mask function under the same name in
``AttentionMaskInterface`` -- without it transformers passes ``attention_mask=None`` and the model
silently runs non-causal). HF calls it as ``fn(module, query, key, value, attention_mask,
scaling=..., dropout=..., **kwargs)`` with ``query [batch, head, pos, d_head]`` and ``key``
``[batch, kv_head, pos, d_head]`` after RoPE. It hands queries, rotated keys and the scaled
logits to the forward's recorder (:data:`active`), then returns exactly what the family's own
``eager_attention_forward`` returns, so the model's outputs are those of eager attention. For
the families whose eager function is known (:data:`_EAGER_SOFTMAX_FP32`) the output is computed
from the recorded logits with the same operations as that function (softmax in its dtype,
``@ value``, transpose), so ``Q K^T`` is computed once; masked entries are ``-inf`` instead of
eager's ``finfo.min`` added, which softmax maps to the same exact zeros. Any other modeling file,
or a row with every key masked, runs the family's own eager function, whose weights must then be
the softmax of the recorded logits. Keyword arguments that would change the logits, and a term
the capture does not form, stop with one line.

:class:`Probe` runs one short forward through the same function to read what each attention
call receives (the generic capture's discovery). Registration happens lazily
(:func:`ensure_registered`), never at import.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import math
import sys
from typing import Any

import torch

from attnbase.errors import ExtractError
from attnbase.logits import scaled_scores

#: The ``attn_implementation`` name under which the capture function is registered.
CAPTURE_ATTN = "attnbase_capture"

_registered = False
#: What records the forward running in this context: a capture's recorder
#: (:class:`attnbase.extract.recorder.Recorder`), a :class:`Probe`, or None (the attention
#: function then computes the family's eager attention and records nothing).
active: contextvars.ContextVar[Any] = contextvars.ContextVar("attnbase_recorder", default=None)


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


def mask_terms(attention_mask, n_keys: int, dtype) -> tuple[torch.Tensor | None, torch.Tensor, bool]:
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


def masked_logits(query, key, attention_mask, scaling, terms=None,
                   softcap: float | None = None, alibi=None) -> tuple[torch.Tensor, bool]:
    """Scaled (soft-capped), masked logits and whether some row has every key blocked.

    ``terms`` are :func:`mask_terms` of ``attention_mask`` when the caller caches them."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    # the formula derived logits reuse
    z = scaled_scores(query, key, scaling, head_axis=1, softcap=softcap, alibi=alibi)
    if attention_mask is None:
        return z, False
    additive, blocked, full = terms or mask_terms(attention_mask, key.shape[-2], z.dtype)
    if additive is None:
        return z.masked_fill_(blocked, -math.inf), full
    # z + m where the mask allows (as eager adds it), -inf where it blocks: one in-place add
    return z.add_(additive), full


HALF = (torch.float16, torch.bfloat16)

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
    rec = active.get()
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
    q32, k32 = ((query.float(), key.float()) if query.dtype in HALF else (query, key))
    terms = rec.mask_terms(attention_mask, k32, q32)
    z, fully_blocked = masked_logits(q32, k32, attention_mask, scaling, terms, softcap)
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
        install(active)
        hooks = [m.register_forward_pre_hook(self._enter(id(m))) for m in self.modules]
        token = active.set(self)
        try:
            with torch.inference_mode():
                model(**probe_inputs(model))
        finally:
            active.reset(token)
            for h in hooks:
                h.remove()
        return self.calls

    def _enter(self, key: int):
        def hook(_mod, _args):
            self.current = key

        return hook
