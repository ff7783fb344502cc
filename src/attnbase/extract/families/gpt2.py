"""GPT-2: learned absolute positions, fused ``attn.c_attn`` (Conv1D, weights (in, out))."""

from __future__ import annotations

import torch

from attnbase.extract.families.base import FamilyAdapter


class GPT2Adapter(FamilyAdapter):
    def n_layers(self, config) -> int:
        return int(config.n_layer)

    def n_heads(self, config) -> int:
        return int(config.n_head)

    def n_kv_heads(self, config) -> int:
        return self.n_heads(config)

    def d_model(self, config) -> int:
        return int(config.n_embd)

    def d_head(self, config) -> int:
        return self.d_model(config) // self.n_heads(config)

    def split_keys(self, out: torch.Tensor, config) -> torch.Tensor:
        # c_attn output is [q | k | v] along the last axis, each n_embd wide (GPT2Attention.forward)
        d = self.d_model(config)
        k = out[..., d : 2 * d]
        return k.reshape(*k.shape[:-1], self.n_heads(config), self.d_head(config))


ADAPTER = GPT2Adapter(
    name="gpt2",
    model_types=("gpt2",),
    layers="h",
    attention="attn",
    key_source="attn.c_attn",
    rotary=False,
    causal=True,
    derivable_logits=True,
)
