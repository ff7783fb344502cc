"""Puts tests/warehouse (synthetic CapturedBatches: ``fakes``) on sys.path for flow tests."""

from __future__ import annotations

import sys
from pathlib import Path

_WAREHOUSE_TESTS = str(Path(__file__).resolve().parent.parent / "warehouse")


def ensure_fakes_path() -> None:
    if _WAREHOUSE_TESTS not in sys.path:
        sys.path.insert(0, _WAREHOUSE_TESTS)


ensure_fakes_path()
