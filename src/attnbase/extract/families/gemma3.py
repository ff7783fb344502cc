"""Gemma-3 text decoders (``gemma3_text``; Gemma Team 2025, "Gemma 3 Technical Report").

Differences from the Llama family that the capture has to respect (transformers'
``modeling_gemma3.Gemma3Attention.forward``):

- **QK-norm**: ``k_proj`` output is reshaped to ``[batch, kv_head, pos, d_head]`` and RMS-normed per
  head (``self_attn.k_norm``, learned scale) *before* RoPE. ``keys`` = the output of ``k_norm``, i.e.
  the keys exactly as the rotary embedding receives them: the attention scores are a function of
  these (rotated), not of the raw ``k_proj`` output, and docs/metrics.md §1-2 ask for pre-RoPE keys that
  differ from ``keys_rot`` by a rotation only (so norms agree per token). ``keys_rot`` = after RoPE.
- **Sliding-window layers** (``config.layer_types``; 5 local : 1 global in the released models):
  query i sees keys ``max(0, i - W + 1) .. i``. Out-of-window entries are ``-inf`` in
  ``attn_logits`` and not counted in ``row_stats.n_keys`` (= ``min(i + 1, W)``). Once key 0 leaves
  the window the row has no sink: ``sink_mass`` = 0 and ``sink_balance`` is NaN (extract/rowstats.py).
- **Scaling** ``query_pre_attn_scalar ** -0.5`` (not ``d_head ** -0.5``) and embeddings scaled by
  ``sqrt(d_model)`` (``hidden`` layer 0 holds the scaled embeddings, as the model's own
  ``output_hidden_states`` does). GQA as Llama: query head h reads kv head ``h // (H / H_kv)``.
"""

from __future__ import annotations

import torch

from attnbase.extract.families.base import FamilyAdapter


class Gemma3Adapter(FamilyAdapter):
    def split_keys(self, out: torch.Tensor, config) -> torch.Tensor:
        # k_norm runs on [batch, kv_head, pos, d_head] (already split per head)
        return out.transpose(1, 2)


ADAPTER = Gemma3Adapter(
    name="gemma3",
    model_types=("gemma3_text",),
    layers="layers",
    attention="self_attn",
    key_source="self_attn.k_norm",
    rotary=True,
    causal=True,
    derivable_logits=True,
)
