"""Head masks through the model's own attention path, and the scores pruning is judged by.

docs/metrics.md §5 (pruning): a masked head's output is zeroed *before the output projection*, so
the model's own attention computes everything else unchanged. :func:`head_mask` does this with a
forward pre-hook on each layer's output projection (the module whose input is the concatenation
of the heads' outputs, head ``h`` at features ``h * d_head : (h + 1) * d_head``); nothing of the
attention is re-implemented.

Scores: :func:`perplexity` (causal LMs: ``exp`` of the mean next-token loss, logits from the
model's LM head -- the tied input embeddings, or the checkpoint's own head) and
:func:`pooled_embeddings` (encoders: mean-pooled last hidden state, as sentence-transformers
pools all-MiniLM-L6-v2).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import numpy as np
import torch

from attnbase.errors import ExtractError

#: Per family adapter: the output projection inside a block (input = concatenated head outputs).
OUTPUT_PROJECTION: dict[str, str] = {
    "gpt2": "attn.c_proj",
    "gpt_neox": "attention.dense",
    "llama": "self_attn.o_proj",
    "bert": "attention.output.dense",
    "gemma3": "self_attn.o_proj",
    "bloom": "self_attention.dense",
    "falcon": "self_attention.dense",
    # vision transformers on the generic capture (its family name is the model type)
    "vit": "attention.o_proj",
    "deit": "attention.o_proj",
    "dinov2_with_registers": "attention.o_proj",
}


def output_projection(lm, layer: int) -> torch.nn.Module:
    """The module whose input holds layer ``layer``'s concatenated head outputs."""
    from attnbase.extract.families.base import _resolve

    name = lm.adapter.name
    path = getattr(lm.adapter, "output_projection", None) or OUTPUT_PROJECTION.get(name)
    if path is None:
        raise ExtractError(f"no output projection known for family {name!r}; add it to "
                           f"attnbase.extract.surgery.OUTPUT_PROJECTION ({', '.join(OUTPUT_PROJECTION)})")
    return _resolve(lm.adapter.blocks(lm.model)[layer], path, "output projection")


@contextmanager
def head_mask(lm, heads: Iterable[tuple[int, int]]) -> Iterator[None]:
    """Zero the outputs of ``heads`` ((layer, head) pairs) inside the ``with`` block.

    Example::

        with head_mask(lm, [(3, 5), (7, 0)]):
            out = lm.model(input_ids=ids)
    """
    info = lm.info
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        if not (0 <= layer < info.n_layers and 0 <= head < info.n_heads):
            raise ExtractError(f"head L{layer}H{head} does not exist in {info.model} "
                               f"({info.n_layers} layers x {info.n_heads} heads)")
        by_layer.setdefault(int(layer), []).append(int(head))
    d = info.d_head
    handles = []

    def make_hook(hs: list[int]):
        cols = torch.tensor([h * d + k for h in hs for k in range(d)])

        def hook(module, args):
            x = args[0]
            if x.shape[-1] != info.n_heads * d:
                raise ExtractError(f"output projection input has {x.shape[-1]} features, "
                                   f"expected n_heads * d_head = {info.n_heads * d}")
            x = x.clone()
            x[..., cols.to(x.device)] = 0
            return (x, *args[1:])

        return hook

    try:
        for layer, hs in by_layer.items():
            handles.append(output_projection(lm, layer).register_forward_pre_hook(make_hook(hs)))
        yield
    finally:
        for h in handles:
            h.remove()


def lm_head(lm, source: str | None):
    """``hidden -> logits``: tied input embeddings, or the LM head of the checkpoint ``source``."""
    cfg = lm.model.config
    tied = getattr(cfg, "tie_word_embeddings", False) or getattr(
        getattr(cfg, "get_text_config", lambda: cfg)(), "tie_word_embeddings", False)
    if tied:
        weight = lm.model.get_input_embeddings().weight
        return lambda h: h @ weight.T
    if source is not None:
        from pathlib import Path

        if Path(source).is_dir():
            from transformers import AutoModelForCausalLM

            head = AutoModelForCausalLM.from_pretrained(source, dtype=lm.model.dtype)
            out = head.get_output_embeddings().to(lm.device).eval()
            return out
    raise ExtractError(f"model {lm.info.model!r} has no tied LM head and no checkpoint directory to "
                       "read one from; perplexity needs the model's LM head (pass a local model "
                       "directory)")


@torch.no_grad()
def perplexity(lm, tokens: np.ndarray, *, batch_size: int = 8, source: str | None = None,
               head=None) -> float:
    """``exp`` of the mean next-token cross-entropy over windows ``tokens (seq, pos)``."""
    if not lm.info.causal:
        raise ExtractError(f"{lm.info.model} is an encoder: score it with pooled_embeddings")
    head = head or lm_head(lm, source)
    total, count = 0.0, 0
    for s in range(0, len(tokens), batch_size):
        ids = torch.as_tensor(tokens[s: s + batch_size], dtype=torch.long, device=lm.device)
        hidden = lm.model(input_ids=ids).last_hidden_state
        logits = head(hidden[:, :-1]).float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1), reduction="sum")
        total += float(loss)
        count += ids[:, 1:].numel()
    return float(np.exp(total / count))


@torch.no_grad()
def predictions(lm, pixels: np.ndarray, *, batch_size: int = 16) -> np.ndarray:
    """Top-1 class of an image classifier per image ``pixels (seq, channel, height, width)``."""
    if not hasattr(lm.model, "classifier"):
        raise ExtractError(f"{lm.info.model!r} has no image-classification head; top-1 agreement "
                           "needs a ...ForImageClassification checkpoint")
    dtype = next(lm.model.parameters()).dtype
    out = []
    for s in range(0, len(pixels), batch_size):
        px = torch.as_tensor(pixels[s: s + batch_size], device=lm.device).to(dtype)
        out.append(lm.model(pixel_values=px).logits.argmax(-1).cpu().numpy())
    return np.concatenate(out)


@torch.no_grad()
def pooled_embeddings(lm, tokens: np.ndarray, *, batch_size: int = 16) -> np.ndarray:
    """Mean-pooled last hidden states ``(seq, d_model)`` (windows are unpadded)."""
    out = []
    for s in range(0, len(tokens), batch_size):
        ids = torch.as_tensor(tokens[s: s + batch_size], dtype=torch.long, device=lm.device)
        out.append(lm.model(input_ids=ids).last_hidden_state.mean(1).float().cpu().numpy())
    return np.concatenate(out).astype(np.float64)
