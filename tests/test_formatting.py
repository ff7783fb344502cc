"""attnbase.formatting is the one number formatter: its styles against Python's own format
specs, the registry's digits, and a grep that no other source module defines a formatter."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import numpy as np
import pytest

from attnbase import formatting
from attnbase.formatting import fmt, fmt_bytes, fmt_cell, fmt_p, p_floor_bound
from attnbase.metrics import METRICS

SRC = Path(__file__).resolve().parent.parent / "src" / "attnbase"
VALUES = [0.0, 1.0, -1.0, 0.5, 0.123456, 0.99996, 1.5e-5, 3.2e-7, 12345.6, 123456.0, -0.0042,
          2.0 / 3.0, 7.0, 1e5]


def test_doctests():
    assert doctest.testmod(formatting, raise_on_error=True).attempted >= 3


@pytest.mark.parametrize("digits", [1, 2, 3, 4, 6])
def test_plain_is_percent_g(digits):
    for v in VALUES:
        assert fmt(v, digits, style="plain") == f"{v:.{digits}g}", v
        assert fmt(np.float32(v), digits, style="plain") == f"{float(np.float32(v)):.{digits}g}"
    for v in (None, float("nan"), float("inf"), -float("inf")):
        assert fmt(v, digits, style="plain") == "NULL"
    assert (fmt(True, style="plain"), fmt(7, style="plain"), fmt("x", style="plain")) == \
        ("true", "7", "x")


@pytest.mark.parametrize("digits", [0, 2, 3])
def test_fixed_and_signed_are_decimal_places(digits):
    for v in VALUES:
        assert fmt(v, digits, style="fixed") == f"{v:.{digits}f}"
        for style in formatting.STYLES:
            assert fmt(v, digits, signed=True, style=style) == f"{v:+.{digits}f}"
    assert fmt(-3, 0, signed=True) == "-3" and fmt(2, 0, signed=True) == "+2"
    assert [fmt(None, signed=True, style=s) for s in formatting.STYLES] == ["—", "NULL", "-"]


def test_table_style():
    got = [fmt(v) for v in (0.123456, 3.2e-7, 123456.0, 12.0, 0.0, np.int64(5), True, None,
                            float("nan"), "text")]
    assert got == ["0.1235", "3.20e-07", "1.23e+05", "12", "0", "5", "yes", "—", "—", "text"]
    assert fmt(12.0, 0) == "12" and fmt(2.5, 3) == "2.5" and fmt(0.5, 2) == "0.5"


def test_a_metric_gives_its_digits():
    onset, share = METRICS["onset_layer"], METRICS["max_share"]
    assert onset.digits == 0 and share.digits == 4
    assert fmt(12.0, onset, style="plain") == "12" and fmt(12345.0, onset, style="plain") == \
        "12345"  # "1.234e+04" with 4 digits
    assert fmt(0.123456, share, style="plain") == "0.1235" == share.format(0.123456)
    assert onset.format(12.0) == "12"


def test_bad_style_or_digits_fail_at_once():
    with pytest.raises(ValueError, match="unknown number style 'page'.*table, plain, fixed"):
        fmt(1.0, style="page")
    with pytest.raises(ValueError, match="digits must be an int"):
        fmt(1.0, "4")


def test_bytes():
    assert [fmt_bytes(n) for n in (None, 0, 1023, 1024, 5 * 2**20, 3 * 2**40, 2**50)] == [
        "known at load", "0 B", "1023 B", "1.0 KiB", "5.0 MiB", "3.0 TiB", "1024.0 TiB"]


def formatter_defs(root: Path = SRC) -> list[str]:
    """``path: name`` of every function named ``fmt*`` / ``_fmt*`` defined under ``root``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for name in re.findall(r"^\s*def (_?fmt\w*)\(", path.read_text(), flags=re.M):
            out.append(f"{path.relative_to(root)}: {name}")
    return out


def test_no_other_module_defines_a_formatter():
    """Besides attnbase/formatting.py only the service's Jinja filter ``num`` (fmt_num), which
    calls :func:`fmt` with the registry's digits."""
    assert formatter_defs() == ["formatting.py: fmt", "formatting.py: fmt_p",
                                "formatting.py: fmt_cell", "formatting.py: fmt_bytes",
                                "serve/web.py: fmt_num"]


def test_the_formatter_grep_sees_nested_defs(tmp_path):
    (tmp_path / "a.py").write_text("def fmt3(v):\n    pass\nclass C:\n    def _fmt(self):\n"
                                   "        pass\ndef format_x():\n    pass\n")
    assert formatter_defs(tmp_path) == ["a.py: fmt3", "a.py: _fmt"]


# --- p-values: never "0" (docs/metrics.md §8) ------------------------------------------------
def test_a_p_value_is_never_written_as_zero():
    """A stored p-value of 0 (norm.sf underflowed) is a bound in every style; ``fmt`` itself
    writes 0.0 as "0" (the negative control: the bound comes from fmt_p, not from fmt)."""
    assert fmt(0.0) == "0" and fmt(0.0, style="plain") == "0"
    for style in ("table", "plain", "fixed"):
        assert fmt_p(0.0, style=style) == "< 1e-300"
        assert fmt_p(np.float64(0.0), style=style) == "< 1e-300"
    assert fmt_p(3.2e-7) == "3.20e-07" and fmt_p(0.0312, style="plain") == "0.0312"
    assert fmt_p(None) == "—" and fmt_p(float("nan"), style="plain") == "NULL"


def test_an_empirical_p_at_its_floor_is_a_bound_with_its_draws():
    """1 / (1 + 200) = 0.004975 is written "< 0.005, 200 draws"; off the floor, the value."""
    assert fmt_p(1 / 201, draws=200, at_floor=True) == "< 0.005, 200 draws"
    assert fmt_p(3 / 201, draws=200, at_floor=False) == "0.0149"
    assert p_floor_bound(999) == "≤ 0.001, 999 draws"
    assert p_floor_bound(19) == "≤ 0.05, 19 draws"
    assert p_floor_bound(5) == "< 0.17, 5 draws"


def test_result_cells_of_p_columns():
    """A query's p-value columns get the bound; any other column's 0 stays "0"."""
    assert fmt_cell("p_value", 0.0) == "< 1e-300" and fmt_cell("ve_gauss_q", 0.0) == "< 1e-300"
    assert fmt_cell("value", 0.0) == "0" and fmt_cell("p_value", None) == "NULL"
    assert fmt_cell("p_value", 0.25, 6) == "0.25"
    assert fmt_cell("p_empirical", 1 / 201, 6) == "0.00497512"  # the cell's digits kept


def test_a_p_value_metric_formats_as_a_p_value():
    """The registry's p-value metrics (r_cv_share_p, ...) write their 0 as the bound."""
    p_metrics = [m for m in METRICS.values() if m.unit == "p-value"]
    assert p_metrics
    for m in p_metrics:
        assert m.format(0.0) == "< 1e-300", m.name
    assert METRICS["r_cv_share"].format(0.0) == "0"
