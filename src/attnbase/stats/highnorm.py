"""High-norm patch tokens of vision transformers and the attention [CLS] pays them (Darcet et al.
2024, "Vision Transformers Need Registers"; docs/metrics.md §6c).

Per hidden state ``l`` of an image run (``layer`` = hidden index, 0 = embeddings) and per image
``s``, over its patch tokens (positions from ``first_patch`` on: [CLS], DeiT's [DIST] and the
registers come before them and are the run's sink set):

- a patch token is **high-norm** when its residual-stream norm exceeds :data:`RATIO` times the
  median norm of that image's patch tokens (``||h_{s,j}|| > r * median_j' ||h_{s,j'}||``, r = 3;
  the threshold is declared once, ``attnbase.metrics.HIGH_NORM_RATIO``). A ratio to a median is
  robust (the median moves only when half the patches are outliers) and scale-free (multiplying
  every activation by c > 0 changes neither side's ratio);
- ``high_norm_frac``: high-norm patch tokens over all patch tokens of the run's images;
- ``high_norm_max_ratio``: the largest ``||h_{s,j}|| / median_j' ||h_{s,j'}||`` (how far the
  most extreme patch sits from its image's bulk, whether or not it crosses r);
- ``high_norm_cls_attn``: for the attention of block ``l`` (whose keys are computed from hidden
  state ``l``), the softmax mass the [CLS] query (position 0) puts on the image's high-norm
  patches, averaged over heads and images (an image without one adds 0);
- ``high_norm_cls_uniform``: the same mass under uniform attention over the ``T`` keys,
  the mean over images of ``n_high(s) / T``: the value to read ``high_norm_cls_attn`` against.

The attention pair exists for hidden states ``0 .. n_layers - 1`` only (the last hidden state
feeds no block). The hidden block of one layer is the analysis's unit already; this module
walks it :data:`SEQ_CHUNK` images at a time and reads the [CLS] rows of the logits for the
same images, so its temporaries are a chunk's size. Images whose hidden states are not written
(NaN) are left out.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from attnbase.metrics import HIGH_NORM_RATIO, N

__all__ = ["RATIO", "HIGH_NORM_LAYER_METRICS", "patch_norms", "high_norm_mask",
           "high_norm_share", "high_norm_stats"]

#: The threshold r of a high-norm patch: its norm over its image's median patch norm.
RATIO = HIGH_NORM_RATIO
#: Images per step of the walk over a layer's block.
SEQ_CHUNK = 64
#: The layer_metrics this module writes, in order.
HIGH_NORM_LAYER_METRICS = (N.high_norm_frac, N.high_norm_max_ratio, N.high_norm_cls_attn,
                           N.high_norm_cls_uniform)


def patch_norms(hidden, first_patch: int) -> np.ndarray:
    """Euclidean norms ``(..., n_patch)`` (float64) of the patch tokens of hidden states
    ``(..., pos, d_model)``: positions ``first_patch`` on."""
    h = np.asarray(hidden, dtype=np.float64)[..., first_patch:, :]
    return np.sqrt(np.einsum("...d,...d->...", h, h))


def high_norm_mask(norms, ratio: float = RATIO) -> tuple[np.ndarray, np.ndarray]:
    """``(mask, rel)`` of patch norms ``(..., n_patch)``: ``rel`` the norms over their image's
    median (the last axis), ``mask`` where ``rel > ratio``. An image with a non-finite norm (not
    written) or a zero median has ``rel`` NaN and no high-norm patch.

    >>> mask, rel = high_norm_mask(np.array([[1.0, 1.0, 1.1, 0.9, 5.0]]))
    >>> mask.tolist(), float(rel[0, -1])
    ([[False, False, False, False, True]], 5.0)
    """
    n = np.asarray(norms, dtype=np.float64)
    med = np.median(n, axis=-1, keepdims=True)  # NaN where any norm of the image is NaN
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(med > 0, n / np.where(med > 0, med, 1.0), np.nan)
    return np.nan_to_num(rel, nan=0.0) > ratio, rel


def high_norm_share(hidden, first_patch: int = 1, ratio: float = RATIO) -> np.ndarray:
    """Share of high-norm patch tokens of every image of hidden states ``(..., pos, d_model)``
    -> ``(...)`` (docs/metrics.md §6c); NaN for an image not written.

    Examples
    --------
    A [CLS] and eight patches, one of them ten times the others' norm:

    >>> h = np.ones((1, 9, 4)); h[0, 0] *= 50.0; h[0, 5] *= 10.0
    >>> float(high_norm_share(h)[0])
    0.125
    """
    mask, rel = high_norm_mask(patch_norms(hidden, first_patch), ratio)
    written = np.isfinite(rel).all(axis=-1)
    return np.where(written, mask.mean(axis=-1), np.nan)


def high_norm_stats(block, first_patch: int,
                    cls_rows: Callable[[int, int], np.ndarray] | None = None,
                    ratio: float = RATIO) -> dict[str, float]:
    """The §6c statistics of one hidden state's block ``(seq, pos, d_model)`` (module
    docstring), keyed by :data:`HIGH_NORM_LAYER_METRICS`.

    ``cls_rows(s0, s1)``: the [CLS] query's attention probabilities of images ``s0 .. s1 - 1``
    in the block that reads this hidden state, ``(head, s1 - s0, key)``; None (the last hidden
    state, or a run without logits) leaves the two attention values out of the result.
    """
    if len(np.shape(block)) != 3:
        raise ValueError(f"a hidden block is (seq, pos, d_model), got shape {np.shape(block)}")
    n_seq, n_pos = int(block.shape[0]), int(block.shape[1])
    if not 0 < first_patch < n_pos:
        raise ValueError(f"first_patch must be in 1..{n_pos - 1} (the [CLS] token is position 0),"
                         f" got {first_patch}")
    n_high = n_patch = 0
    max_rel = float("nan")
    attn = uniform = 0.0
    n_pairs = n_images = 0
    for s0 in range(0, n_seq, SEQ_CHUNK):
        s1 = min(n_seq, s0 + SEQ_CHUNK)
        mask, rel = high_norm_mask(patch_norms(block[s0:s1], first_patch), ratio)
        ok = np.isfinite(rel).all(axis=-1)  # images written
        if not ok.any():
            continue
        n_high += int(mask[ok].sum())
        n_patch += int(mask[ok].size)
        max_rel = float(np.nanmax([max_rel, float(rel[ok].max())]))
        if cls_rows is not None:
            p = np.asarray(cls_rows(s0, s1), dtype=np.float64)  # (head, s, key)
            on_high = (p[:, :, first_patch:] * mask[None]).sum(-1)  # (head, s)
            attn += float(on_high[:, ok].sum())
            n_pairs += int(p.shape[0] * ok.sum())
            uniform += float(mask[ok].sum(-1).sum()) / n_pos
            n_images += int(ok.sum())
    nan = float("nan")
    out = {N.high_norm_frac: n_high / n_patch if n_patch else nan,
           N.high_norm_max_ratio: max_rel if n_patch else nan}
    if cls_rows is not None:
        out[N.high_norm_cls_attn] = attn / n_pairs if n_pairs else nan
        out[N.high_norm_cls_uniform] = uniform / n_images if n_images else nan
    return out
