"""Synthetic runs with planted structure, ingested through the real warehouse (no model)."""

from __future__ import annotations

import numpy as np

from attnbase.extract.config import ExtractConfig
from attnbase.contract import CapturedBatch, ModelInfo


def uniform_attention(T: int, causal: bool = True) -> np.ndarray:
    """(query, key) uniform attention over the unmasked keys."""
    if causal:
        return np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    return np.full((T, T), 1.0 / T)


def sink_logits(T: int, sink: float, causal: bool = True) -> np.ndarray:
    """Logits whose softmax gives key 0 the logit ``sink`` over equal others (masked -inf)."""
    z = np.zeros((T, T))
    z[:, 0] = sink
    if causal:
        z[np.triu_indices(T, 1)] = -np.inf
    return z


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def make_info(*, n_layers=4, n_heads=4, n_kv_heads=None, d_head=16, causal=True) -> ModelInfo:
    return ModelInfo(model="synthetic", model_revision="seed:0", family="llama" if causal else "bert",
                     n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads or n_heads,
                     d_head=d_head, d_model=n_heads * d_head, rotary=False, causal=causal,
                     sink_token="<s>")


def make_run_arrays(info: ModelInfo, n_seqs: int, T: int, *, sink_layers=(), sink_logit=4.0,
                    rank_layers=(), rank=2, seed=0):
    """Keys ``(layer, kv_head, seq, pos, d_head)`` and logits ``(layer, head, seq, query, key)``.

    Heads in ``sink_layers`` put logit ``sink_logit`` on key 0 (others random small logits);
    keys in ``rank_layers`` have rank ``rank`` (VE@rank = 1).
    """
    rng = np.random.default_rng(seed)
    L, H, KV, D = info.n_layers, info.n_heads, info.n_kv_heads, info.d_head
    keys = rng.standard_normal((L, KV, n_seqs, T, D)).astype(np.float32)
    for layer in rank_layers:
        a = rng.standard_normal((KV, n_seqs, T, rank))
        b = rng.standard_normal((KV, 1, rank, D))
        keys[layer] = (a @ b).astype(np.float32)
    z = 0.3 * rng.standard_normal((L, H, n_seqs, T, T))
    for layer in sink_layers:
        z[layer, :, :, :, 0] += sink_logit
    if info.causal:
        iu = np.triu_indices(T, 1)
        z[..., iu[0], iu[1]] = -np.inf
    return keys, z.astype(np.float32)


def batches_from_arrays(info: ModelInfo, cfg: ExtractConfig, keys: np.ndarray,
                        logits: np.ndarray):
    """``batches(start)`` for ``ingest_batches``: row/col stats computed as extract does."""
    import torch

    from attnbase.extract.rowstats import received, row_stats

    L, H = info.n_layers, info.n_heads
    T = cfg.seq_len
    n_batches = -(-cfg.n_seqs // cfg.batch_size)

    def one(k: int) -> CapturedBatch:
        first = k * cfg.batch_size
        n = min(cfg.batch_size, cfg.n_seqs - first)
        sl = slice(first, first + n)
        z = torch.from_numpy(logits[:, :, sl].astype(np.float64))
        rs = {c: v.numpy() for c, v in row_stats(z).items()}
        layer, head, seq, query = np.meshgrid(np.arange(L), np.arange(H),
                                              np.arange(first, first + n), np.arange(T),
                                              indexing="ij")
        row = {"layer": layer.ravel(), "head": head.ravel(), "seq": seq.ravel(),
               "query": query.ravel(), **{c: v.ravel() for c, v in rs.items()}}
        col = {"layer": layer.ravel(), "head": head.ravel(), "seq": seq.ravel(),
               "key": query.ravel(), "received": received(z).numpy().ravel()}
        arrays = {"tokens": np.zeros((n, T), dtype=np.int32), "attn_logits": logits[:, :, sl]}
        if "keys" in cfg.capture:
            arrays["keys"] = keys[:, :, sl]
        return CapturedBatch(batch=k, first_seq=first, n_seqs=n, arrays=arrays, row_stats=row,
                             col_stats=col)

    def batches(start: int):
        for k in range(start, n_batches):
            yield one(k)

    return batches


def ingest_synthetic(db, run_id: str, info: ModelInfo, keys: np.ndarray, logits: np.ndarray,
                     batch_size: int = 4, capture=("keys", "logits")):
    from attnbase.runner import ingest_batches

    n_seqs, T = keys.shape[2], keys.shape[3]
    cfg = ExtractConfig(model="synthetic", n_seqs=n_seqs, seq_len=T, batch_size=batch_size,
                        capture=tuple(capture))
    ingest_batches(db, run_id, cfg, info=info, corpus="synthetic", corpus_hash="0",
                   batches=batches_from_arrays(info, cfg, keys, logits), progress=False)
    return cfg
