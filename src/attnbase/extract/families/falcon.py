"""Falcon (rotary variants): a fused ``query_key_value``, multi-query or grouped keys, RoPE.

This adapter reads the Falcon modeling files whose attention does not go through the attention
interface (transformers up to 5.24); where the installed file routes it through the interface
(5.25 on), the generic capture serves Falcon instead (``outside_interface_only``, decided by
:func:`attnbase.extract.families.hand_written` from the modeling file's source).

There ``FalconAttention.forward``
splits the fused projection (``_split_heads``), applies the modeling module's
``apply_rotary_pos_emb``, and forms ``softmax(q k^T / sqrt(d_head) + mask) @ v``. The adapter
observes it without changing it: the mask from the attention module's arguments, queries and
keys before and after RoPE from the wrapped ``apply_rotary_pos_emb`` (as the generic capture
does), the values from ``_split_heads`` of the projection's output; at the output projection
(``dense``) the capture's logits must reproduce the attention output the model computed
(``softmax(z) @ v``), else the run stops. ALiBi Falcons (``config.alibi``) are not served.
"""

from __future__ import annotations

import torch

from attnbase.contract import LogitsRecipe
from attnbase.errors import ExtractError, UnsupportedArchitectureError
from attnbase.extract.families.base import FamilyAdapter

MODELING = "transformers.models.falcon.modeling_falcon"


class FalconAdapter(FamilyAdapter):
    def n_layers(self, config) -> int:
        return int(config.num_hidden_layers)

    def n_kv_heads(self, config) -> int:
        if config.new_decoder_architecture:
            return self.n_heads(config)  # _split_heads broadcasts the kv groups to every head
        return 1 if config.multi_query else int(config.num_kv_heads)

    def d_head(self, config) -> int:
        return self.d_model(config) // self.n_heads(config)

    def on_register(self, name: str) -> None:
        """Falcon picks its attention class by implementation name: the capture's name gets
        the eager class (its attention is observed, not replaced)."""
        from transformers.models.falcon import modeling_falcon as mf

        classes = getattr(mf, "FALCON_ATTENTION_CLASSES", None)
        if classes is None:
            raise ExtractError(
                "transformers.models.falcon.modeling_falcon has neither FALCON_ATTENTION_CLASSES "
                "nor the attention interface; this transformers' Falcon is not one attnbase reads")
        classes.setdefault(name, mf.FalconAttention)

    def logits_recipe(self, model):
        if getattr(model.config, "alibi", False):
            raise UnsupportedArchitectureError(
                "falcon with alibi=True is not supported (its ALiBi is scaled with the scores); "
                "use a rotary Falcon")
        n = self.n_layers(model.config)
        return LogitsRecipe(keys="keys_rot", causal=True, window=(None,) * n, scale=tuple(
            float(self.attention_module(model, l).inv_norm_factor) for l in range(n)))

    def observe(self, rec, layer: int) -> list:
        """Hooks that hand layer ``layer``'s pre- and post-RoPE keys, queries and logits to the
        recorder ``rec``; the attention itself is left as Falcon computes it."""
        from attnbase.extract.attention_call import HALF, active, masked_logits
        from attnbase.extract.families.generic import wrap_rotary

        wrap_rotary(MODELING, active)
        attn = self.attention_module(rec.lm.model, layer)
        scale = float(attn.inv_norm_factor)
        seen: dict[str, object] = {}

        def on_attention(_mod, args, kwargs):
            seen["mask"] = kwargs.get("attention_mask", args[2] if len(args) > 2 else None)
            rec.current = layer
            rec.rope.pop(layer, None)

        def on_qkv(_mod, _inp, out):
            seen["v"] = attn._split_heads(out)[2].transpose(1, 2)  # [batch, kv, pos, d]

        def on_dense(_mod, args):
            rope = rec.rope.pop(layer, None)
            if rope is None:
                raise ExtractError(f"layer {layer}: Falcon called no apply_rotary_pos_emb; only "
                                   "rotary Falcons are served")
            k_in, (q, k) = rope
            mask, v = seen.pop("mask"), seen.pop("v")
            q32, k32 = (q.float(), k.float()) if q.dtype in HALF else (q, k)
            terms = rec.mask_terms(mask, k32, q32)
            z, _ = masked_logits(q32, k32, mask, scale, terms)
            w = torch.softmax(z, -1)
            groups = q.shape[1] // v.shape[1]
            vv = v.float().repeat_interleave(groups, 1) if groups > 1 else v.float()
            out = (w @ vv).permute(0, 2, 1, 3).reshape(args[0].shape)
            err = float((out - args[0].float()).abs().max())
            if not err <= (1e-4 if q.dtype == torch.float32 else 2e-2):
                raise ExtractError(
                    f"layer {layer}: Falcon's attention output differs from the softmax of the "
                    f"captured logits times its values by {err:.3g}; this model is not the "
                    "Falcon the adapter reads")
            if "keys" in rec.want:
                rec.put("keys", layer, k_in.transpose(0, 1))
            rec.on_attention(attn, q, k, z, scale, terms)

        return [attn.register_forward_pre_hook(on_attention, with_kwargs=True),
                attn.query_key_value.register_forward_hook(on_qkv),
                attn.dense.register_forward_pre_hook(on_dense)]


ADAPTER = FalconAdapter(
    name="falcon",
    model_types=("falcon",),
    layers="h",
    attention="self_attention",
    key_source="",
    rotary=True,
    causal=True,
    derivable_logits=True,
    outside_interface_only=True,
)
