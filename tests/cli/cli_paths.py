"""Paths shared by the CLI tests (a module of its own: every test folder has a ``conftest``)."""

import sys
from pathlib import Path

#: The installed console script of this venv.
ATTNBASE = Path(sys.executable).parent / "attnbase"
