"""Llama-style decoders (llama, mistral, qwen2): separate ``self_attn.k_proj``, RoPE, GQA
(``num_key_value_heads`` <= ``num_attention_heads``; query head h reads kv head h // groups)."""

from __future__ import annotations

from attnbase.extract.families.base import FamilyAdapter

ADAPTER = FamilyAdapter(
    name="llama",
    model_types=("llama", "mistral", "qwen2"),
    layers="layers",
    attention="self_attn",
    key_source="self_attn.k_proj",
    rotary=True,
    causal=True,
    derivable_logits=True,
)
