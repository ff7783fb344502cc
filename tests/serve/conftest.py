"""Fixtures of the service tests: one real database per session, one server per module."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
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
