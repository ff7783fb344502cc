"""Ablation variants by surgery: each equals a hand-written forward of the ablated block."""

import numpy as np
import pytest
import torch

from attnbase.errors import ExtractError, UnsupportedArchitectureError
from attnbase.extract import ExtractConfig, capture_batches
from attnbase.extract.variants import VARIANTS, apply_variant, load_variant

TOKENS = np.random.default_rng(0).integers(5, 200, size=(2, 10)).astype(np.int32)


def hidden_of(lm):
    cb = next(capture_batches(lm, TOKENS, batch_size=2, capture=("hidden",)))
    return cb.arrays["hidden"].astype(np.float64)


def _prenorm_block(block, names, h, variant):
    n1, attn, n2, mlp = (getattr(block, n) for n in names)
    a = attn(n1(h), **_ROPE)[0]  # causal mask (and llama's rotary embeddings) as the model passes
    h1 = a if variant in ("no-skip", "attention-only") else h + a
    if variant in ("no-mlp", "attention-only"):
        return h1
    m = mlp(n2(h1))
    return m if variant == "no-skip" else h1 + m


_ROPE: dict = {}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_prenorm_variant_equals_manual_block(name, variant):
    lm = load_variant(name, variant=variant, device="cpu")
    hid = hidden_of(lm)
    plain = load_variant(name, device="cpu")  # same seeded weights, no hooks: the reference
    blocks = plain.adapter.blocks(plain.model)
    names = (("ln_1", "attn", "ln_2", "mlp") if name == "tiny-gpt2" else
             ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"))
    # hidden[l+1] = block_l(hidden[l]) for every block but the last (GPT-2 applies ln_f there)
    with torch.no_grad():
        h = torch.from_numpy(hid[0]).float()
        _ROPE.clear()
        _ROPE["attention_mask"] = torch.triu(torch.full((h.shape[1],) * 2, float("-inf")), 1)[None, None]
        if name == "tiny-llama":
            pos = torch.arange(h.shape[1])[None].expand(h.shape[0], -1)
            _ROPE["position_embeddings"] = lm.model.rotary_emb(h, pos)
        for layer in range(lm.info.n_layers - 1):
            want = _prenorm_block(blocks[layer], names, torch.from_numpy(hid[layer]).float(), variant)
            np.testing.assert_allclose(hid[layer + 1], want.double().numpy(), rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} {variant} layer {layer}")


def test_bert_variants_change_the_stream_as_designed(load_lm):
    full = hidden_of(load_variant("minilm", device="cpu"))
    outs = {v: hidden_of(load_variant("minilm", variant=v, device="cpu")) for v in VARIANTS[1:]}
    lm = load_lm("minilm", "eager")
    layer0 = lm.adapter.blocks(lm.model)[0]
    h = torch.from_numpy(full[0]).float()
    with torch.no_grad():
        ctx = layer0.attention.self(h)[0]
        dense = layer0.attention.output.dense(ctx)
        ln = layer0.attention.output.LayerNorm
        with_skip, without = ln(dense + h), ln(dense)
        mlp = lambda a, skip: layer0.output.LayerNorm(  # noqa: E731
            layer0.output.dense(layer0.intermediate(a)) + (a if skip else 0))
        want = {"no-mlp": with_skip, "attention-only": without, "no-skip": mlp(without, False)}
    with torch.no_grad():
        np.testing.assert_allclose(full[1], mlp(with_skip, True).double().numpy(), atol=1e-4)
    for v, w in want.items():
        np.testing.assert_allclose(outs[v][1], w.double().numpy(), atol=1e-4, err_msg=v)
    # embeddings are untouched by surgery
    for v in outs:
        np.testing.assert_allclose(outs[v][0], full[0])


def test_random_init_is_seeded_and_recorded():
    a = load_variant("minilm", init="random", seed=3, device="cpu")
    b = load_variant("minilm", init="random", seed=3, device="cpu")
    c = load_variant("minilm", init="random", seed=4, device="cpu")
    pa, pb, pc = (next(m.model.encoder.parameters()).detach() for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert a.info.model_revision.endswith("+random-init:seed=3")
    pre = load_variant("minilm", device="cpu")
    assert not torch.equal(pa, next(pre.model.encoder.parameters()).detach())


def test_config_hash_records_variant_only_when_set():
    base = ExtractConfig(model="minilm")
    h = dict(model_revision="r", corpus_hash="c")
    assert "variant" not in base.hash_fields(**h) and "init" not in base.hash_fields(**h)
    v = ExtractConfig(model="minilm", variant="no-skip", init="random", init_seed=2)
    assert v.hash_fields(**h)["variant"] == "no-skip" and v.hash_fields(**h)["init"] == "random"
    assert len({base.config_hash(**h), v.config_hash(**h),
                ExtractConfig(model="minilm", init="random").config_hash(**h)}) == 3
    with pytest.raises(ExtractError, match="unknown --variant 'no-attn'"):
        ExtractConfig(model="minilm", variant="no-attn")
    with pytest.raises(ExtractError, match="unknown --init 'zeros'"):
        ExtractConfig(model="minilm", init="zeros")


def test_unsupported_family_raises(load_lm):
    lm = load_variant("tiny-neox", device="cpu")
    with pytest.raises(UnsupportedArchitectureError, match="families with ablation variants"):
        apply_variant(lm, "no-skip")
