"""Fixtures of the service tests: one real database per session, one server per module; a
database of two fake runs per test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
WAREHOUSE_TESTS = Path(__file__).parents[1] / "warehouse"  # fakes.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from serve_fixtures import Server, build_database  # noqa: E402


@pytest.fixture(scope="session")
def serve_db(tmp_path_factory) -> Path:
    return build_database(tmp_path_factory.mktemp("serve") / "db")


@pytest.fixture(scope="module")
def server(serve_db):
    srv = Server(serve_db, "--sql-time-limit-ms", "1000")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture
def two_runs(tmp_path):
    """A database of two runs, ``a`` and ``g``, of fake batches (tests/warehouse/fakes.py)."""
    if str(WAREHOUSE_TESTS) not in sys.path:
        sys.path.insert(0, str(WAREHOUSE_TESTS))
    from fakes import fake_batches, fake_config, fake_info

    from attnbase.runner import ingest_batches
    from attnbase.warehouse import Database

    db = Database(tmp_path / "db")
    info, cfg = fake_info(), fake_config()
    for run in ("a", "g"):
        ingest_batches(db, run, cfg, info=info, corpus="default", corpus_hash="c0",
                       batches=fake_batches(info, cfg), progress=False)
    return db
