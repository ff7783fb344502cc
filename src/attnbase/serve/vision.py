"""The vision parts of the run and head pages of an image run (docs/metrics.md §6c):

- **attention rollout** (Abnar & Zuidema 2020) of one window, ``/api/runs/{run}/rollout?seq=S``:
  the [CLS] row over the patches of :func:`attnbase.stats.rollout.cls_rollout`, computed on
  request from the window's logits of every layer (stored, or formed from the stored queries
  and keys), and drawn over the window's image (:func:`attnbase.serve.images.overlay_png`);
- **high-norm patch tokens** (Darcet et al. 2024): the run page's table of the ``high_norm_*``
  layer metrics the analysis stored, one row per hidden state.
"""

from __future__ import annotations

import math

import numpy as np
from fastapi import APIRouter, Query, Request

from attnbase.contract import image_token_names, sink_set
from attnbase.errors import NotFoundError
from attnbase.logits import softmax
from attnbase.metrics import HIGH_NORM_RATIO, N
from attnbase.serve.web import api_json, catalog, check_index, in_session

router = APIRouter()

#: The columns of the run page's high-norm table, in order (registry names).
HIGH_NORM_COLUMNS = (N.high_norm_frac, N.high_norm_max_ratio, N.high_norm_cls_attn,
                     N.high_norm_cls_uniform)


def first_patch(run: dict) -> int | None:
    """The first patch position of an image run ([CLS] and its extra tokens, the sink set,
    come before), or None for a text run."""
    sink = sink_set(run.get("sink_positions"))
    names = image_token_names(run.get("family") or "", len(sink), int(run["seq_len"]))
    return None if names is None else len(sink)


def rollout_data(cat, run_id: str, seq: int) -> dict:
    """``{"run_id", "seq", "grid", "rollout"}`` of window ``seq``: the [CLS] rollout over the
    patches as ``grid`` rows of ``grid`` values (raster order), plus its ``total`` (the share
    of [CLS] that traces back to patches rather than to [CLS] and the extra tokens)."""
    from attnbase.serve.heads import _store_version, weights_only

    run = cat.run_row(run_id)
    first = first_patch(run)
    if first is None or weights_only(run):
        raise NotFoundError(f"run {run_id!r} is not an image run with activations: attention "
                            "rollout is drawn for ViT, DeiT and DINOv2 runs")
    check_index("sequence", seq, run["n_seqs"], run_id)
    values = cat.memo(("rollout", run_id, seq), lambda: _cls_rollout(cat, run_id, seq, first),
                      version=lambda: _store_version(cat, run_id))
    g = math.isqrt(values.size)
    if g * g != values.size:
        raise NotFoundError(f"run {run_id!r}: {values.size} patches are not a square grid")
    return {"run_id": run_id, "seq": seq, "grid": g, "first_patch": first,
            "total": float(values.sum()), "rollout": values.reshape(g, g)}


def _cls_rollout(cat, run_id: str, seq: int, first: int) -> np.ndarray:
    """The [CLS] rollout of window ``seq``: its logits of every layer read once, each layer
    softmaxed and averaged over heads in turn (one layer's probabilities alive at a time)."""
    from attnbase.serve.heads import _read
    from attnbase.stats.rollout import cls_rollout

    z = _read(cat, run_id, "attn_logits", (slice(None), slice(None), seq))  # (layer, head, T, T)
    if np.isnan(z).all():
        raise NotFoundError(f"run {run_id!r}: sequence {seq} is not written yet")
    means = np.stack([softmax(layer).mean(axis=0) for layer in z])  # (layer, T, T)
    return cls_rollout(means[:, None], first)


def rollout_image(cat, run: dict, seq: int, png_only: bool = False) -> dict | None:
    """``{"src": data URI, "total", "caption"}`` of the [CLS] rollout of window ``seq`` drawn
    over its image (``"src"`` None, and the caption saying why, where it cannot be drawn; the
    PNG bytes as ``"png"`` instead of ``"src"`` with ``png_only``), or None for a text run."""
    from attnbase.serve.images import HEAT_CMAP, data_uri, overlay_png, where, window_source

    if first_patch(run) is None:
        return None
    check_index("sequence", seq, run["n_seqs"], run["run_id"])
    found = window_source(cat, run, seq)
    if found is None:
        return None
    try:
        d = rollout_data(cat, run["run_id"], seq)
    except NotFoundError as err:  # no logits (not captured, or the window not written yet)
        return {"src": None, "png": None, "total": None,
                "caption": f"No attention rollout: {err}"}
    image = overlay_png(str(run["corpus"]), found[0], found[1], d["rollout"])
    if image is None:
        return {"src": None, "png": None, "total": d["total"],
                "caption": f"{where(run, *found)}: the image is not readable here"}
    return {"src": None if png_only else data_uri(image), "png": image if png_only else None,
            "total": d["total"],
            "caption": f"Attention rollout of [CLS] over the patches (Abnar & Zuidema 2020: the "
                       f"product over layers of 0.5 x head-mean attention + 0.5 x I), {HEAT_CMAP}"
                       f" from 0 (dark) to its largest patch (light; the patches range "
                       f"{d['rollout'].min():.3g} to {d['rollout'].max():.3g}), over "
                       f"{where(run, *found)}; "
                       f"{d['total']:.3g} of [CLS] traces back to patches, the rest to [CLS] and "
                       "the extra tokens"}


def high_norm_table(layer_metrics: dict[str, dict]) -> dict | None:
    """``{columns, rows, ratio}`` of the run page's high-norm table, or None without such rows; each
    row ``{layer, cells: [(metric, value)]}`` per hidden state, from
    :func:`attnbase.serve.runs.run_data`'s ``layer_metrics`` (metric -> {layer: value})."""
    fracs = layer_metrics.get(N.high_norm_frac) or {}
    if not fracs:
        return None
    rows = [{"layer": int(layer),
             "cells": [(name, (layer_metrics.get(name) or {}).get(layer))
                       for name in HIGH_NORM_COLUMNS]}
            for layer in sorted(fracs, key=int)]
    return {"columns": HIGH_NORM_COLUMNS, "rows": rows, "ratio": HIGH_NORM_RATIO}


@router.get("/runs/{run}/rollout.png", include_in_schema=False)
@in_session
def rollout_png(request: Request, run: str, seq: int = Query(0)):
    from fastapi.responses import Response

    cat = catalog(request)
    found = rollout_image(cat, cat.run_row(run), seq, png_only=True)
    if found is None or found["png"] is None:
        raise NotFoundError(f"run {run!r}: no attention rollout image of window {seq} "
                            f"({found['caption'] if found else 'not an image run'})")
    return Response(found["png"], media_type="image/png")


@router.get("/api/runs/{run}/rollout", tags=["heads"],
            summary="attention rollout of [CLS] over the patches of one window of an image run")
@in_session
def api_rollout(request: Request, run: str,
                seq: int = Query(0, description="sequence (window) index")):
    d = rollout_data(catalog(request), run, seq)
    return api_json({**d, "rollout": d["rollout"].tolist()})
