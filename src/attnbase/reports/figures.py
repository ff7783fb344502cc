"""Matplotlib figures as inline SVG strings.

Uses the object-oriented API (``matplotlib.figure.Figure``) only: no pyplot, no global backend
switch, nothing at import time. Figure text stays text (``svg.fonttype = none``) so that it is
searchable in the HTML and extractable from the PDF.

Every function takes plain arrays ([layer], [layer, head]) already selected from the catalog and
returns one SVG string; axes are labelled with units and every figure has a legend or colour bar.
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnbase.formatting import fmt

_SALT = itertools.count()

RC = {
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
}

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")

CURVE_SIZE = (7.0, 3.3)
HEATMAP_SIZE = (3.8, 3.1)


# Fixed margins (figure fractions) instead of constrained layout: layout passes measure every
# text again and doubled the rendering time of a report.
CURVE_RECT = (0.10, 0.14, 0.88, 0.76)  # left, bottom, width, height
HEATMAP_RECT = (0.17, 0.16, 0.50, 0.72)
COLORBAR_RECT = (0.70, 0.16, 0.045, 0.72)
#: Colour-bar text: a head map prints at about half the page width, so 9 pt here is ~8 pt there.
COLORBAR_FONT = 9


def new_figure(size: tuple[float, float] = CURVE_SIZE, rect=CURVE_RECT):
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(RC):
        fig = Figure(figsize=size)
        ax = fig.add_axes(rect)
    return fig, ax


def legend_outside(ax, width: float = 0.62) -> None:
    """The legend to the right of the axes, clear of the data and of null or reference lines:
    the axes shrink to ``width`` (figure fraction) to make room."""
    import textwrap

    handles, labels = ax.get_legend_handles_labels()
    if handles:
        x0, y0, _, h = ax.get_position().bounds
        ax.set_position([x0, y0, width, h])
        # wrap labels to the room right of the axes (DejaVu Sans: ~0.62 em per character at the
        # legend's font size) instead of running off the figure's edge
        import matplotlib
        from matplotlib.font_manager import FontProperties

        pts = FontProperties(size=matplotlib.rcParams["legend.fontsize"]).get_size_in_points()
        room = (1 - x0 - width - 0.03) * ax.figure.get_figwidth() * 72
        cols = max(10, int(room / (0.62 * pts)))
        labels = ["\n".join(textwrap.wrap(lab, cols, break_long_words=False,
                                           break_on_hyphens=max(map(len, lab.split())) > cols))
                  or lab for lab in labels]
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False,
                  borderaxespad=0.0)


def integer_x(ax) -> None:
    """Ticks of the x axis on whole numbers only (layer or hidden-state indices): a model of a
    few layers would otherwise get 0.5 steps."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def to_svg(fig) -> str:
    """Serialise ``fig`` as an ``<svg>`` element for inlining (no XML prolog, unique ids)."""
    import matplotlib

    buf = io.StringIO()
    # A distinct hash salt per figure keeps clip-path ids unique when many SVGs share one page.
    with matplotlib.rc_context({**RC, "svg.hashsalt": f"attnbase-{next(_SALT)}"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    # Let CSS size the figure: keep the viewBox, drop the fixed width/height in pt.
    text = re.sub(r'<svg([^>]*?) width="[^"]*pt" height="[^"]*pt"', r'<svg\1', text, count=1)
    return text


class SVG(str):
    """An SVG string that also lists what it draws (``drawn``): the legend labels plus the kinds
    of marks ("dots", "band", "dashed", "dash-dot", "bars", "diamond", "heatmap"). Captions
    are checked against it, so a caption never describes a mark that is not there."""

    drawn: tuple[str, ...]

    def __new__(cls, text: str, drawn=()):
        obj = super().__new__(cls, text)
        obj.drawn = tuple(dict.fromkeys(drawn))
        return obj


def _legend_labels(ax) -> list[str]:
    return [label for label in ax.get_legend_handles_labels()[1] if not label.startswith("_")]


@dataclass(frozen=True)
class Band:
    """A mean +- sd band per layer (e.g. a null distribution)."""

    label: str
    mean: np.ndarray  # [layer]
    sd: np.ndarray  # [layer]
    color: str


@dataclass(frozen=True)
class Ref:
    """A horizontal reference line."""

    label: str
    y: float
    color: str = "#555555"
    style: str = "--"


def layer_curve(
    per_head: np.ndarray,
    *,
    ylabel: str,
    title: str,
    label: str,
    layer_mean: np.ndarray | None = None,
    bands: Sequence[Band] = (),
    refs: Sequence[Ref] = (),
    onset: int | None = None,
    ylim: tuple[float, float] | None = None,
    xlabel: str = "layer (0-based index)",
    head_dots: bool = True,
) -> str:
    """Per-layer curve: one dot per head, the layer mean as a line, null bands and references.

    ``per_head`` is [layer, head]; ``layer_mean`` defaults to the mean over heads.
    ``head_dots=False`` draws the line alone (one value per layer, e.g. a layer_metrics row);
    ``xlabel`` names the x axis (hidden states, 0 = embeddings, for a rank-collapse curve).
    """
    import matplotlib

    with matplotlib.rc_context(RC):
        fig, ax = new_figure()
        n_layers = per_head.shape[0]
        layers = np.arange(n_layers)
        mean = np.nanmean(per_head, axis=1) if layer_mean is None else layer_mean
        for band in bands:
            ax.fill_between(layers, band.mean - band.sd, band.mean + band.sd, color=band.color,
                            alpha=0.18, linewidth=0)
            ax.plot(layers, band.mean, color=band.color, linestyle=":", linewidth=1.4,
                    label=f"{band.label} (mean ± sd)")
        for ref in refs:
            ax.axhline(ref.y, color=ref.color, linestyle=ref.style, linewidth=1.2, label=ref.label)
        jitter = np.linspace(-0.12, 0.12, per_head.shape[1]) if per_head.shape[1] > 1 else [0.0]
        xs = layers[:, None] + np.asarray(jitter)[None, :]
        if head_dots:
            ax.scatter(xs.ravel(), per_head.ravel(), s=16, color=PALETTE[0], alpha=0.45,
                       linewidths=0, label="one head")
        ax.plot(layers, mean, color=PALETTE[0], marker="o", linewidth=2, markersize=4,
                label=label)
        if onset is not None and 0 <= onset < n_layers:
            ax.axvline(onset, color="#000000", linewidth=1, linestyle="-.",
                       label=f"onset layer L{onset}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xticks(layer_ticks(n_layers))
        if ylim is not None:
            ax.set_ylim(*ylim)
        legend_outside(ax)
        kinds = ["dots", "line"] if head_dots else ["line"]
        kinds += ["band"] * bool(bands) + ["dotted"] * bool(bands)
        kinds += ["dashed" if r.style == "--" else "dotted" if r.style == ":" else "line"
                  for r in refs]
        if onset is not None and 0 <= onset < n_layers:
            kinds.append("dash-dot")
        return SVG(to_svg(fig), [*kinds, *_legend_labels(ax)])


def heatmap(
    matrix: np.ndarray,
    *,
    title: str,
    cbar_label: str,
    cmap: str = "viridis",
    center: float | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
) -> str:
    """Layer x head heatmap ([layer, head]); values printed in the cells when the grid is small."""
    import matplotlib
    from matplotlib.colors import TwoSlopeNorm

    with matplotlib.rc_context({**RC, "axes.grid": False}):
        fig, ax = new_figure(HEATMAP_SIZE, HEATMAP_RECT)
        finite = matrix[np.isfinite(matrix)]
        norm = None
        if center is not None and finite.size:
            lo = min(float(finite.min()), center - 1e-9)
            hi = max(float(finite.max()), center + 1e-9)
            norm = TwoSlopeNorm(vcenter=center, vmin=lo, vmax=hi)
            vmin = vmax = None
        im = ax.imshow(matrix, aspect="auto", cmap=cmap, norm=norm, vmin=vmin, vmax=vmax,
                       interpolation="nearest", origin="upper")
        n_layers, n_heads = matrix.shape
        if n_layers * n_heads <= 64:
            for (i, j), v in np.ndenumerate(matrix):
                if np.isfinite(v):
                    rgba = im.cmap(im.norm(v))
                    dark = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] < 0.5
                    ax.text(j, i, fmt(float(v), 2, style="plain"), ha="center", va="center",
                            fontsize=6.5, color="white" if dark else "black")
        ax.set_xlabel("head (0-based index)")
        ax.set_ylabel("layer (0-based index)")
        ax.set_xticks(_ticks(n_heads))
        ax.set_yticks(_ticks(n_layers))
        ax.set_title(title)
        from matplotlib.ticker import MaxNLocator

        cbar = fig.colorbar(im, cax=fig.add_axes(COLORBAR_RECT), format="%.3g")
        if norm is None:
            cbar.locator = MaxNLocator(nbins=5)
            cbar.update_ticks()
        cbar.ax.tick_params(labelsize=COLORBAR_FONT)
        cbar.set_label(cbar_label, fontsize=COLORBAR_FONT)
        return SVG(to_svg(fig), ["heatmap", cbar_label])


#: At most this many tick labels on a heatmap axis: 12 two-digit head labels ran together in a
#: 1.9-inch axis ("1011"); 8 fit at the 9 pt tick font.
MAX_TICKS = 8


#: At most this many layer labels on a curve's x axis: 30 two-digit labels overlapped in the
#: 4.3-inch axes of a curve; 16 fit at the 9 pt tick font.
MAX_LAYER_TICKS = 16


def layer_ticks(n: int, start: int = 0) -> list[int]:
    """Every layer index up to :data:`MAX_LAYER_TICKS` labels, else every 2nd, 3rd, ..."""
    step = 1 if n <= MAX_LAYER_TICKS else int(np.ceil(n / MAX_LAYER_TICKS))
    return list(range(start, start + n, step))


def _ticks(n: int) -> list[int]:
    step = 1 if n <= MAX_TICKS else int(np.ceil(n / MAX_TICKS))
    return list(range(0, n, step))


def entropy_decomposition(
    layers: np.ndarray, entropy: np.ndarray, sink_part: np.ndarray, content_part: np.ndarray
) -> str:
    """Stacked bars H_b(s) + (1 - s) H(pi) per layer with the mean row entropy H(p) on top."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig, ax = new_figure()
        ax.bar(layers, sink_part, color=PALETTE[1], alpha=0.85, label="sink part  H_b(s)")
        ax.bar(layers, content_part, bottom=sink_part, color=PALETTE[0], alpha=0.85,
               label="content part  (1 − s)·H(π)")
        ax.plot(layers, entropy, color="#000000", marker="D", markersize=4, linewidth=1.2,
                label="row entropy  H(p)")
        ax.set_xlabel("layer (0-based index)")
        ax.set_ylabel("mean entropy per attention row (nats)")
        ax.set_title("Entropy decomposition  H(p) = H_b(s) + (1 − s)·H(π)")
        ax.set_xticks(np.asarray(layers)[::max(1, int(np.ceil(len(layers) / MAX_LAYER_TICKS)))])
        top = np.nanmax(np.concatenate([entropy, sink_part + content_part])) if len(layers) else 1
        ax.set_ylim(0, 1.25 * top if np.isfinite(top) and top > 0 else 1)
        legend_outside(ax)
        return SVG(to_svg(fig), ["bars", "diamond", *_legend_labels(ax)])


@dataclass(frozen=True)
class Series:
    """One run's per-layer curve for an overlay (x = depth fraction)."""

    label: str
    depth: np.ndarray  # [layer], layer / n_layers
    y: np.ndarray  # [layer]
    ref: float | None = None  # that run's own null/baseline, drawn dashed in its colour
    marker_x: float | None = None  # e.g. the onset depth
    companion: "Series | None" = None  # a second curve of the same run: dotted, in its colour


def overlay(series: Sequence[Series], *, ylabel: str, title: str, ref_label: str | None = None,
            marker_label: str | None = None) -> str:
    """Several runs' per-layer curves on a shared depth-fraction axis."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig, ax = new_figure()
        for k, s in enumerate(series):
            color = PALETTE[k % len(PALETTE)]
            ax.plot(s.depth, s.y, color=color, marker="o", markersize=3.5, linewidth=1.8,
                    label=s.label)
            if s.ref is not None and np.isfinite(s.ref):
                ax.axhline(s.ref, color=color, linestyle="--", linewidth=1,
                           label=f"{s.label}: {ref_label}" if ref_label else None)
            if s.marker_x is not None and np.isfinite(s.marker_x):
                ax.axvline(s.marker_x, color=color, linestyle="-.", linewidth=1,
                           label=f"{s.label}: {marker_label}" if marker_label else None)
            if s.companion is not None:
                ax.plot(s.companion.depth, s.companion.y, color=color, linestyle=":",
                        linewidth=1.6, label=f"{s.label}: {s.companion.label}")
        ax.set_xlabel("depth fraction (layer / n_layers)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xlim(-0.03, 1.0)
        legend_outside(ax)
        kinds = ["line"]
        if any(x.ref is not None and np.isfinite(x.ref) for x in series):
            kinds.append("dashed")
        if any(x.marker_x is not None and np.isfinite(x.marker_x) for x in series):
            kinds.append("dash-dot")
        if any(x.companion is not None for x in series):
            kinds.append("dotted")
        return SVG(to_svg(fig), [*kinds, *_legend_labels(ax)])
