"""The run page's figures say what they draw: rank collapse over hidden states with no head
dots, the VE@8 caption naming its dotted null means, 30 layer labels thinned (no server)."""

from __future__ import annotations

import re

import numpy as np

from attnbase.serve.runs import profile_figures


def _d(n_layers: int, rank: bool) -> dict:
    mean = [0.5 + 0.01 * i for i in range(n_layers)]
    d = {"run": {"seq_len": 16, "causal": True}, "table1": {},
         "profiles": {"ve_at_8": mean},
         "nulls": {"ve_at_8/gauss": {"mean": [0.3] * n_layers, "sd": [0.01] * n_layers}},
         "layer_metrics": {}}
    if rank:
        d["layer_metrics"]["rank_collapse"] = {str(i): 0.9 ** i for i in range(n_layers + 1)}
    return d


def _ticks(svg: str) -> list[str]:
    """The x tick labels of the axes (text elements inside the xtick groups)."""
    return re.findall(r'<g id="xtick_\d+">.*?<text[^>]*>([^<]*)</text>', svg, flags=re.S)


def test_rank_collapse_is_drawn_over_hidden_states_without_head_dots():
    figs = profile_figures(_d(6, rank=True), {"ve_at_8": np.full((6, 4), 0.5).tolist()})
    caption, svg = figs[-1]
    assert "hidden state (0 = embeddings, l = after layer l)" in svg
    assert "one head" not in svg and "H0 (embeddings) to H6" in caption
    assert _ticks(svg) == [str(i) for i in range(7)]  # 0..L: L + 1 hidden states
    ve_caption, ve_svg = figs[0]
    assert "dotted: each null model's mean per layer, shaded" in ve_caption
    assert "one head" in ve_svg and "gauss null (mean ± sd)" in ve_svg


def test_thirty_layer_axes_are_thinned():
    figs = profile_figures(_d(30, rank=True), {"ve_at_8": np.full((30, 9), 0.5).tolist()})
    for _, svg in figs:
        ticks = _ticks(svg)
        assert 2 <= len(ticks) <= 16, ticks
        assert ticks[0] == "0"
