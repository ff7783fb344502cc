"""Per-head query/key weights read from a model's real modules, in one convention.

Every family returns :class:`LayerQK` in the convention ``q_h = x @ w_q[h] + b_q[h]`` and
``k_g = x @ w_k[g] + b_k[g]`` with ``x`` the attention module's input ``(pos, d_model)``, so the
head's bilinear form is ``M_h = w_q[h] @ w_k[kv_of_head[h]].T`` and its logits are
``(x M_h x^T + bias terms) * scale`` (docs/metrics.md §7). Module paths are the family adapter's
attention module plus the HF attribute names of that architecture:

- ``bert``: ``attention.self.query`` / ``.key`` (``nn.Linear``, weight ``(out, in)``).
- ``gpt2``: ``attn.c_attn`` (``Conv1D``, weight ``(in, 3 d_model)`` = ``[q | k | v]``).
- ``gpt_neox``: ``attention.query_key_value`` (``nn.Linear``), output laid out per head as
  ``[H, 3 d_head]`` = ``[q_h | k_h | v_h]`` (GPTNeoXAttention.forward's view + chunk).
- ``llama`` (llama, mistral, qwen2): ``self_attn.q_proj`` / ``k_proj``; GQA: query head ``h``
  reads kv head ``h // (H / H_kv)``.
- ``gemma3``: as llama, plus QK-norm (``self_attn.q_norm`` / ``k_norm``, RMSNorm with gain
  ``1 + w`` over ``d_head``): the gains are folded into the columns of ``w_q`` / ``w_k``; the form
  ignores the per-token RMS normalisation of q and k.

Rotary families: RoPE rotates q and k by position after these projections, so ``M`` is the form
*before* rotation (the logit of tokens at positions i, j is ``x_i W_Q R_{j-i} W_K^T x_j^T``).
Pre-LN families (gpt2, gpt_neox, llama): ``x`` is the *normalised* residual stream, and the
LayerNorm/RMSNorm gain is not folded into ``M``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from attnbase.errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class LayerQK:
    """Query/key weights of one layer: ``w_q (head, d_model, d_head)``, ``w_k (kv_head, d_model,
    d_head)``, biases ``(head, d_head)`` / ``(kv_head, d_head)`` or None, the logit ``scale`` and
    ``kv_of_head (head,)``. ``note`` says what the form ignores (e.g. QK-norm)."""

    layer: int
    w_q: np.ndarray
    w_k: np.ndarray
    b_q: np.ndarray | None
    b_k: np.ndarray | None
    scale: float
    kv_of_head: np.ndarray
    note: str = ""

    def head_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(w_q, w_k)`` both ``(head, d_model, d_head)``: each query head with its kv head."""
        return self.w_q, self.w_k[self.kv_of_head]


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to(torch.float64).cpu().numpy()


def _heads(w_out_in: np.ndarray, n: int, d: int) -> np.ndarray:
    """Linear weight ``(n*d, d_model)`` -> ``(n, d_model, d)`` in the ``x @ w`` convention."""
    return np.ascontiguousarray(w_out_in.reshape(n, d, -1).transpose(0, 2, 1))


def _bias(b: np.ndarray | None, n: int, d: int) -> np.ndarray | None:
    return None if b is None else b.reshape(n, d)


def _bert(mod, H: int, KV: int, d: int):
    return (_heads(_np(mod.query.weight), H, d), _heads(_np(mod.key.weight), KV, d),
            _bias(_np(mod.query.bias), H, d), _bias(_np(mod.key.bias), KV, d))


def _gpt2(mod, H: int, KV: int, d: int):
    w, b = _np(mod.c_attn.weight), _np(mod.c_attn.bias)  # Conv1D: (in, 3*d_model)
    dm = H * d
    wq = w[:, :dm].reshape(-1, H, d).transpose(1, 0, 2)
    wk = w[:, dm:2 * dm].reshape(-1, H, d).transpose(1, 0, 2)
    return (np.ascontiguousarray(wq), np.ascontiguousarray(wk),
            None if b is None else b[:dm].reshape(H, d),
            None if b is None else b[dm:2 * dm].reshape(H, d))


def _gpt_neox(mod, H: int, KV: int, d: int):
    lin = mod.query_key_value
    w = _np(lin.weight).reshape(H, 3 * d, -1)  # rows per head: [q | k | v]
    b = _np(lin.bias)
    b = None if b is None else b.reshape(H, 3 * d)
    return (np.ascontiguousarray(w[:, :d].transpose(0, 2, 1)),
            np.ascontiguousarray(w[:, d:2 * d].transpose(0, 2, 1)),
            None if b is None else b[:, :d], None if b is None else b[:, d:2 * d])


def _llama(mod, H: int, KV: int, d: int):
    return (_heads(_np(mod.q_proj.weight), H, d), _heads(_np(mod.k_proj.weight), KV, d),
            _bias(_np(mod.q_proj.bias), H, d), _bias(_np(mod.k_proj.bias), KV, d))


def _gemma3(mod, H: int, KV: int, d: int):
    # QK-norm: q = RMSNorm(x W_Q) * (1 + g_q) per head (Gemma3RMSNorm), likewise k. Folding the
    # gains, W_Q diag(1 + g_q) (W_K diag(1 + g_k))^T is the form of the normalised q, k *up to*
    # the per-token factors 1/rms(q_i) 1/rms(k_j), which it ignores.
    w_q, w_k, b_q, b_k = _llama(mod, H, KV, d)
    g_q = 1.0 + _np(mod.q_norm.weight)
    g_k = 1.0 + _np(mod.k_norm.weight)
    return (w_q * g_q, w_k * g_k, None if b_q is None else b_q * g_q,
            None if b_k is None else b_k * g_k)


#: family name -> reader of its attention module.
READERS: dict[str, Callable] = {"bert": _bert, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "llama": _llama,
                                "gemma3": _gemma3}
#: what the form of a family ignores (recorded with its LayerQK).
NOTES = {"gemma3": "QK-norm gains folded in; the form ignores the RMS normalisation of q and k"}


def layer_qk(lm, layer: int) -> LayerQK:
    """:class:`LayerQK` of ``layer`` of a :class:`~attnbase.extract.types.LoadedModel`."""
    name = lm.adapter.name
    reader = READERS.get(name)
    if reader is None:
        raise UnsupportedArchitectureError(
            f"no query/key weight reader for family {name!r}; supported: {', '.join(READERS)}")
    info = lm.info
    mod = lm.adapter.attention_module(lm.model, layer)
    H, KV, d = info.n_heads, info.n_kv_heads, info.d_head
    w_q, w_k, b_q, b_k = reader(mod, H, KV, d)
    scale = float(getattr(mod, "scaling", d ** -0.5))
    return LayerQK(layer=layer, w_q=w_q, w_k=w_k, b_q=b_q, b_k=b_k, scale=scale,
                   kv_of_head=np.arange(H) // (H // KV), note=NOTES.get(name, ""))


def model_qk(lm) -> list[LayerQK]:
    """:func:`layer_qk` of every layer."""
    return [layer_qk(lm, layer) for layer in range(lm.info.n_layers)]
