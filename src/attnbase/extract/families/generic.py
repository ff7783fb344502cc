"""The generic capture: any HF model whose attention goes through the attention interface.

A model type without a hand-written adapter is served when its modeling file routes attention
through ``ALL_ATTENTION_FUNCTIONS`` (transformers' attention interface, where the capture's
function is registered). Everything the capture needs is discovered from the loaded model:

- **layers and attention modules**: the modules whose class's ``forward`` calls the attention
  interface; their names ``<list>.<i>.<path>`` give the layer list and the attention path inside
  a block (one attention module per block, else the model is not served: cross-attention).
- **keys**: post-RoPE queries and keys are what the attention function receives. Pre-RoPE keys
  are what the modeling module's own ``apply_rotary_pos_emb(q, k, cos, sin, ...)`` receives: the
  capture wraps that module-level function (looked up by name at call time by the modeling code)
  and, at the attention call, locates the returned keys in the keys the attention received (same
  layout or ``[batch, pos, head, d]``; a partial rotary that rotates the first ``d_rot``
  features and concatenates the rest is read as ``cat(k_in, key[..., d_rot:])``). A layer that
  calls no rotary embedding (SmolLM3's NoPE layers, ``use_rope`` false) has pre = post keys. A
  model without ``apply_rotary_pos_emb`` stores the attention's keys as ``keys``.
- **heads**: query and kv head counts and ``d_head`` from the config (``num_key_value_heads``,
  ``multi_query``) and the attention module (``head_dim``, ``num_key_value_groups``), checked
  against the tensors of every attention call.
- **scale**: the module's ``scaling`` (or ``d_head ** -0.5``); **soft-cap**: the module's
  ``attn_logit_softcapping`` (Gemma-2); **windows** per layer from ``config.layer_types`` or a
  model-wide ``config.sliding_window``; **causal** from the module's ``is_causal``. All are part
  of the logits recipe and checked at every attention call of a derived-logits run
  (extract/recorder.py), so a model that masks, scales or caps otherwise stops with one line.
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache

import torch

from attnbase.contract import LogitsRecipe
from attnbase.errors import ExtractError, UnsupportedArchitectureError
from attnbase.extract.families.base import FamilyAdapter

_INTERFACE_CALL = ("ALL_ATTENTION_FUNCTIONS", "eager_attention_forward")
_ROPE_CALL = re.compile(r"\bapply_rotary_pos_emb\s*\(")
_LAYER_NAME = re.compile(r"^(?P<list>.+?)\.(?P<i>\d+)\.(?P<path>.+)$")


@lru_cache(maxsize=None)
def _forward_source(cls: type) -> str:
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return ""


def calls_interface(cls: type) -> bool:
    """Whether ``cls.forward`` routes attention through the attention interface."""
    src = _forward_source(cls)
    return any(s in src for s in _INTERFACE_CALL)


def modeling_source_facts(model_type: str) -> dict:
    """What a model type's modeling file says without importing it: ``interface`` (its attention
    goes through ``ALL_ATTENTION_FUNCTIONS``), ``rotary`` (it defines and calls
    ``apply_rotary_pos_emb``), ``cross`` (it has cross-attention modules), ``sinks`` (it passes
    learned sink logits ``s_aux``); ``found`` False where transformers has no modeling file."""
    import importlib.util

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    mod = model_type_to_module_name(model_type)
    spec = importlib.util.find_spec("transformers.models")
    root = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
    from pathlib import Path

    path = Path(root or ".") / mod / f"modeling_{mod}.py"
    if not path.is_file():
        return {"found": False, "interface": False, "rotary": False, "cross": False,
                "sinks": False}
    text = path.read_text(encoding="utf-8", errors="replace")
    return {"found": True, "interface": "ALL_ATTENTION_FUNCTIONS" in text,
            "rotary": "def apply_rotary_pos_emb" in text and bool(_ROPE_CALL.search(text)),
            "cross": bool(re.search(r"is_cross_attention|encoder_attn|crossattention|"
                                    r"cross_attn", text)),
            "sinks": "s_aux" in text}


def _layer_paths(model: torch.nn.Module) -> tuple[str, str, int, list[torch.nn.Module]]:
    """``(layers, attention, n_layers, modules)`` of the interface attention modules."""
    found: list[tuple[str, str, int, torch.nn.Module]] = []
    for name, mod in model.base_model.named_modules():
        if name and calls_interface(type(mod)):
            m = _LAYER_NAME.match(name)
            if m is None:
                raise UnsupportedArchitectureError(
                    f"{type(model).__name__}: attention module {name!r} is not inside a layer "
                    "list; the generic capture reads one attention module per block")
            found.append((m["list"], m["path"], int(m["i"]), mod))
    if not found:
        raise UnsupportedArchitectureError(
            f"model_type {model.config.model_type!r}: its attention does not go through the "
            "attention interface (ALL_ATTENTION_FUNCTIONS), so the generic capture cannot see "
            "it; write a family adapter (attnbase.extract.families.register_adapter)")
    lists = {f[0] for f in found}
    paths = {f[1] for f in found}
    if len(lists) != 1 or len(paths) != 1:
        where = ", ".join(sorted({f"{a}.N.{b}" for a, b, *_ in found}))
        raise UnsupportedArchitectureError(
            f"model_type {model.config.model_type!r} has more than one attention per block "
            f"({where}); the generic capture reads one (self-)attention per layer: write a "
            "family adapter for it")
    layers, attention = lists.pop(), paths.pop()
    blocks = model.base_model.get_submodule(layers)
    idx = sorted(f[2] for f in found)
    if idx != list(range(len(blocks))):
        raise UnsupportedArchitectureError(
            f"model_type {model.config.model_type!r}: not every block of {layers!r} has an "
            f"attention module at {attention!r}; write a family adapter for it")
    return layers, attention, len(blocks), [blocks[i].get_submodule(attention) for i in idx]


def _int(x) -> int | None:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else None


@dataclass(frozen=True)
class GenericAdapter(FamilyAdapter):
    """A model read through the attention interface (built by :func:`discover`)."""

    heads: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)  # layers, H, H_kv, d_head, d_model
    modeling: str = ""  # the modeling module whose apply_rotary_pos_emb is wrapped
    #: per layer: the scale and soft-cap its attention module declares (checked at every call)
    scales: tuple[float, ...] = ()
    softcaps: tuple[float | None, ...] = ()
    #: layers whose attention calls no rotary embedding (NoPE layers): pre = post keys
    nope: tuple[int, ...] = ()
    generic: bool = field(default=True)

    def n_layers(self, config) -> int:
        return self.heads[0]

    def n_heads(self, config) -> int:
        return self.heads[1]

    def n_kv_heads(self, config) -> int:
        return self.heads[2]

    def d_head(self, config) -> int:
        return self.heads[3]

    def d_model(self, config) -> int:
        return self.heads[4]

    def key_module(self, model, layer):  # keys come from the attention call, not a hook
        raise ExtractError(f"the generic capture of {self.name!r} has no key projection module")

    def sliding_window(self, config, layer: int) -> int | None:
        w = super().sliding_window(config, layer)
        # a bidirectional window lets query i see keys |i - j| <= W (masking_utils), that is
        # |i - j| < W + 1: the recipe's rule for an encoder
        return None if w is None else (w if self.causal else w + 1)

    def describe(self) -> str:
        return f"generic ({self.name})"

    def logits_recipe(self, model: torch.nn.Module) -> LogitsRecipe:
        config = model.config
        n = self.heads[0]
        caps = self.softcaps if any(c is not None for c in self.softcaps) else None
        return LogitsRecipe(keys="keys_rot" if self.rotary else "keys", scale=self.scales,
                            causal=self.causal,
                            window=tuple(self.sliding_window(config, l) for l in range(n)),
                            softcap=caps)

    # --- capture-time hooks (extract/recorder.py) --------------------------------------------
    def install(self, active) -> None:
        """Wrap the modeling module's ``apply_rotary_pos_emb`` (:func:`wrap_rotary`)."""
        wrap_rotary(self.modeling, active)

    def check_shapes(self, layer: int, query: torch.Tensor, key: torch.Tensor) -> None:
        _, H, H_kv, dh, _ = self.heads
        got = (query.shape[1], key.shape[1], query.shape[-1])
        if got != (H, H_kv, dh) or key.shape[-1] != dh:
            raise ExtractError(
                f"layer {layer} of {self.name!r} attends with {got[0]} query heads, {got[1]} kv "
                f"heads of width {got[2]}, not the {H}, {H_kv}, {dh} read from its config; the "
                "generic capture cannot place its heads: write a family adapter")

    def pre_rope_keys(self, layer: int, module, key: torch.Tensor, rope) -> torch.Tensor:
        """The keys ``[batch, kv_head, pos, d_head]`` before the rotary embedding of the
        attention call whose post-RoPE ``key`` the attention received; ``rope`` is the
        ``(k_in, (q_out, k_out))`` of this layer's ``apply_rotary_pos_emb`` call, or None."""
        if rope is None:
            if not self.rotary or layer in self.nope:
                return key
            raise ExtractError(
                f"layer {layer} of {self.name!r} called no apply_rotary_pos_emb before its "
                "attention; its pre-RoPE keys cannot be read: capture without keys or write a "
                "family adapter")
        k_in, out = rope
        k_out = out[1] if isinstance(out, (tuple, list)) and len(out) >= 2 else None
        if isinstance(k_out, torch.Tensor) and k_out.dim() == 4:
            for t_in, t_out in ((k_in, k_out), (k_in.transpose(1, 2), k_out.transpose(1, 2))):
                if t_out.shape[:-1] != key.shape[:-1] or t_out.shape[-1] > key.shape[-1]:
                    continue
                d = t_out.shape[-1]
                if torch.equal(key[..., :d], t_out.to(key.dtype)):
                    if d == key.shape[-1]:
                        return t_in.to(key.dtype)
                    return torch.cat((t_in.to(key.dtype), key[..., d:]), dim=-1)
        raise ExtractError(
            f"layer {layer} of {self.name!r}: the keys apply_rotary_pos_emb returned are not the "
            "keys its attention received; its pre-RoPE keys cannot be read: capture without "
            "keys or write a family adapter")


def wrap_rotary(modeling: str, active) -> None:
    """Wrap the ``apply_rotary_pos_emb`` of modeling module ``modeling`` once: each call is
    reported to the recorder ``active`` holds (``rec.on_rope(k_in, out)``); with none active the
    wrapper only calls the original."""
    mod = sys.modules.get(modeling)
    fn = getattr(mod, "apply_rotary_pos_emb", None)
    if fn is None or getattr(fn, "_attnbase_wrapped", False):
        return

    def apply_rotary_pos_emb(q, k, *args, **kwargs):
        out = fn(q, k, *args, **kwargs)
        rec = active.get()
        if rec is not None:
            rec.on_rope(k, out)
        return out

    apply_rotary_pos_emb._attnbase_wrapped = True
    apply_rotary_pos_emb.__wrapped__ = fn
    mod.apply_rotary_pos_emb = apply_rotary_pos_emb


def _head_counts(config, modules: list[torch.nn.Module]) -> tuple[int, int, int, int]:
    a = modules[0]
    H = _int(getattr(a, "num_heads", None)) or _int(getattr(config, "num_attention_heads", None))
    d_model = _int(getattr(config, "hidden_size", None))
    dh = _int(getattr(a, "head_dim", None)) or _int(getattr(config, "head_dim", None))
    if H is None or d_model is None:
        raise UnsupportedArchitectureError(
            f"model_type {config.model_type!r}: no head count or hidden size in its config; "
            "write a family adapter for it")
    dh = dh or d_model // H
    groups = _int(getattr(a, "num_key_value_groups", None))
    kv = _int(getattr(config, "num_key_value_heads", None))
    if groups:
        kv = H // groups
    elif kv is None:
        kv = 1 if getattr(config, "multi_query", False) else H
    return H, kv, dh, d_model


def discover(model: torch.nn.Module) -> GenericAdapter:
    """The :class:`GenericAdapter` of a loaded model, or :class:`UnsupportedArchitectureError`
    naming why it cannot be read."""
    config = model.config
    if getattr(config, "alibi", False):
        raise UnsupportedArchitectureError(
            f"model_type {config.model_type!r} with alibi=True passes its ALiBi bias inside the "
            "attention mask, a term the capture's logits do not form; use a rotary variant")
    layers, attention, n, modules = _layer_paths(model)
    modeling = type(modules[0]).__module__
    causal = {bool(getattr(m, "is_causal", True)) for m in modules}
    if len(causal) != 1:
        raise UnsupportedArchitectureError(
            f"model_type {config.model_type!r} mixes causal and bidirectional layers; write a "
            "family adapter for it")
    mod = sys.modules.get(modeling)
    src = _forward_source(type(modules[0]))
    has_rope = hasattr(mod, "apply_rotary_pos_emb") and bool(_ROPE_CALL.search(src))
    if not has_rope and re.search(r"rotary|\brope\b|cos,\s*sin", src):
        raise UnsupportedArchitectureError(
            f"model_type {config.model_type!r} applies rotary embeddings outside its modeling "
            "module's apply_rotary_pos_emb, so its pre-RoPE keys cannot be read; write a "
            "family adapter for it")
    H, kv, dh, d_model = _head_counts(config, modules)
    scales = [getattr(m, "scaling", None) for m in modules]
    adapter = GenericAdapter(
        name=config.model_type, model_types=(config.model_type,), layers=layers,
        attention=attention, key_source="", rotary=has_rope, causal=causal.pop(),
        derivable_logits=True, heads=(n, H, kv, dh, d_model), modeling=modeling,
        scales=tuple(float(s) if isinstance(s, (int, float)) else dh ** -0.5 for s in scales),
        softcaps=tuple(_softcap(m) for m in modules))
    if not _probe_ready(model):
        return adapter  # meta device or another attention implementation: config facts only
    from attnbase.extract.attention_call import Probe

    calls = Probe(modules).run(model, adapter.install)
    missing = [l for l, m in enumerate(modules) if id(m) not in calls]
    if missing:
        raise UnsupportedArchitectureError(
            f"model_type {config.model_type!r}: layer(s) {missing} made no attention call "
            "through the attention interface; write a family adapter for it")
    facts = [calls[id(m)] for m in modules]
    shapes = {(f["heads"], f["kv_heads"], f["d_head"]) for f in facts}
    if len(shapes) != 1:
        raise UnsupportedArchitectureError(
            f"model_type {config.model_type!r}: its layers differ in head counts {sorted(shapes)}; "
            "write a family adapter for it")
    H, kv, dh = shapes.pop()
    return replace(adapter, heads=(n, H, kv, dh, d_model),
                   scales=tuple(f["scaling"] for f in facts),
                   softcaps=tuple(f["softcap"] for f in facts),
                   nope=tuple(l for l, f in enumerate(facts) if has_rope and not f["rope"]))


def _probe_ready(model) -> bool:
    from attnbase.extract.attention_call import CAPTURE_ATTN

    p = next(model.parameters(), None)
    return (p is not None and p.device.type != "meta"
            and getattr(model.config, "_attn_implementation", None) == CAPTURE_ATTN)


def _softcap(module) -> float | None:
    v = getattr(module, "attn_logit_softcapping", None)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
