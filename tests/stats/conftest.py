"""Fixtures of the stats tests: planted keys/attention and small synthetic runs in a real catalog."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def db(tmp_path):
    from attnbase.warehouse import Database

    return Database(tmp_path / "db", lock_timeout=2.0)
