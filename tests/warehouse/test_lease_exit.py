"""A process that exits holding a lease exits cleanly: its heartbeat thread is stopped at
interpreter exit (catalog.lease.stop_heartbeats), not ended inside DuckDB by the interpreter's
finalisation, which aborted the process (exit 134, "FATAL: exception not rethrown")."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, sys, time
from attnbase.warehouse import Database
from attnbase.warehouse.catalog import lease
lease.HEARTBEAT_S = 0.0005  # a beat always in progress when the interpreter exits
if sys.argv[2] == "without-stop":
    atexit.unregister(lease.stop_heartbeats)
held = lease.acquire(Database(sys.argv[1]), "r", "extract")
time.sleep(0.05)
"""


def _exit_codes(db, mode: str, n: int) -> list[int]:
    return [subprocess.run([sys.executable, "-c", SCRIPT, str(db), mode], capture_output=True,
                           timeout=60).returncode for _ in range(n)]


def test_exit_with_a_held_lease_is_clean(tmp_path):
    from attnbase.warehouse import Database

    Database(tmp_path / "db").migrate()
    assert _exit_codes(tmp_path / "db", "with-stop", 3) == [0, 0, 0]
    # negative control: without the exit hook the same process aborts
    assert -6 in _exit_codes(tmp_path / "db", "without-stop", 3)  # SIGABRT
