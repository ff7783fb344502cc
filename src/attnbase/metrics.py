"""The metrics' shared vocabulary: a bottom module every stage may import (it imports none).

:func:`fmt` is the one way a metric's value is written for people (report tables, console
tables, the service's pages).
"""

from __future__ import annotations

import math

import numpy as np


def fmt(value, digits: int = 4) -> str:
    """A catalog value for a table cell: "—" for missing, p-values in scientific notation."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        v = float(value)
        if math.isnan(v):
            return "—"
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.2e}"
        if v == int(v) and abs(v) < 1e5:
            return str(int(v)) if digits == 0 else f"{v:.{digits}g}"
        return f"{v:.{digits}g}"
    return str(value)
