from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def db(tmp_path):
    from attnbase.warehouse import Database

    return Database(tmp_path / "db", lock_timeout=0.3)


@pytest.fixture
def fake_run(db):
    """A complete run 'r1' written from synthetic batches; returns (db, info, cfg)."""
    from fakes import fake_batches, fake_config, fake_info

    from attnbase.runner import ingest_batches

    info, cfg = fake_info(rotary=True, n_kv_heads=1), fake_config()
    ingest_batches(db, "r1", cfg, info=info, corpus="default", corpus_hash="c0",
                   batches=fake_batches(info, cfg), progress=False)
    return db, info, cfg
