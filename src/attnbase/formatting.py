"""Numbers written for people: :func:`fmt` for values, :func:`fmt_bytes` for sizes.

One formatter in three styles, named for their form:

- ``"table"``: the CLI's and the report's tables. "—" for a missing value or NaN, booleans as
  yes/no, ``digits`` significant digits, scientific notation below 1e-3 and from 1e5 (p-values:
  ``1.23e-05``), a whole number without decimals.
- ``"plain"``: C's ``%.{digits}g``, as the service's pages print numbers (and their script,
  serve/static/app.js, the value under the cursor); "NULL" for a missing or non-finite value,
  booleans as true/false, any other non-float as ``str``.
- ``"fixed"``: ``digits`` decimal places, as the paper prints its Table 1; "-" for a missing
  value.

``signed=True`` writes a difference or a correlation with its sign always shown and ``digits``
decimal places (``+0.012``), with the style's mark for a missing value.

:func:`fmt_p` writes a p-value: never "0". A p-value stored as 0 (``norm.sf`` underflowed, z above
~38) is written as the bound ``"< 1e-300"``; an empirical p-value at its floor ``1 / (1 + draws)``
as the bound with its draws, ``"< 0.005, 200 draws"`` (docs/metrics.md §8).
:func:`fmt_cell` is :func:`fmt` for a named column of a query's result: a p-value column
(:data:`P_COLUMNS` or a name the caller adds) by :func:`fmt_p`.

``digits`` is a number, or a registered metric (:class:`attnbase.metrics.Metric`, whose
``format`` passes itself): its ``digits``, 0 meaning an integer. A bottom module: it imports
nothing of attnbase, so every stage and the registry may call it.
"""

from __future__ import annotations

import math

import numpy as np

STYLES = ("table", "plain", "fixed")
#: Significant digits where no metric says otherwise (the pages' ``%.4g``).
DEFAULT_DIGITS = 4
_MISSING = {"table": "—", "plain": "NULL", "fixed": "-"}


def fmt(value, digits=DEFAULT_DIGITS, *, signed: bool = False, style: str = "table") -> str:
    """``value`` as text in ``style`` (module docstring); ``digits`` an int or a metric.

    >>> fmt(0.123456), fmt(3.2e-7), fmt(None), fmt(12.0, 0)
    ('0.1235', '3.20e-07', '—', '12')
    >>> fmt(0.123456, 3, style="plain"), fmt(float("inf"), style="plain"), fmt(True, style="plain")
    ('0.123', 'NULL', 'true')
    >>> fmt(0.5, 3, style="fixed"), fmt(-0.0123, 3, signed=True), fmt(None, 2, style="fixed")
    ('0.500', '-0.012', '-')
    """
    if style not in _MISSING:
        raise ValueError(f"unknown number style {style!r} (valid: {', '.join(STYLES)})")
    d = getattr(digits, "digits", digits)
    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
        raise ValueError(f"digits must be an int >= 0 or a registered metric, got {digits!r}")
    if value is None or (isinstance(value, float | np.floating) and math.isnan(value)):
        return _MISSING[style]
    if signed:
        return f"{float(value):+.{d}f}"
    if style == "plain":
        return _plain(value, d)
    if style == "fixed":
        return f"{float(value):.{d}f}"
    return _table(value, d)


def _table(value, digits: int) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        v = float(value)
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.2e}"
        if v == int(v) and abs(v) < 1e5:
            return str(int(v)) if digits == 0 else f"{v:.{digits}g}"
        return f"{v:.{digits}g}"
    return str(value)


def _plain(value, digits: int) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float | np.floating):
        v = float(value)
        if not math.isfinite(v):
            return _MISSING["plain"]
        if digits == 0:  # an integer metric: its whole values as integers
            return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.{DEFAULT_DIGITS}g}"
        return f"{v:.{digits}g}"
    return str(value)


#: Result columns that hold p- or q-values (null_tests, head_summary): :func:`fmt_cell` writes
#: them with :func:`fmt_p`.
P_COLUMNS = frozenset({"p_value", "q_value", "p_empirical", "ve_gauss_p", "ve_gauss_q",
                       "ve_shuffle_p", "ve_shuffle_q"})
#: What a p-value stored as 0 is shown as: ``norm.sf`` returns 0 only below ~2.5e-324.
P_UNDERFLOW = "< 1e-300"


def p_floor_bound(draws: int) -> str:
    """The empirical floor ``1 / (1 + draws)`` as a bound: rounded up to two significant digits,
    ``"< 0.005, 200 draws"`` (``"≤"`` where the rounding is exact, e.g. 99 draws).

    >>> p_floor_bound(200), p_floor_bound(99), p_floor_bound(1000)
    ('< 0.005, 200 draws', '≤ 0.01, 99 draws', '< 0.001, 1000 draws')
    """
    floor = 1.0 / (1 + int(draws))
    scale = 10.0 ** (math.floor(math.log10(floor)) - 1)
    up = math.ceil(round(floor / scale, 9)) * scale
    text = f"{up:.2g}"
    return f"{'≤' if math.isclose(up, floor) else '<'} {text}, {int(draws)} draws"


def fmt_p(p, *, draws: int | None = None, at_floor: bool = False, style: str = "table",
          digits: int = 3) -> str:
    """A p- or q-value as text, never "0": missing as the style's mark; ``at_floor`` (an
    empirical p-value equal to ``1 / (1 + draws)``) as :func:`p_floor_bound`; exactly 0 (an
    underflow) as :data:`P_UNDERFLOW`; otherwise :func:`fmt` with ``digits`` significant
    digits.

    >>> fmt_p(0.0), fmt_p(0.004975, draws=200, at_floor=True), fmt_p(0.0312), fmt_p(None)
    ('< 1e-300', '< 0.005, 200 draws', '0.0312', '—')
    """
    if p is None or (isinstance(p, float | np.floating) and math.isnan(p)):
        return fmt(None, style=style)
    if at_floor and draws:
        return p_floor_bound(draws)
    if float(p) == 0.0:
        return P_UNDERFLOW
    return fmt(float(p), digits, style=style)


def fmt_cell(name: str, value, digits=DEFAULT_DIGITS, *, style: str = "plain",
             p_columns=P_COLUMNS) -> str:
    """One cell of a query's result: :func:`fmt_p` for a column in ``p_columns``, :func:`fmt`
    otherwise.

    >>> fmt_cell("p_value", 0.0), fmt_cell("value", 0.0), fmt_cell("p_empirical", 1 / 201, 6)
    ('< 1e-300', '0', '0.00497512')
    """
    if name in p_columns and isinstance(value, float | np.floating):
        return fmt_p(value, style=style, digits=getattr(digits, "digits", digits))
    return fmt(value, digits, style=style)


def fmt_bytes(n: int | None) -> str:
    """A size in bytes as ``B``, ``KiB``, ... ``TiB`` (one decimal above bytes); "known at load"
    for an unknown size."""
    if n is None:
        return "known at load"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
