"""Exact parity of captured activations with HF eager attention, for every family."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from attnbase.extract import capture_batches, corpus_windows
from attnbase.extract.attention_call import CAPTURE_ATTN

FAMILY_MODELS = ("tiny-gpt2", "tiny-neox", "tiny-llama", "minilm")

ATOL = 1e-5


@pytest.fixture(scope="module", params=FAMILY_MODELS)
def captured(request, load_lm):
    name = request.param
    lm, ref = load_lm(name), load_lm(name, "eager")
    win = corpus_windows(lm, "default", n_seqs=2, seq_len=16, seed=0)
    (cb,) = list(capture_batches(lm, win.tokens, 2, ("keys", "queries", "logits", "hidden")))
    ids = torch.as_tensor(win.tokens, dtype=torch.long)
    with torch.no_grad():
        eager = ref.model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    return lm, ref, ids, cb, eager


def test_attn_implementation(captured):
    lm, ref, *_ = captured
    assert lm.model.config._attn_implementation == CAPTURE_ATTN
    assert ref.model.config._attn_implementation == "eager"


def test_softmax_of_logits_equals_eager_attentions(captured):
    lm, _, _, cb, eager = captured
    z = torch.from_numpy(cb.arrays["attn_logits"])  # [layer, head, seq, query, key]
    assert len(eager.attentions) == lm.info.n_layers
    for layer, att in enumerate(eager.attentions):  # [seq, head, query, key]
        p = torch.softmax(z[layer].double(), -1).permute(1, 0, 2, 3)
        torch.testing.assert_close(p.float(), att, atol=ATOL, rtol=0)


def test_masked_entries_are_neg_inf(captured):
    lm, _, _, cb, _ = captured
    z = cb.arrays["attn_logits"]
    finite = np.isfinite(z)
    assert np.all(finite | np.isneginf(z))
    assert np.all(np.abs(z[finite]) < 1e3)  # no large negative finite "masked" values
    t = z.shape[-1]
    causal = np.tril(np.ones((t, t), bool))
    if lm.info.causal:
        assert np.array_equal(np.broadcast_to(causal, z.shape), finite)
    else:
        assert finite.all()


def test_queries_dot_keys_reproduce_logits(captured):
    lm, _, _, cb, _ = captured
    info = lm.info
    q = torch.from_numpy(cb.arrays["queries"]).double()  # [layer, head, seq, pos, d]
    k = torch.from_numpy(cb.arrays["keys_rot" if info.rotary else "keys"]).double()
    assert q.shape[1] == info.n_heads and k.shape[1] == info.n_kv_heads
    kv_of_head = torch.arange(info.n_heads) // (info.n_heads // info.n_kv_heads)
    z = torch.from_numpy(cb.arrays["attn_logits"]).double()
    recomputed = q @ k[:, kv_of_head].transpose(-1, -2) * info.d_head**-0.5
    keep = torch.isfinite(z)
    torch.testing.assert_close(recomputed[keep], z[keep], atol=ATOL, rtol=1e-5)


def test_hidden_equals_eager_hidden_states(captured):
    lm, _, _, cb, eager = captured
    h = torch.from_numpy(cb.arrays["hidden"])
    assert h.shape[0] == lm.info.n_layers + 1
    torch.testing.assert_close(h, torch.stack(eager.hidden_states), atol=ATOL, rtol=0)


def test_model_output_unchanged_by_capture(captured):
    lm, _, ids, _, eager = captured
    with torch.no_grad():
        out = lm.model(input_ids=ids)
    torch.testing.assert_close(out.last_hidden_state, eager.last_hidden_state, atol=ATOL, rtol=0)


def test_row_and_col_stats_follow_logits(captured):
    lm, _, _, cb, _ = captured
    z = torch.from_numpy(cb.arrays["attn_logits"]).double()
    p = torch.softmax(z, -1).numpy()
    rs, cs = cb.row_stats, cb.col_stats
    sel = (rs["layer"], rs["head"], rs["seq"] - cb.first_seq, rs["query"])
    np.testing.assert_allclose(rs["sink_mass"], p[sel + (0,)], atol=1e-6)
    np.testing.assert_array_equal(rs["n_keys"], np.isfinite(z.numpy()).sum(-1)[sel])
    np.testing.assert_array_equal(rs["argmax"], p.argmax(-1)[sel])
    csel = (cs["layer"], cs["head"], cs["seq"] - cb.first_seq)
    np.testing.assert_allclose(cs["received"], p.sum(-2)[csel + (cs["key"],)], atol=1e-9)


def _eager_key_projection(ref, ids, layer):
    out = {}
    mod = ref.adapter.key_module(ref.model, layer)
    h = mod.register_forward_hook(lambda m, i, o: out.setdefault("k", o))
    try:
        with torch.no_grad():
            ref.model(input_ids=ids)
    finally:
        h.remove()
    return out["k"]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-neox"])
def test_pre_rope_keys_rotate_into_keys_rot(name, load_lm):
    lm, ref = load_lm(name), load_lm(name, "eager")
    win = corpus_windows(lm, "default", n_seqs=2, seq_len=16, seed=1)
    (cb,) = list(capture_batches(lm, win.tokens, 2, ("keys",)))
    ids = torch.as_tensor(win.tokens, dtype=torch.long)
    info, layer = lm.info, 2
    proj = _eager_key_projection(ref, ids, layer)  # [seq, pos, features]
    keys = torch.from_numpy(cb.arrays["keys"][layer])  # [kv_head, seq, pos, d]
    if name == "tiny-llama":  # k_proj output is [seq, pos, kv_head * d]
        expect = proj.view(2, 16, info.n_kv_heads, info.d_head).permute(2, 0, 1, 3)
    else:  # query_key_value output is per head [H, 3 * d] = [q | k | v]
        expect = proj.view(2, 16, info.n_heads, 3 * info.d_head)[..., info.d_head : 2 * info.d_head]
        expect = expect.permute(2, 0, 1, 3)
    torch.testing.assert_close(keys, expect, atol=0, rtol=0)

    base = ref.model
    modeling = sys.modules[type(base).__module__]
    pos = torch.arange(16)[None].expand(2, -1)
    cos, sin = base.rotary_emb(keys, position_ids=pos)
    k = keys.transpose(0, 1)  # [seq, kv_head, pos, d]
    _, k_rot = modeling.apply_rotary_pos_emb(k, k, cos, sin)
    torch.testing.assert_close(k_rot.transpose(0, 1), torch.from_numpy(cb.arrays["keys_rot"][layer]),
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["tiny-gpt2", "minilm"])
def test_non_rotary_keys_equal_projection(name, load_lm):
    lm, ref = load_lm(name), load_lm(name, "eager")
    win = corpus_windows(lm, "default", n_seqs=2, seq_len=16, seed=1)
    (cb,) = list(capture_batches(lm, win.tokens, 2, ("keys",)))
    assert "keys_rot" not in cb.arrays and "attn_logits" not in cb.arrays
    info = lm.info
    proj = _eager_key_projection(ref, torch.as_tensor(win.tokens, dtype=torch.long), 1)
    if name == "tiny-gpt2":  # c_attn output [q | k | v]
        proj = proj[..., info.d_model : 2 * info.d_model]
    expect = proj.reshape(2, 16, info.n_heads, info.d_head).permute(2, 0, 1, 3)
    torch.testing.assert_close(torch.from_numpy(cb.arrays["keys"][1]), expect, atol=0, rtol=0)


def test_gqa_head_mapping(load_lm):
    """Query head h of tiny-llama reads kv head h // 2, and no other mapping fits."""
    lm = load_lm("tiny-llama")
    assert (lm.info.n_heads, lm.info.n_kv_heads) == (4, 2)
    win = corpus_windows(lm, "default", n_seqs=1, seq_len=16, seed=2)
    (cb,) = list(capture_batches(lm, win.tokens, 1, ("keys", "queries", "logits")))
    q = torch.from_numpy(cb.arrays["queries"][0, :, 0]).double()  # [head, pos, d]
    k = torch.from_numpy(cb.arrays["keys_rot"][0, :, 0]).double()  # [kv_head, pos, d]
    z = torch.from_numpy(cb.arrays["attn_logits"][0, :, 0]).double()
    keep = torch.isfinite(z[0])
    for h in range(4):
        errs = [float((q[h] @ k[g].T * 0.25 - z[h])[keep].abs().max()) for g in range(2)]
        assert errs[h // 2] < 1e-5 and errs[1 - h // 2] > 1e-3


def test_start_batch_and_seq_index(load_lm):
    lm = load_lm("tiny-gpt2")
    win = corpus_windows(lm, "default", n_seqs=5, seq_len=8, seed=0)
    full = list(capture_batches(lm, win.tokens, 2, ("logits",)))
    tail = list(capture_batches(lm, win.tokens, 2, ("logits",), start_batch=1))
    assert [(c.batch, c.first_seq, c.n_seqs) for c in full] == [(0, 0, 2), (1, 2, 2), (2, 4, 1)]
    assert [(c.batch, c.first_seq) for c in tail] == [(1, 2), (2, 4)]
    np.testing.assert_array_equal(tail[1].arrays["attn_logits"], full[2].arrays["attn_logits"])
    np.testing.assert_array_equal(tail[1].arrays["tokens"], win.tokens[4:5])
    assert set(np.unique(full[1].row_stats["seq"])) == {2, 3}


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_reused_buffers_give_the_fresh_arrays(name, load_lm):
    """``reuse_buffers=True`` (the runner's mode) writes every batch into one set of arrays:
    consumed batch by batch, including the shorter last batch, it gives exactly the arrays and
    statistics of fresh per-batch arrays; a batch kept past the next one is overwritten."""
    lm = load_lm(name)
    win = corpus_windows(lm, "default", n_seqs=5, seq_len=8, seed=0)
    want = ("keys", "queries", "logits", "hidden")
    fresh = list(capture_batches(lm, win.tokens, 2, want))
    kept = []
    for cb in capture_batches(lm, win.tokens, 2, want, reuse_buffers=True):
        kept.append(cb)
        ref = fresh[cb.batch]
        assert set(cb.arrays) == set(ref.arrays)
        for a in ref.arrays:
            np.testing.assert_array_equal(cb.arrays[a], ref.arrays[a], err_msg=a)
        for s in ref.row_stats:
            np.testing.assert_array_equal(cb.row_stats[s], ref.row_stats[s], err_msg=s)
        np.testing.assert_array_equal(cb.col_stats["received"], ref.col_stats["received"])
    assert np.shares_memory(kept[0].arrays["attn_logits"], kept[1].arrays["attn_logits"])
    assert kept[2].arrays["keys"].shape[2] == 1  # the last batch got arrays of its own shape


@pytest.mark.parametrize("dtype,stored", [("float16", np.float16), ("bfloat16", np.float32)])
def test_store_dtype(dtype, stored):
    from attnbase.extract import load_model

    lm = load_model("tiny-gpt2", dtype=dtype, device="cpu")
    win = corpus_windows(lm, "default", n_seqs=1, seq_len=8, seed=0)
    (cb,) = list(capture_batches(lm, win.tokens, 1, ("keys", "logits", "hidden")))
    assert {a.dtype for n, a in cb.arrays.items() if n != "tokens"} == {np.dtype(stored)}
    assert np.isneginf(cb.arrays["attn_logits"][0, 0, 0, 0, 1])


def test_minilm_cls_sink(load_lm):
    lm = load_lm("minilm")
    win = corpus_windows(lm, "default", n_seqs=2, seq_len=32, seed=0)
    (cb,) = list(capture_batches(lm, win.tokens, 2, ()))
    rs = cb.row_stats
    for layer in range(1, 5):
        mass = rs["sink_mass"][rs["layer"] == layer].mean()
        assert mass > 4 / 32, (layer, mass)  # uniform would be 1/T
