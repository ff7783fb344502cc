"""Fixtures of the report tests: synthetic catalogs (see report_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_fixtures import make_catalog

from attnbase.warehouse import Database


@pytest.fixture(scope="session")
def catalog(tmp_path_factory) -> Path:
    return make_catalog(tmp_path_factory.mktemp("reports") / "db")


@pytest.fixture(scope="session")
def spine_catalog(tmp_path_factory) -> Path:
    return make_catalog(tmp_path_factory.mktemp("spine") / "db", minimal_tables=True)


@pytest.fixture(scope="session")
def html_a(catalog) -> str:
    from attnbase.reports import render_html

    return render_html(Database(catalog), "gpt2-a")


@pytest.fixture(scope="session")
def html_b(catalog) -> str:
    from attnbase.reports import render_html

    return render_html(Database(catalog), "neox-b")


@pytest.fixture(scope="session")
def compared(catalog):
    """The full build (HTML + PDF) of gpt2-a compared with neox-b, at the default location."""
    from attnbase.reports import build_report

    return build_report(catalog, "gpt2-a", compare=("neox-b",))
