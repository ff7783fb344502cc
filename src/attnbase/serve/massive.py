"""The run page's massive activations (docs/metrics.md §6b): one row per hidden state of the
run's ``massive_*`` layer metrics, with the token at the largest activation as text."""

from __future__ import annotations

from attnbase.metrics import N
from attnbase.tokentext import token_at

#: The magnitude columns of the table, in order (registry names: the template shows labels).
COLUMNS = (N.massive_top1, N.massive_top2, N.massive_top3, N.massive_median, N.massive_ratio)


def massive_table(run: dict, layer_metrics: dict[str, dict]) -> dict | None:
    """``{columns, sink, flag, rows}`` of the run page's table, or None without massive rows;
    each row ``{layer, cells: [(metric, value)], where, token, sink, flag}``, per hidden state
    (0 = embeddings), from :func:`attnbase.serve.runs.run_data`'s ``layer_metrics``
    (metric -> {layer: value})."""
    tops = layer_metrics.get(N.massive_top1) or {}
    if not tops:
        return None

    def get(name, layer):
        return (layer_metrics.get(name) or {}).get(layer)

    rows = []
    for layer in sorted(tops, key=int):
        seq, pos, dim = (get(n, layer) for n in (N.massive_seq, N.massive_pos, N.massive_dim))
        rows.append({
            "layer": int(layer),
            "cells": [(name, get(name, layer)) for name in COLUMNS],
            "where": ("" if None in (seq, pos, dim) else f"({int(seq)}, {int(pos)}, {int(dim)})"),
            "token": token_at(run, get(N.massive_token, layer), pos),
            "sink": get(N.massive_sink_share, layer), "flag": get(N.massive_flag, layer)})
    return {"columns": COLUMNS, "sink": N.massive_sink_share, "flag": N.massive_flag,
            "rows": rows}
