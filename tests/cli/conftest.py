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
