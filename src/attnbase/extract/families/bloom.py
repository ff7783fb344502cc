"""BLOOM: ALiBi (Press et al. 2022, "Train Short, Test Long") and a fused ``query_key_value``.

BLOOM's attention does not go through the attention interface: ``BloomAttention.forward``
forms ``alibi.baddbmm(q, k^T, alpha=inv_norm_factor)``, adds the additive causal mask and takes
a float32 softmax. The adapter observes that forward without changing it:

- the fused projection's output (``self_attention.query_key_value``, laid out per head as
  ``[H, 3, d_head]``) gives queries and keys (no rotary: ``keys`` are what the scores read);
- a pre-hook on the attention module reads the mask and the ``alibi`` tensor it receives; the
  ALiBi term must be ``slope[h] * key position`` with the slopes of transformers' own
  ``build_alibi_tensor`` (checked exactly at every call);
- a pre-hook on ``attention_dropout`` receives the model's attention probabilities: the
  capture's logits ``q.k * scale + slope[h] * j`` (masked ``-inf``) must softmax to them.

The logits recipe carries the slopes (:class:`~attnbase.contract.LogitsRecipe` ``alibi``), so
a derived run forms the positional bias on read, exactly as at capture.
"""

from __future__ import annotations

import torch

from attnbase.contract import LogitsRecipe
from attnbase.errors import ExtractError
from attnbase.extract.families.base import FamilyAdapter


def alibi_slopes(n_heads: int) -> tuple[float, ...]:
    """BLOOM's ALiBi slopes, read from transformers' own ``build_alibi_tensor`` (key position 1
    of a two-token sequence; BloomModel builds an unpadded batch's bias from the same slopes)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    a = build_alibi_tensor(torch.ones((1, 2), dtype=torch.long), n_heads, torch.float32)
    return tuple(float(x) for x in a[:, 0, 1])


class BloomAdapter(FamilyAdapter):
    def n_layers(self, config) -> int:
        return int(config.n_layer)

    def n_heads(self, config) -> int:
        return int(config.n_head)

    def n_kv_heads(self, config) -> int:
        return self.n_heads(config)

    def d_head(self, config) -> int:
        return self.d_model(config) // self.n_heads(config)

    def _qkv(self, out: torch.Tensor, config) -> torch.Tensor:
        # BloomAttention._reshape: view(batch, pos, H, 3, d_head)
        return out.view(*out.shape[:-1], self.n_heads(config), 3, self.d_head(config))

    def split_keys(self, out: torch.Tensor, config) -> torch.Tensor:
        return self._qkv(out, config)[..., 1, :]

    def logits_recipe(self, model) -> LogitsRecipe:
        n = self.n_layers(model.config)
        scales = [float(self.attention_module(model, l).inv_norm_factor) for l in range(n)]
        return LogitsRecipe(keys="keys", scale=tuple(scales), causal=True, window=(None,) * n,
                            alibi=alibi_slopes(self.n_heads(model.config)))

    def observe(self, rec, layer: int) -> list:
        """Hooks that hand layer ``layer``'s queries, keys and logits to the recorder ``rec``
        (``rec.on_attention``), the attention itself left as BLOOM computes it."""
        model, config = rec.lm.model, rec.lm.model.config
        attn = self.attention_module(model, layer)
        slopes = torch.tensor(rec.lm.info.logits_recipe.alibi, dtype=torch.float32)
        seen: dict[str, torch.Tensor] = {}

        def on_qkv(_mod, _inp, out):
            qkv = self._qkv(out, config)  # [batch, pos, H, 3, d]
            seen["q"], seen["k"] = qkv[..., 0, :].transpose(1, 2), qkv[..., 1, :].transpose(1, 2)

        def on_attention(_mod, args, kwargs):
            seen["mask"], seen["alibi"] = kwargs.get("attention_mask"), kwargs.get("alibi")

        def on_probs(_mod, args):
            q, k, mask, alibi = seen.pop("q"), seen.pop("k"), seen.pop("mask"), seen.pop("alibi")
            n_k = k.shape[-2]
            want = slopes.to(alibi.device)[:, None] * torch.arange(n_k, dtype=torch.float32,
                                                                  device=alibi.device)
            got = alibi.view(q.shape[0], q.shape[1], -1)[..., :n_k]
            if not torch.equal(got, want.to(alibi.dtype).expand_as(got)):
                raise ExtractError(
                    f"layer {layer}: BLOOM's ALiBi bias is not slope[head] * key position (a "
                    "padded batch?); the capture reads unpadded windows only")
            from attnbase.extract.attention_call import HALF, masked_logits

            q32, k32 = (q.float(), k.float()) if q.dtype in HALF else (q, k)
            terms = rec.mask_terms(mask, k32, q32)
            scale = float(attn.inv_norm_factor)
            z, _ = masked_logits(q32, k32, mask, scale, terms, alibi=slopes)
            probs = args[0]
            err = float((torch.softmax(z, -1) - probs.float()).abs().max())
            if not err <= (1e-4 if probs.dtype == torch.float32 else 2e-2):
                raise ExtractError(
                    f"layer {layer}: BLOOM's attention probabilities differ from the softmax of "
                    f"the captured logits by {err:.3g}; this model is not the BLOOM the adapter "
                    "reads")
            rec.on_attention(attn, q, k, z, scale, terms)

        return [attn.query_key_value.register_forward_hook(on_qkv),
                attn.register_forward_pre_hook(on_attention, with_kwargs=True),
                attn.attention_dropout.register_forward_pre_hook(on_probs)]


ADAPTER = BloomAdapter(
    name="bloom",
    model_types=("bloom",),
    layers="h",
    attention="self_attention",
    key_source="self_attention.query_key_value",
    rotary=False,
    causal=True,
    derivable_logits=True,
)
