"""The family adapter contract: where a HF architecture keeps its layers, attention and keys.

An adapter declares real HF module paths (relative to ``model.base_model``) instead of inventing
hook names; a path that does not resolve raises at capture time with the path that failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

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

    def describe(self) -> str:
        return f"{self.name} ({', '.join(self.model_types)})"
