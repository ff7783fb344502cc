"""Fixtures shared by every test directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def pytest_configure(config):
    """Prefect's offline settings before any test imports Prefect (which reads them once, at
    import): the commands set the same ones, and would warn that they came too late."""
    from attnbase.flows.serving import prepare_environment

    prepare_environment(server=False, cwd=Path(config.rootpath))


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run the console-script entry point ``attnbase.cli:main`` in-process.

    Returns ``(exit_code, stdout, stderr)``.
    """
    from attnbase.cli import main

    def run(*args: str):
        monkeypatch.setattr(sys, "argv", ["attnbase", *map(str, args)])
        code = 0
        capsys.readouterr()
        try:
            main()
        except SystemExit as ex:
            code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
