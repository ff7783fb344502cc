"""The colour scale of the grids (viridis stops) as CSS colours: the service's pages and the
notebook client's heatmap share it. numpy only, so the plain install's client can draw it.
"""

from __future__ import annotations

import math

import numpy as np


#: viridis at five stops (matplotlib's), interpolated linearly: the grids' colour scale.
_VIRIDIS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


def colour(x: float | None, lo: float, hi: float) -> str:
    """``#rrggbb`` of ``x`` on [lo, hi]; grey for a missing value."""
    if x is None or not math.isfinite(x):
        return "#dddddd"
    t = 0.5 if hi <= lo else min(1.0, max(0.0, (x - lo) / (hi - lo)))
    pos = t * (len(_VIRIDIS) - 1)
    i = min(int(pos), len(_VIRIDIS) - 2)
    f = pos - i
    rgb = [round(a + (b - a) * f) for a, b in zip(_VIRIDIS[i], _VIRIDIS[i + 1])]
    return "#" + "".join(f"{c:02x}" for c in rgb)


_HEX = np.array([f"{v:02x}" for v in range(256)])


def colours(x, lo: float, hi: float) -> np.ndarray:
    """:func:`colour` of every value of ``x`` at once (the same strings), for figures of
    thousands of cells."""
    x = np.asarray(x, dtype=np.float64)
    ok = np.isfinite(x)
    t = np.full(x.shape, 0.5) if hi <= lo else np.clip((np.where(ok, x, lo) - lo) / (hi - lo),
                                                        0.0, 1.0)
    stops = np.array(_VIRIDIS, dtype=np.float64)
    pos = t * (len(_VIRIDIS) - 1)
    i = np.minimum(pos.astype(np.int64), len(_VIRIDIS) - 2)
    f = (pos - i)[..., None]
    rgb = stops[i] + (stops[i + 1] - stops[i]) * f
    # Python's round() (half to even) is numpy's rint
    r, g, b = (np.rint(rgb[..., k]).astype(np.int64) for k in range(3))
    out = np.char.add(np.char.add(np.char.add("#", _HEX[r]), _HEX[g]), _HEX[b])
    return np.where(ok, out, "#dddddd")


def ink(background: str) -> str:
    """Black or white text on ``background``."""
    r, g, b = (int(background[i:i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#ffffff"
