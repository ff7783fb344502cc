"""The model types a test proves, with the tiny seeded configuration each is proven on.

One registry for three readers: ``tests/extract/test_families_parity.py`` builds each entry's
model from :data:`PROVEN` (``AutoConfig.for_model(type, **sizes)``, seeded weights, no
download) and checks it against HF's eager attention; ``attnbase models`` and
``docs/models.md`` (:mod:`attnbase.extract.registry`) mark exactly these types proven. Sizes
are small (2-3 layers, hidden 32-64) and every window is shorter than :data:`SEQ_LEN`.
"""

from __future__ import annotations

#: tokens per sequence of the parity tests: longer than every window below
SEQ_LEN = 24

_DEC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
_GQA = dict(_DEC, num_key_value_heads=2)
_ENC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)

#: model_type -> (sizes for ``AutoConfig.for_model``, what the entry shows)
PROVEN: dict[str, tuple[dict, str]] = {
    "qwen3": (dict(_GQA, head_dim=8), "QK-norm, GQA"),
    "qwen3_moe": (dict(_GQA, head_dim=8, moe_intermediate_size=32, num_experts=4,
                       num_experts_per_tok=2), "mixture of experts, QK-norm, GQA"),
    "qwen2_moe": (dict(_GQA, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                       num_experts=4, num_experts_per_tok=2), "mixture of experts, GQA"),
    "olmo2": (dict(_GQA), "QK-norm on the projections"),
    "phi3": (dict(_GQA), "fused qkv, GQA"),
    "gemma2": (dict(_GQA, head_dim=8, sliding_window=8, query_pre_attn_scalar=16,
                    attn_logit_softcapping=50.0),
               "tanh soft-cap, alternating sliding-window layers, query_pre_attn_scalar"),
    "mixtral": (dict(_GQA, num_local_experts=4, num_experts_per_tok=2, sliding_window=12),
                "mixture of experts, model-wide sliding window"),
    "mistral": (dict(_GQA, sliding_window=16), "model-wide sliding window (16 < 24 tokens)"),
    "qwen2": (dict(_GQA), "GQA, biases (the llama adapter)"),
    "starcoder2": (dict(_GQA, sliding_window=12), "sliding window, biases"),
    "stablelm": (dict(_DEC, num_key_value_heads=4, partial_rotary_factor=0.5), "partial rotary (half of d_head)"),
    "gpt_bigcode": (dict(n_embd=32, n_layer=2, n_head=4, multi_query=True),
                    "multi-query attention (one kv head)"),
    "opt": (dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                 word_embed_proj_dim=32), "learned positions"),
    "smollm3": (dict(_GQA, no_rope_layer_interval=2), "NoPE every second layer, GQA"),
    "granite": (dict(_GQA, attention_multiplier=0.2), "attention_multiplier scale"),
    "cohere": (dict(_GQA), "parallel block"),
    "glm4": (dict(_GQA, head_dim=8, partial_rotary_factor=0.5), "interleaved partial rotary"),
    "persimmon": (dict(_DEC, partial_rotary_factor=0.5), "partial rotary, QK layer-norm"),
    "phi": (dict(_DEC, partial_rotary_factor=0.5), "partial rotary, parallel block"),
    "olmo": (dict(_DEC), "non-parametric layer norm"),
    "gemma": (dict(_GQA, head_dim=8), "GQA, scaled embeddings"),
    "helium": (dict(_GQA, head_dim=8), "GQA"),
    "cohere2": (dict(_GQA, sliding_window=8, sliding_window_pattern=2),
                "alternating sliding-window layers"),
    "bloom": (dict(hidden_size=32, n_layer=2, n_head=4), "ALiBi slopes in the logits (own adapter)"),
    "falcon": (dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
               "multi-query, rotary, parallel block; alibi=True stops at load"),
    "roberta": (dict(_ENC), "encoder"),
    "xlm-roberta": (dict(_ENC), "encoder"),
    "distilbert": (dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64), "encoder"),
    "modernbert": (dict(_ENC, num_hidden_layers=3, global_attn_every_n_layers=2,
                        local_attention=8), "encoder, rotary, alternating local (window 4 each "
                                            "side) and global layers"),
}

#: model types proven by the hand-written adapters' own parity tests
#: (tests/extract/test_capture_parity.py, test_gemma3_parity.py, test_families_parity.py)
PROVEN_BY_ADAPTER_TESTS: dict[str, str] = {
    "gpt2": "tests/extract/test_capture_parity.py",
    "gpt_neox": "tests/extract/test_capture_parity.py",
    "llama": "tests/extract/test_capture_parity.py",
    "bert": "tests/extract/test_capture_parity.py",
    "gemma3_text": "tests/extract/test_gemma3_parity.py",
}
