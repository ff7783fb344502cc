from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent.parent / "warehouse"))  # fakes.py

from cli_paths import ATTNBASE  # noqa: E402,F401  (also re-exported for old imports)


@pytest.fixture
def fake_db(tmp_path):
    """A database with one complete run 'r1' of synthetic batches."""
    from fakes import fake_batches, fake_config, fake_info

    from attnbase.warehouse import Database
    from attnbase.runner import ingest_batches

    db = Database(tmp_path / "db")
    info, cfg = fake_info(), fake_config()
    ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    return db
