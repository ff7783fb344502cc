"""Every proven model type (attnbase.extract.proven.PROVEN) against plain HF eager attention.

Each type is built from a tiny seeded config (``AutoConfig.for_model``, no download) twice with
the same weights: once with the capture's attention, once with ``attn_implementation="eager"``.
The oracle is the eager model alone: its ``output_attentions``, and what its own modeling
module's ``apply_rotary_pos_emb`` and ``eager_attention_forward`` receive (wrapped here, in the
test). Sequences are longer than every window.
"""

from __future__ import annotations

import copy
import sys
from contextlib import contextmanager
import warnings

import numpy as np
import pytest
import torch

from attnbase.errors import ExtractError
from attnbase.extract import capture_batches, corpus_windows
from attnbase.extract.attention_call import CAPTURE_ATTN, ensure_registered
from attnbase.extract.families import prepare
from attnbase.extract.models import loaded, tiny_tokenizer
from attnbase.extract.proven import PROVEN, SEQ_LEN
from attnbase.logits import derive_layer

ATOL = 1e-5


def build(model_type: str, **overrides):
    """``(capture LoadedModel, eager model, tokens [2, SEQ_LEN])`` of a seeded tiny config."""
    from transformers import AutoConfig, AutoModel

    ensure_registered()
    prepare(model_type, CAPTURE_ATTN)
    tok = tiny_tokenizer()
    sizes = dict(PROVEN[model_type][0], **overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = AutoConfig.for_model(model_type, vocab_size=len(tok), pad_token_id=0,
                                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                   **sizes)
        torch.manual_seed(0)
        model = AutoModel.from_config(copy.deepcopy(cfg), attn_implementation=CAPTURE_ATTN)
        eager = AutoModel.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    lm = loaded(model, tok, model_type, "seed:0")
    win = corpus_windows(lm, "default", n_seqs=2, seq_len=SEQ_LEN, seed=0)
    return lm, eager.eval(), win.tokens


def eager_oracle(eager, tokens):
    """The eager model's attentions and, per layer, what its modeling module's functions saw:
    ``rope`` (keys in, keys out of ``apply_rotary_pos_emb``, or None) and ``attn`` (query, key,
    mask of ``eager_attention_forward``)."""
    mod = sys.modules[type(eager).__module__]
    calls, pending = [], []
    if hasattr(mod, "BloomAttention"):
        return _bloom_oracle(eager, tokens, mod)
    if hasattr(mod, "FalconAttention") and not hasattr(mod, "eager_attention_forward"):
        return _falcon_oracle(eager, tokens, mod)  # transformers <= 5.24: no interface
    orig_attn = mod.eager_attention_forward
    orig_rope = getattr(mod, "apply_rotary_pos_emb", None)

    def rope(q, k, *a, **kw):
        out = orig_rope(q, k, *a, **kw)
        pending.append((k.clone(), out[1].clone()))
        return out

    def attn(module, query, key, value, attention_mask, *a, **kw):
        calls.append(dict(rope=pending.pop() if pending else None, query=query.clone(),
                          key=key.clone(), mask=attention_mask))
        pending.clear()
        return orig_attn(module, query, key, value, attention_mask, *a, **kw)

    patches = [(mod, "eager_attention_forward", attn)]
    if orig_rope is not None:
        patches.append((mod, "apply_rotary_pos_emb", rope))
    with _patched(patches):
        return _eager_attentions(eager, tokens), calls


@contextmanager
def _patched(patches):
    """``(owner, name, replacement)`` set in place for the block, the originals put back."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, fn in patches:
        setattr(owner, name, fn)
    try:
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


@contextmanager
def _masks_received(eager, cls):
    """The ``attention_mask`` each module of ``cls`` receives, appended in call order."""
    masks = []
    hooks = [m.register_forward_pre_hook(lambda _m, a, kw: masks.append(kw["attention_mask"]),
                                         with_kwargs=True)
             for m in eager.modules() if isinstance(m, cls)]
    try:
        yield masks
    finally:
        for h in hooks:
            h.remove()


def _eager_attentions(eager, tokens):
    with torch.no_grad():
        return eager(input_ids=torch.as_tensor(tokens, dtype=torch.long),
                     output_attentions=True, use_cache=False).attentions


def _bloom_oracle(eager, tokens, mod):
    """BLOOM (no attention interface): queries and keys as its attention class's own
    ``_reshape`` returns them, the mask its attention module receives."""
    calls = []
    cls = mod.BloomAttention
    orig = cls._reshape

    with _masks_received(eager, cls) as masks:
        def _reshape(self, fused):
            q, k, v = orig(self, fused)
            calls.append(dict(rope=None, query=q.clone(), key=k.clone(), mask=masks.pop()))
            return q, k, v

        with _patched([(cls, "_reshape", _reshape)]):
            return _eager_attentions(eager, tokens), calls


def _falcon_oracle(eager, tokens, mod):
    """Falcon (no attention interface): pre- and post-RoPE queries and keys as its modeling
    module's own ``apply_rotary_pos_emb`` sees them, the mask its attention module receives."""
    calls = []
    orig = mod.apply_rotary_pos_emb

    with _masks_received(eager, mod.FalconAttention) as masks:
        def rope(q, k, *a, **kw):
            out = orig(q, k, *a, **kw)
            calls.append(dict(rope=(k.clone(), out[1].clone()), query=out[0].clone(),
                              key=out[1].clone(), mask=masks.pop()))
            return out

        with _patched([(mod, "apply_rotary_pos_emb", rope)]):
            return _eager_attentions(eager, tokens), calls


def _kv_layout(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[batch, kv_head, pos, d]`` given the post-RoPE key ``like`` of that layout."""
    if t.shape[1] == like.shape[1] and t.shape[2] == like.shape[2]:
        return t
    return t.transpose(1, 2)


#: run by default: one of each mechanism (soft-cap + alternating windows, model-wide window,
#: multi-query, partial rotary, NoPE layers, bidirectional windows, a plain encoder); the
#: other types are the slow part (``make test-slow``), about 2 s each on 2 busy cores
FAST = ("bloom", "falcon", "gemma2", "mistral", "gpt_bigcode", "stablelm", "smollm3", "modernbert", "distilbert")


@pytest.fixture(scope="module", params=[
    pytest.param(t, marks=() if t in FAST else pytest.mark.slow) for t in sorted(PROVEN)])
def family(request):
    lm, eager, tokens = build(request.param)
    (cb,) = list(capture_batches(lm, tokens, 2, ("keys", "queries", "logits")))
    attentions, calls = eager_oracle(eager, tokens)
    return request.param, lm, cb, attentions, calls, tokens


def test_probabilities_equal_eager(family):
    _, lm, cb, attentions, _, _ = family
    z = torch.from_numpy(cb.arrays["attn_logits"])
    assert len(attentions) == lm.info.n_layers
    for layer, att in enumerate(attentions):  # [seq, head, query, key]
        p = torch.softmax(z[layer].double(), -1).permute(1, 0, 2, 3)
        torch.testing.assert_close(p.float(), att, atol=ATOL, rtol=0)


def test_neg_inf_where_eager_masks(family):
    _, lm, cb, _, calls, _ = family
    z = cb.arrays["attn_logits"]
    assert np.all(np.isfinite(z) | np.isneginf(z))
    for layer, call in enumerate(calls):
        mask = call["mask"]
        if mask is None:
            blocked = np.zeros(z.shape[-2:], dtype=bool)
        elif mask.dtype == torch.bool:
            blocked = (~mask).numpy()
        else:
            blocked = (mask <= torch.finfo(mask.dtype).min / 2).numpy()
        if blocked.ndim == 4:  # [batch, 1, query, key]
            blocked = blocked[:, 0]
        want = np.broadcast_to(blocked, z[layer].shape)  # z: [head, batch, query, key]
        assert np.array_equal(np.isneginf(z[layer]), want), f"layer {layer}"


def test_windows_shorter_than_sequences(family):
    model_type, lm, cb, *_ = family
    windows = [w for w in lm.info.logits_recipe.window if w is not None]
    assert all(w < SEQ_LEN for w in windows)
    if model_type in ("gemma2", "mistral", "mixtral", "starcoder2", "cohere2", "modernbert"):
        assert windows, f"{model_type} was meant to have a sliding window"
        z = cb.arrays["attn_logits"]
        # some row of a causal windowed layer has key 0 masked though it precedes the query
        assert np.isneginf(z[..., SEQ_LEN - 1, 0]).any()


def test_queries_and_keys_are_what_the_modeling_functions_see(family):
    _, lm, cb, _, calls, _ = family
    q, k = cb.arrays["queries"], cb.arrays["keys"]
    k_rot = cb.arrays.get("keys_rot")
    for layer, call in enumerate(calls):
        post = call["key"]  # [batch, kv_head, pos, d]
        torch.testing.assert_close(torch.from_numpy(q[layer]).transpose(0, 1), call["query"],
                                   atol=1e-6, rtol=0)
        if k_rot is not None:
            torch.testing.assert_close(torch.from_numpy(k_rot[layer]).transpose(0, 1), post,
                                       atol=1e-6, rtol=0)
        pre = torch.from_numpy(k[layer]).transpose(0, 1)
        if call["rope"] is None:  # no rotary in this layer: pre = post
            torch.testing.assert_close(pre, post, atol=1e-6, rtol=0)
            continue
        k_in, k_out = (_kv_layout(t, post) for t in call["rope"])
        d = k_in.shape[-1]
        torch.testing.assert_close(pre[..., :d], k_in, atol=1e-6, rtol=0)
        torch.testing.assert_close(pre[..., d:], post[..., d:], atol=1e-6, rtol=0)
        assert not torch.allclose(k_in, k_out)  # the rotation did something


def test_derived_logits_equal_stored_bit_for_bit(family):
    _, lm, cb, _, _, tokens = family
    r = lm.info.logits_recipe
    assert r is not None
    (derived_run,) = list(capture_batches(lm, tokens, 2, ("keys", "queries")))
    assert "attn_logits" not in derived_run.arrays  # checked at every call, stored nowhere
    for layer in range(lm.info.n_layers):
        z = derive_layer(cb.arrays["queries"][layer], cb.arrays[r.keys][layer],
                         scale=r.scale[layer], causal=r.causal, window=r.window[layer],
                         softcap=r.softcap_of(layer), alibi=r.alibi)
        assert np.array_equal(z, cb.arrays["attn_logits"][layer]), f"layer {layer}"


def test_bloom_recipe_holds_its_alibi_slopes():
    lm, _, _ = build("bloom")
    # 4 heads: 2^(-8/4 * (h + 1)) (Press et al.), as transformers builds them
    assert lm.info.logits_recipe.alibi == (0.25, 0.0625, 0.015625, 0.00390625)


def test_gemma2_recipe_holds_its_soft_cap():
    lm, _, _ = build("gemma2")
    assert lm.info.logits_recipe.softcap == (50.0, 50.0)
    assert lm.info.logits_recipe.window == (8, None)


# --- negative controls: a term the recipe does not know stops the run with one line ------------

def _one_line_error(lm, tokens, capture, match):
    with pytest.raises(ExtractError, match=match) as e:
        list(capture_batches(lm, tokens, 2, capture))
    assert "\n" not in str(e.value)


def test_soft_cap_behind_the_recipes_back_stops():
    lm, _, tokens = build("gemma2", attn_logit_softcapping=None)
    assert lm.info.logits_recipe.softcap is None
    list(capture_batches(lm, tokens, 2, ("keys", "queries")))  # the recipe holds
    for block in lm.adapter.blocks(lm.model):
        block.self_attn.attn_logit_softcapping = 30.0
    _one_line_error(lm, tokens, ("keys", "queries"), "soft-caps its logits at 30.0, not None")


def test_window_behind_the_recipes_back_stops():
    lm, _, tokens = build("mistral")
    lm.model.config.sliding_window = 8  # the mask follows the config, the recipe says 16
    _one_line_error(lm, tokens, ("keys", "queries"), "not the rule its logits recipe declares")


def test_a_term_inside_the_eager_function_stops(monkeypatch):
    lm, _, tokens = build("gemma2")
    mod = sys.modules[type(lm.model).__module__]
    orig = mod.eager_attention_forward

    def with_a_bias(module, q, k, v, mask, *a, **kw):  # a sink bias on key 0, in the eager code
        bias = torch.zeros_like(mask)
        bias[..., 0] = 3.0
        return orig(module, q, k, v, mask + bias, *a, **kw)

    monkeypatch.setattr(mod, "eager_attention_forward", with_a_bias)
    _one_line_error(lm, tokens, ("keys", "queries", "logits"),
                    "attention adds a term the capture does not form")


def test_an_unknown_attention_argument_stops(monkeypatch):
    lm, _, tokens = build("qwen3")
    from attnbase.extract import attention_call as cap

    orig = cap.capture_attention_forward

    def with_sinks(module, q, k, v, mask, **kw):
        return orig(module, q, k, v, mask, s_aux=torch.zeros(q.shape[1]), **kw)

    from transformers import AttentionInterface

    AttentionInterface.register(CAPTURE_ATTN, with_sinks)
    try:
        _one_line_error(lm, tokens, ("keys", "queries"), "passes s_aux to its attention function")
    finally:
        AttentionInterface.register(CAPTURE_ATTN, orig)


def test_alibi_behind_the_recipes_back_stops(monkeypatch):
    lm, _, tokens = build("bloom")
    mod = sys.modules[type(lm.model).__module__]
    orig = mod._get_alibi_slopes  # what BloomModel.forward builds an unpadded batch's ALiBi from

    def steeper(*a, **kw):
        return orig(*a, **kw) * 2

    monkeypatch.setattr(mod, "_get_alibi_slopes", steeper)
    _one_line_error(lm, tokens, ("keys", "queries"), "ALiBi bias is not slope")
