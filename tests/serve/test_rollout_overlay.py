"""The heat map drawn over a window (the attention rollout on the run and head pages,
docs/metrics.md §6c): each patch's cell carries its value's colour, blended over the image."""

from __future__ import annotations

import io

import numpy as np

from attnbase.serve import images

BOX = (10, 20, 310, 320)


def test_each_patch_cell_carries_its_colour_over_the_image():
    from PIL import Image

    values = np.zeros((4, 4))
    values[1, 2] = 1.0  # the brightest patch
    values[3, 0] = 0.25
    png = images.overlay_png("images:sample", "china.jpg", BOX, values)
    got = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=float)
    base = np.asarray(images._window("images:sample", "china.jpg", BOX), dtype=float)
    a = images.HEAT_ALPHA
    heat = (got - (1 - a) * base) / a  # the blend undone
    want = images.heat_rgb(values).astype(float)
    cell = images.SIDE // 4
    for r in range(4):
        for c in range(4):
            inner = heat[r * cell + 2:(r + 1) * cell - 2, c * cell + 2:(c + 1) * cell - 2]
            np.testing.assert_allclose(inner.reshape(-1, 3).mean(0), want[r, c], atol=2.0)
    # the largest value is the colour map's top, zero its bottom, the rest in between
    from matplotlib import colormaps

    cmap = colormaps[images.HEAT_CMAP]
    np.testing.assert_allclose(want[1, 2], np.round(np.array(cmap(1.0)[:3]) * 255))
    np.testing.assert_allclose(want[0, 0], np.round(np.array(cmap(0.0)[:3]) * 255))
    assert want[0, 0].sum() < want[3, 0].sum() < want[1, 2].sum()


def test_a_map_without_mass_is_dark_and_an_unreadable_source_is_none():
    dark = images.heat_rgb(np.zeros((3, 3)))
    assert (dark == dark[0, 0]).all() and dark[0, 0].sum() < 30
    assert images.overlay_png("images:sample", "missing.jpg", BOX, np.ones((2, 2))) is None
