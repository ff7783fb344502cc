"""The family adapter contract: where a HF architecture keeps its layers, attention and keys.

An adapter declares real HF module paths (relative to ``model.base_model``) instead of inventing
hook names; a path that does not resolve raises at capture time with the path that failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnbase.contract import LogitsRecipe
from attnbase.errors import UnsupportedArchitectureError


def _resolve(root: torch.nn.Module, path: str, what: str) -> Any:
    obj: Any = root
    for part in path.split("."):
        if part.isdigit():
            obj = obj[int(part)]
        elif hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            raise UnsupportedArchitectureError(
                f"{type(root).__name__} has no {what} at {path!r} (missing {part!r}); "
                "the model's module layout does not match its family adapter"
            )
    return obj


@dataclass(frozen=True)
class FamilyAdapter:
    """How one HF architecture family is read.

    ``layers``: path (from ``model.base_model``) of the ``ModuleList`` of blocks.
    ``attention``: path inside a block of the module HF passes as ``module`` to the attention
    interface (its ``eager_attention_forward`` lives in the same Python module).
    ``key_source``: path inside a block of the module whose *output* holds the pre-RoPE keys;
    :meth:`split_keys` turns that output ``[batch, pos, ...]`` into ``[batch, pos, kv_head, d_head]``.
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    attention: str
    key_source: str
    rotary: bool
    causal: bool
    #: the logits are exactly ``scaled_scores(q, k) * scale + mask rule`` of the queries and keys
    #: the attention function receives (attnbase.logits), so a run can store q and k and derive
    #: them on read; an adapter that does not say so stores its logits
    derivable_logits: bool = False
    #: the adapter reads the family only where its installed modeling file keeps the attention
    #: outside the attention interface; where it goes through the interface (Falcon from
    #: transformers 5.25 on) the generic capture serves the type instead
    outside_interface_only: bool = False

    # --- config facts (HF configs differ in attribute names only at the edges) -----------------
    def n_layers(self, config) -> int:
        return int(config.num_hidden_layers)

    def n_heads(self, config) -> int:
        return int(config.num_attention_heads)

    def n_kv_heads(self, config) -> int:
        return int(getattr(config, "num_key_value_heads", None) or self.n_heads(config))

    def d_model(self, config) -> int:
        return int(config.hidden_size)

    def d_head(self, config) -> int:
        return int(getattr(config, "head_dim", None) or self.d_model(config) // self.n_heads(config))

    # --- module access -----------------------------------------------------------------------
    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return list(_resolve(model.base_model, self.layers, "layer list"))

    def attention_module(self, model: torch.nn.Module, layer: int) -> torch.nn.Module:
        return _resolve(self.blocks(model)[layer], self.attention, "attention module")

    def key_module(self, model: torch.nn.Module, layer: int) -> torch.nn.Module:
        return _resolve(self.blocks(model)[layer], self.key_source, "key projection")

    def split_keys(self, out: torch.Tensor, config) -> torch.Tensor:
        """``[batch, pos, n_kv_heads * d_head]`` -> ``[batch, pos, kv_head, d_head]``."""
        return out.view(*out.shape[:-1], self.n_kv_heads(config), self.d_head(config))

    def sliding_window(self, config, layer: int) -> int | None:
        """The sliding window W of ``layer`` (None: the layer sees every earlier key), from
        transformers' ``config.layer_types`` (Gemma-3: 5 local : 1 global; Qwen2 with
        ``use_sliding_window``), else a model-wide ``config.sliding_window`` (Mistral); a model
        masking otherwise is caught by the capture's check of
        the logits recipe."""
        types = getattr(config, "layer_types", None)
        if types:
            if layer < len(types) and types[layer] == "sliding_attention":
                return int(config.sliding_window)
            return None
        # no per-layer types (Mistral, Mixtral, Starcoder2): a model-wide window, if any
        w = getattr(config, "sliding_window", None)
        if isinstance(w, int) and not isinstance(w, bool) and getattr(config, "use_sliding_window", True):
            return int(w)
        return None

    def logits_recipe(self, model: torch.nn.Module) -> LogitsRecipe | None:
        """How this model's logits follow from its captured queries and keys, or None where the
        adapter does not declare them derivable. The scale of each layer is its attention
        module's own ``scaling`` (what HF passes to the attention function); the capture checks
        scale and mask rule at every call of a derived-logits run."""
        if not self.derivable_logits:
            return None
        config = model.config
        n = self.n_layers(config)
        scales = [getattr(self.attention_module(model, l), "scaling", None) for l in range(n)]
        if any(not isinstance(s, (int, float)) for s in scales):
            return None
        return LogitsRecipe(keys="keys_rot" if self.rotary else "keys",
                            scale=tuple(float(s) for s in scales), causal=self.causal,
                            window=tuple(self.sliding_window(config, l) for l in range(n)))

    def sink_positions(self, config) -> tuple[int, ...]:
        """The key positions every sink statistic reads as the sink (docs/metrics.md "Sink
        sets"): key 0 for text families; vision families declare [CLS] and their extra tokens
        (:func:`attnbase.extract.vision.sink_positions`)."""
        from attnbase.extract import vision

        return vision.sink_positions(config) if vision.is_vision(config) else (0,)

    def describe(self) -> str:
        return f"{self.name} ({', '.join(self.model_types)})"
