"""The peers ``benchmarks/extract.py`` times beside attnbase: the TransformerLens 4 and nnsight 0.8
scripts a researcher writes to cache keys, queries, attention and the residual stream of every
layer per batch and ``np.save`` them (see extract.py's docstring for what each variant is)."""

from __future__ import annotations

import copy
import os
import shutil
import time
from pathlib import Path

TL = "TransformerLens 4"
TL_HOOKS = ("attn.hook_k", "attn.hook_q", "attn.hook_attn_scores", "hook_resid_pre")
NNS = "nnsight 0.8"


def tl_run(bridge, tokens, batch_size: int, out: Path) -> dict[str, float]:
    """Seconds until the last ``np.save`` returned, and until ``os.sync()`` after it returned
    (the files on disk: attnbase fsyncs every batch before counting it)."""
    import numpy as np
    import torch

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b, first in enumerate(range(0, len(tokens), batch_size)):
            ids = torch.as_tensor(tokens[first:first + batch_size], dtype=torch.long)
            _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n.endswith(TL_HOOKS))
            for name in cache.keys():
                np.save(out / f"b{b}-{name}.npy", cache[name].cpu().numpy())
    saved = time.perf_counter() - t0
    os.sync()  # the .npy files on disk, as attnbase's fsynced chunks are when it returns
    return {TL: saved, TL + " + sync": time.perf_counter() - t0}


def nnsight_model(hf, tokenizer):
    """nnsight's wrapper of an in-memory HF model (its documented entry point for a loaded model)."""
    from nnsight import TransformersModel

    return TransformersModel(hf, tokenizer=tokenizer)


def nnsight_trace(nn_model, ids) -> list:
    """One traced forward of ``ids``: per layer ``(block input, queries, keys, attention
    probabilities)``, the queries and keys ``[batch, pos, d_model]`` (``c_attn``'s output split,
    heads side by side), the probabilities ``[batch, heads, query, key]``."""
    import nnsight

    d = nn_model.config.n_embd
    with nn_model.trace(ids):
        saved = nnsight.save([])
        for block in nn_model.transformer.h:
            resid = block.input
            q, k, _ = block.attn.c_attn.output.split(d, dim=2)
            saved.append((resid, q, k, block.attn.output[1]))
    return saved


def nnsight_check() -> None:
    """Stop unless nnsight's saved values are HF's own on a tiny seeded GPT-2 with eager
    attention: the probabilities are ``output_attentions``, the block inputs
    ``output_hidden_states``, the queries and keys ``c_attn(ln_1(hidden))`` split."""
    import torch
    import transformers as tf

    from attnbase.extract.models import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = tf.GPT2Config(vocab_size=len(tok), n_layer=2, n_head=2, n_embd=16, n_positions=32)
    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ids = torch.randint(0, len(tok), (3, 12))
    with torch.inference_mode():
        ref = hf(input_ids=ids, output_attentions=True, output_hidden_states=True)
        got = nnsight_trace(nnsight_model(copy.deepcopy(hf), tok), ids)
        if len(got) != cfg.n_layer:
            raise SystemExit(f"nnsight saved {len(got)} layers of {cfg.n_layer}")
        for i, (resid, q, k, probs) in enumerate(got):
            block = hf.transformer.h[i]
            q_ref, k_ref, _ = block.attn.c_attn(block.ln_1(ref.hidden_states[i])).split(cfg.n_embd, dim=2)
            for what, a, b in (("block input", resid, ref.hidden_states[i]), ("queries", q, q_ref),
                               ("keys", k, k_ref), ("attention", probs, ref.attentions[i])):
                if a.shape != b.shape or not torch.allclose(a, b, rtol=0, atol=1e-6):
                    raise SystemExit(f"nnsight's {what} of layer {i} are not HF's own: the nnsight "
                                     f"variant would time a wrong capture")


def nnsight_run(nn_model, tokens, batch_size: int, out: Path) -> dict[str, float]:
    """As :func:`tl_run`, with one nnsight trace per batch and ``np.save`` of what it saved."""
    import numpy as np
    import torch

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    names = ("resid_pre", "q", "k", "attn")
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b, first in enumerate(range(0, len(tokens), batch_size)):
            ids = torch.as_tensor(tokens[first:first + batch_size], dtype=torch.long)
            for layer, values in enumerate(nnsight_trace(nn_model, ids)):
                for name, v in zip(names, values):
                    np.save(out / f"b{b}-{layer}-{name}.npy", v.cpu().numpy())
    saved = time.perf_counter() - t0
    os.sync()
    return {NNS: saved, NNS + " + sync": time.perf_counter() - t0}
