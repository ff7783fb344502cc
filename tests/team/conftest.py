"""A team database (DuckLake on a real PostgreSQL, started here on loopback and stopped by PID)
for each test that asks for one."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "warehouse"))  # fakes.py


@pytest.fixture(scope="session")
def pg():
    from pgserver import PgServer

    server = PgServer().start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def team(pg, tmp_path, monkeypatch):
    """``(url, data_dir)`` of a new team database (its own PostgreSQL database and data
    directory); PGPASSWORD is set for this process and its children."""
    from attnbase.warehouse import Database

    monkeypatch.setenv("PGPASSWORD", pg.password)
    url = pg.createdb("t" + uuid.uuid4().hex[:10])
    data = tmp_path / "data"
    Database(url).catalog.create(str(data))
    return url, data


@pytest.fixture
def child_env(pg, tmp_path):
    """The environment of a child command: PGPASSWORD, a home of its own."""
    def make(name: str) -> dict:
        home = tmp_path / f"home-{name}"
        home.mkdir(exist_ok=True)
        env = {**os.environ, "PGPASSWORD": pg.password, "HOME": str(home),
               "XDG_CACHE_HOME": str(home / ".cache"), "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        return env
    return make
