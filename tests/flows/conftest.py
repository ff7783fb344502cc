"""Fixtures of the flow tests: offline Prefect, ONE session-scoped test harness, fake stages."""

from __future__ import annotations

import os
import shutil
import tempfile

# Before Prefect is imported (docs/toolchain.md: Prefect offline); the Makefile exports the same.
# A home made here is this session's own: removed when the session ends.
_MADE_HOME = None
if "PREFECT_HOME" not in os.environ:
    _MADE_HOME = os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="attnbase-prefect-")
for _k, _v in {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
               "DO_NOT_TRACK": "1", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
               "PREFECT_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)

import pytest  # noqa: E402

from flow_fakes import FakeStages  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _remove_made_prefect_home():
    """The Prefect home this conftest made (none when PREFECT_HOME was set): gone at the end."""
    yield
    if _MADE_HOME is not None:
        shutil.rmtree(_MADE_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def prefect_harness():
    """A real Prefect API (a temporary server + database) for the whole session: ~15 s, once."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def fake_stages(monkeypatch):
    """Replace every stage call of attnbase.flows._stages with an in-memory ledger + call log."""
    fake = FakeStages()
    fake.install(monkeypatch)
    return fake
