"""The one formula of attention logits, shared by the capture and the reader of derived logits.

The capture forms every layer's scores with :func:`scaled_scores` inside the model's forward
(:mod:`attnbase.extract.attention_call`); a run whose ``attn_logits`` are derived
(docs/architecture.md, "Arrays of a run") stores the queries and keys that call received, and the warehouse reader
forms the logits again with the same function on the same float32 operands, so a derived block
equals what the capture saw bit for bit (tests/warehouse/test_derived_logits.py). The mask
rule of a :class:`~attnbase.contract.LogitsRecipe` (causal, sliding window) is
:func:`blocked_mask`; the capture checks that the model's own mask is that rule before a run
relies on it.

A bottom module: it imports no stage, and torch only inside its functions (tensor arithmetic,
no model), so importing it costs nothing.
"""

from __future__ import annotations

import numpy as np


def preload() -> None:
    """Import torch now (~1.2 s), not at the first :func:`derive_layer` (a server's warm-up)."""
    import torch  # noqa: F401


def scaled_scores(query, key, scaling: float, head_axis: int, softcap: float | None = None,
                  alibi=None):
    """``matmul(query, key^T) * scaling`` (torch tensors, ``[..., pos, d_head]``), then with a
    ``softcap`` c ``tanh(z / c) * c`` (the operations of Gemma-2's eager attention), then with
    ``alibi`` slopes (one per query head, float32) ``+ slope[h] * j`` at key position ``j``
    (BLOOM's ALiBi bias, as its ``build_alibi_tensor`` forms it).

    ``key`` may have fewer heads than ``query`` along ``head_axis`` (GQA): query head ``h`` reads
    kv head ``h // (H / H_kv)``, as HF's ``repeat_kv`` arranges them.
    """
    import torch

    groups = query.shape[head_axis] // key.shape[head_axis]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=head_axis)
    z = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    if alibi is not None:
        shape = [1] * z.dim()
        shape[head_axis] = -1
        slopes = torch.as_tensor(alibi, dtype=torch.float32, device=z.device).view(shape)
        pos = torch.arange(z.shape[-1], dtype=torch.float32, device=z.device)
        z = z + (slopes * pos).to(z.dtype)
    return z


def blocked_mask(n_query: int, n_key: int, *, causal: bool, window: int | None) -> np.ndarray:
    """``(query, key)`` bool: True where the rule blocks the entry (``-inf`` in the logits).

    Causal: key ``j > i``; sliding window ``W``: key ``j <= i - W`` (query ``i`` sees
    ``max(0, i - W + 1) .. i``, transformers' sliding-window rule), and on a bidirectional layer
    also ``j >= i + W`` (query ``i`` sees keys ``|i - j| < W``).
    """
    i = np.arange(n_query)[:, None]
    j = np.arange(n_key)[None, :]
    blocked = (j > i) if causal else np.zeros((n_query, n_key), dtype=bool)
    if window is not None:
        blocked = blocked | (j <= i - window)
        if not causal:
            blocked = blocked | (j >= i + window)
    return blocked


def derive_layer(queries: np.ndarray, keys: np.ndarray, *, scale: float, causal: bool,
                 window: int | None, softcap: float | None = None,
                 alibi=None) -> np.ndarray:
    """One layer's logits ``(head, seq, query, key)`` float32 from its stored queries
    ``(head, seq, pos, d_head)`` and the keys the attention saw ``(kv_head, seq, pos, d_head)``
    (each query head's kv head already chosen: equal head counts, or GQA's ``H_kv``);
    ``alibi``: the slopes of the selected query heads."""
    from attnbase.extras import require

    require("torch", "deriving attn_logits from the stored queries and keys (bit for bit as "
                     "the extraction formed them)")
    import torch

    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    k = torch.from_numpy(np.ascontiguousarray(keys, dtype=np.float32))
    with torch.inference_mode():
        z = scaled_scores(q, k, scale, head_axis=0, softcap=softcap, alibi=alibi)
        blocked = blocked_mask(z.shape[-2], z.shape[-1], causal=causal, window=window)
        if blocked.any():
            z.masked_fill_(torch.from_numpy(blocked), -np.inf)
    return z.numpy()


def softmax(z) -> np.ndarray:
    """Attention probabilities of logits ``z`` ``(..., key)``: softmax over the last axis in
    float64; masked keys (``-inf``, or any non-finite logit) get exactly 0.

    Examples
    --------
    >>> softmax(np.array([0.0, np.log(3.0), -np.inf])).round(12).tolist()
    [0.25, 0.75, 0.0]
    """
    z = np.asarray(z, dtype=np.float64)
    keep = np.isfinite(z)
    m = np.max(np.where(keep, z, -np.inf), axis=-1, keepdims=True)
    e = np.where(keep, np.exp(np.where(keep, z - m, 0.0)), 0.0)
    return e / e.sum(-1, keepdims=True)
