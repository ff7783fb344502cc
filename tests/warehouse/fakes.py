"""Synthetic CapturedBatches: the warehouse is tested without loading a model."""

from __future__ import annotations

import numpy as np

from attnbase.extract.config import ExtractConfig
from attnbase.contract import CapturedBatch, ModelInfo


def fake_info(rotary: bool = False, n_layers: int = 2, n_heads: int = 3, n_kv_heads: int | None = None,
              d_head: int = 4, revision: str = "seed:0") -> ModelInfo:
    return ModelInfo(model="fake", model_revision=revision, family="gpt2", n_layers=n_layers,
                     n_heads=n_heads, n_kv_heads=n_kv_heads or n_heads, d_head=d_head,
                     d_model=n_heads * d_head, rotary=rotary, causal=True, sink_token="<|bos|>")


def fake_config(**kw) -> ExtractConfig:
    base = dict(model="fake", corpus="default", n_seqs=5, seq_len=6, batch_size=2)
    base.update(kw)
    return ExtractConfig(**base)


def make_batch(info: ModelInfo, cfg: ExtractConfig, k: int, seed: int = 0) -> CapturedBatch:
    """Batch ``k``: deterministic in (seed, k); causal logits with -inf above the diagonal."""
    from attnbase.contract import CAPTURE_CHOICES

    rng = np.random.default_rng([seed, k])
    first = k * cfg.batch_size
    n = min(cfg.batch_size, cfg.n_seqs - first)
    L, H, KV, T, D = info.n_layers, info.n_heads, info.n_kv_heads, cfg.seq_len, info.d_head
    f = np.float16 if cfg.dtype == "float16" else np.float32
    arrays = {"tokens": rng.integers(0, 1000, size=(n, T), dtype=np.int32)}
    logits = rng.standard_normal((L, H, n, T, T)).astype(f)
    logits[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] = -np.inf
    full = {
        "keys": rng.standard_normal((L, KV, n, T, D)).astype(f),
        "keys_rot": rng.standard_normal((L, KV, n, T, D)).astype(f),
        "queries": rng.standard_normal((L, H, n, T, D)).astype(f),
        "attn_logits": logits,
        "hidden": rng.standard_normal((L + 1, n, T, info.n_heads * D)).astype(f),
    }
    from attnbase.contract import stored_capture

    # what a capture of this run carries: the logits too where they are stored, not derived
    for choice in stored_capture(info, cfg.capture, cfg.dtype):
        for name in CAPTURE_CHOICES[choice]:
            if name == "keys_rot" and not info.rotary:
                continue
            arrays[name] = full[name]
    p = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    layer, head, seq, query = np.meshgrid(np.arange(L), np.arange(H), np.arange(first, first + n),
                                          np.arange(T), indexing="ij")
    ent = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0)).sum(-1)
    row = {
        "layer": layer.ravel(), "head": head.ravel(), "seq": seq.ravel(), "query": query.ravel(),
        "n_keys": (query + 1).ravel(), "sink_mass": p[..., 0].ravel(),
        "max_prob": p.max(-1).ravel(), "argmax": p.argmax(-1).ravel(), "entropy": ent.ravel(),
        "sink_balance": np.full(layer.size, np.nan), "content_entropy": np.full(layer.size, np.nan),
        "content_dispersion": np.full(layer.size, np.nan),
    }
    received = p.sum(-2)  # (L, H, n, key)
    col = {"layer": layer.ravel(), "head": head.ravel(), "seq": seq.ravel(),
           "key": query.ravel(), "received": received.ravel()}
    return CapturedBatch(batch=k, first_seq=first, n_seqs=n, arrays=arrays, row_stats=row,
                         col_stats=col)


def fake_batches(info: ModelInfo, cfg: ExtractConfig, seed: int = 0, fail_at: int | None = None):
    """``batches(start)`` callable as :func:`attnbase.runner.ingest_batches` wants."""
    n_batches = -(-cfg.n_seqs // cfg.batch_size)

    def batches(start: int):
        for k in range(start, n_batches):
            if fail_at is not None and k == fail_at:
                raise RuntimeError(f"injected failure at batch {k}")
            yield make_batch(info, cfg, k, seed)

    return batches


def expected_arrays(info: ModelInfo, cfg: ExtractConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """The full arrays a run of fake batches must store (concatenated along seq)."""
    from attnbase.contract import ARRAY_DIMS

    n_batches = -(-cfg.n_seqs // cfg.batch_size)
    parts = [make_batch(info, cfg, k, seed) for k in range(n_batches)]
    return {name: np.concatenate([p.arrays[name] for p in parts], axis=ARRAY_DIMS[name].index("seq"))
            for name in parts[0].arrays}
