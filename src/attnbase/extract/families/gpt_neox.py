"""GPT-NeoX / Pythia: fused ``attention.query_key_value`` laid out per head as [H, 3*d_head];
rotary on the first ``rotary_ndims`` of each head (partial rotary)."""

from __future__ import annotations

import torch

from attnbase.extract.families.base import FamilyAdapter


class GPTNeoXAdapter(FamilyAdapter):
    def n_kv_heads(self, config) -> int:
        return self.n_heads(config)

    def d_head(self, config) -> int:
        return self.d_model(config) // self.n_heads(config)

    def split_keys(self, out: torch.Tensor, config) -> torch.Tensor:
        # GPTNeoXAttention.forward: view(..., H, 3*d_head) then chunk(3) -> q, k, v
        dh = self.d_head(config)
        qkv = out.view(*out.shape[:-1], self.n_heads(config), 3 * dh)
        return qkv[..., dh : 2 * dh]


ADAPTER = GPTNeoXAdapter(
    name="gpt_neox",
    model_types=("gpt_neox",),
    layers="layers",
    attention="attention",
    key_source="attention.query_key_value",
    rotary=True,
    causal=True,
    derivable_logits=True,
)
