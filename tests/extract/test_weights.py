"""Per-head W_Q, W_K read from the real modules reproduce the captured logits (docs/metrics.md §7)."""

import numpy as np
import pytest
import torch

from attnbase.extract import capture_batches
from attnbase.extract.weights import layer_qk, model_qk
from attnbase.stats.spectral import bilinear_logits


def _attention_input(lm, layer: int, hidden: np.ndarray) -> np.ndarray:
    """What the attention module of ``layer`` receives: hidden[layer] (post-LN BERT) or the
    block's pre-attention norm of it (pre-LN GPT-2: ``ln_1``)."""
    h = hidden[layer]
    if lm.adapter.name == "gpt2":
        block = lm.adapter.blocks(lm.model)[layer]
        with torch.no_grad():
            return block.ln_1(torch.from_numpy(h)).double().numpy()
    return h.astype(np.float64)


@pytest.mark.parametrize("name", ["tiny-gpt2", "minilm"])
def test_form_with_biases_reproduces_captured_logits(name, load_lm):
    lm = load_lm(name)
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 200, size=(2, 12)).astype(np.int32)
    cb = next(capture_batches(lm, tokens, batch_size=2, capture=("logits", "hidden")))
    z, hidden = cb.arrays["attn_logits"], cb.arrays["hidden"]
    for layer in (0, lm.info.n_layers - 1):
        qk = layer_qk(lm, layer)
        assert qk.b_q is not None and qk.b_k is not None  # both families have q/k biases
        x = _attention_input(lm, layer, hidden)
        for h in range(lm.info.n_heads):
            g = qk.kv_of_head[h]
            want = z[layer, h].astype(np.float64)
            got = bilinear_logits(x, qk.w_q[h], qk.w_k[g], qk.b_q[h], qk.b_k[g], qk.scale)
            ok = np.isfinite(want)
            np.testing.assert_allclose(got[ok], want[ok], rtol=1e-4, atol=1e-4 * np.abs(want[ok]).max())


@pytest.mark.parametrize("name", ["tiny-neox", "tiny-llama"])
def test_rotary_families_reproduce_prerope_projections(name, load_lm):
    # for rotary families M is the form before rotation: check q = x W_Q + b_q and k = x W_K + b_k
    # against the captured pre-RoPE keys (keys) for every layer
    lm = load_lm(name)
    tokens = np.random.default_rng(1).integers(5, 200, size=(1, 8)).astype(np.int32)
    cb = next(capture_batches(lm, tokens, batch_size=1, capture=("keys", "hidden")))
    blocks = lm.adapter.blocks(lm.model)
    for layer, qk in enumerate(model_qk(lm)):
        norm = blocks[layer].input_layernorm
        with torch.no_grad():
            x = norm(torch.from_numpy(cb.arrays["hidden"][layer])).double().numpy()
        k = np.einsum("spd,gde->gspe", x, qk.w_k)
        if qk.b_k is not None:
            k = k + qk.b_k[:, None, None, :]
        np.testing.assert_allclose(k, cb.arrays["keys"][layer], rtol=1e-4, atol=1e-5)
    assert qk.w_q.shape == (lm.info.n_heads, lm.info.d_model, lm.info.d_head)
    assert qk.w_k.shape == (lm.info.n_kv_heads, lm.info.d_model, lm.info.d_head)
    assert list(qk.kv_of_head) == [h // (lm.info.n_heads // lm.info.n_kv_heads)
                                   for h in range(lm.info.n_heads)]


def test_gemma3_qk_norm_gains_folded(load_lm):
    # with unit RMS per head the QK-norm is the gain alone: then the folded form is exact
    lm = load_lm("tiny-gemma3")
    qk = layer_qk(lm, 0)
    mod = lm.adapter.attention_module(lm.model, 0)
    g_q = 1.0 + mod.q_norm.weight.detach().double().numpy()
    raw = mod.q_proj.weight.detach().double().numpy().reshape(lm.info.n_heads, lm.info.d_head, -1)
    np.testing.assert_allclose(qk.w_q, raw.transpose(0, 2, 1) * g_q)
    assert "ignores the RMS normalisation" in qk.note
    # the normalised logits are the folded form divided by the per-token RMS of q and k
    tokens = np.random.default_rng(2).integers(5, 200, size=(1, 8)).astype(np.int32)
    cb = next(capture_batches(lm, tokens, batch_size=1, capture=("keys", "hidden")))
    block = lm.adapter.blocks(lm.model)[0]
    with torch.no_grad():
        x = block.input_layernorm(torch.from_numpy(cb.arrays["hidden"][0])).double().numpy()[0]
    raw_k = x @ (mod.k_proj.weight.detach().double().numpy().T)
    raw_k = raw_k.reshape(8, lm.info.n_kv_heads, lm.info.d_head)
    rms = np.sqrt((raw_k ** 2).mean(-1) + mod.k_norm.eps)  # (pos, kv_head)
    want = cb.arrays["keys"][0][:, 0]  # (kv_head, pos, d_head): k_norm output
    got = np.einsum("pd,gde->gpe", x, qk.w_k) / rms.T[:, :, None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
