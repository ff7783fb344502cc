"""The image behind a window of an image run, for the head page: the crop its ``seq_sources`` row
names, resized to the model's square input as its processor did, with the patch grid drawn on it
(patch ``p(row,col)`` is the cell in grid row ``row``, column ``col``).

The pixels are read from the corpus itself (``images:sample``: scikit-learn's bundled photographs;
a directory: the file, where the run's corpus path still resolves), never from a model.
"""

from __future__ import annotations

import base64
import functools
import io
import math
from pathlib import Path

#: Side in pixels of the drawn image.
SIDE = 256


@functools.lru_cache(maxsize=4)
def _sample_images() -> dict:
    from sklearn.datasets import load_sample_images

    d = load_sample_images()
    return {Path(f).name: img for f, img in zip(d.filenames, d.images)}


def _source_image(corpus: str, name: str):
    """The source image as an RGB ``PIL.Image``, or None where it cannot be found."""
    from PIL import Image

    if corpus == "images:sample":
        arr = _sample_images().get(name)
        return None if arr is None else Image.fromarray(arr)
    path = Path(corpus).expanduser() / name
    if not path.is_file():
        return None
    with Image.open(path) as im:
        return im.convert("RGB")


def _window(corpus: str, name: str, box: tuple[int, int, int, int]):
    """The crop ``box`` of ``name`` resized to ``SIDE x SIDE``, or None where unreadable."""
    img = _source_image(corpus, name)
    return None if img is None else img.crop(box).resize((SIDE, SIDE))


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@functools.lru_cache(maxsize=64)
def window_png(corpus: str, name: str, box: tuple[int, int, int, int], grid: int) -> bytes | None:
    """PNG bytes of the crop ``box`` of ``name`` with a ``grid x grid`` patch grid, or None."""
    from PIL import ImageDraw

    img = _window(corpus, name, box)
    if img is None:
        return None
    draw = ImageDraw.Draw(img)
    for i in range(1, grid):
        x = round(i * SIDE / grid)
        draw.line([(x, 0), (x, SIDE)], fill=(255, 255, 0), width=1)
        draw.line([(0, x), (SIDE, x)], fill=(255, 255, 0), width=1)
    return _png(img)


#: Colour map and opacity of a heat map drawn over a window.
HEAT_CMAP, HEAT_ALPHA = "inferno", 0.6


def heat_rgb(values) -> "np.ndarray":
    """``(g, g, 3)`` uint8 colours of a ``(g, g)`` map on :data:`HEAT_CMAP`, from 0 (dark) to
    the map's largest value (light); NaN and an all-zero map are dark."""
    import numpy as np
    from matplotlib import colormaps

    v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0)
    top = v.max() if v.size and v.max() > 0 else 1.0
    return (colormaps[HEAT_CMAP](np.clip(v / top, 0.0, 1.0))[..., :3] * 255).round().astype(
        np.uint8)


def overlay_png(corpus: str, name: str, box: tuple[int, int, int, int], values) -> bytes | None:
    """PNG bytes of the crop ``box`` of ``name`` with the ``(g, g)`` map ``values`` drawn over
    it (one cell per patch, :func:`heat_rgb` at :data:`HEAT_ALPHA`), or None."""
    from PIL import Image

    img = _window(corpus, name, box)
    if img is None:
        return None
    heat = Image.fromarray(heat_rgb(values), "RGB").resize((SIDE, SIDE), Image.Resampling.NEAREST)
    return _png(Image.blend(img, heat, HEAT_ALPHA))


def window_source(cat, run: dict, seq: int) -> tuple[str, tuple[int, int, int, int]] | None:
    """``(source, crop box)`` of window ``seq`` of an image run (``seq_sources``), or None (a
    text run)."""
    if "seq_sources" not in cat.tables():
        return None
    # one query per run and snapshot (a text run has no rows: every head page of it is None)
    sources = cat.memo(("seq_sources", run["run_id"]), lambda: {
        int(r["seq"]): r for r in cat.rows(
            "SELECT seq, source, x0, y0, x1, y1 FROM seq_sources WHERE run_id = ?",
            [run["run_id"]])})
    r = sources.get(seq)
    if r is None:
        return None
    return str(r["source"]), (int(r["x0"]), int(r["y0"]), int(r["x1"]), int(r["y1"]))


def where(run: dict, source: str, box: tuple[int, int, int, int]) -> str:
    """The caption's account of a window: its source, crop box and corpus."""
    return f"{source} crop ({box[0]}, {box[1]})-({box[2]}, {box[3]}) of {run['corpus']}"


def window_image(cat, run: dict, seq: int, n_sink: int) -> dict | None:
    """``{"src": data URI, "caption"}`` of window ``seq`` of an image run, or None (a text run,
    or a source that no longer resolves: then ``caption`` alone says so)."""
    found = window_source(cat, run, seq)
    if found is None:
        return None
    source, box = found
    grid = math.isqrt(max(int(run["seq_len"]) - n_sink, 0))
    png = window_png(str(run["corpus"]), source, box, grid)
    if png is None:
        return {"src": None,
                "caption": f"{where(run, source, box)}: the image is not readable here"}
    return {"src": data_uri(png),
            "caption": f"{where(run, source, box)}, resized to the model's square input; {grid} x "
                       f"{grid} patches, p(row,col) is grid row row, column col"}


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()
