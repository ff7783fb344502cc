"""A real PostgreSQL server for the tests: Debian's postgresql-15 (or the newest installed),
made in a temporary directory, listening on 127.0.0.1 only, stopped by its PID.

PostgreSQL refuses to run as root: as root the data directory belongs to the ``postgres``
user and the server binaries run under ``runuser``. The superuser ``postgres`` has a random
password (scram-sha-256), which the tests give the libpq way (``PGPASSWORD``) and then look
for in every output.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory (None where there is none)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """``start()``, ``createdb(name)``, ``url(name)``, ``stop()`` / ``crash()``."""

    def __init__(self) -> None:
        self.bin = pg_bin()
        if self.bin is None:
            raise RuntimeError("no PostgreSQL server binaries (apt install postgresql-15)")
        self.root = Path(tempfile.mkdtemp(prefix="attnbase-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.port = free_port()
        self.password = "pw-" + secrets.token_hex(12)
        self._as_root = os.geteuid() == 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def _own(self, path: Path) -> None:
        if self._as_root:
            shutil.chown(path, "postgres", "postgres")

    def start(self) -> "PgServer":
        if not self.data.exists():
            self.data.mkdir(mode=0o700)
            self._own(self.data)
            pwfile = self.root / "pw"
            pwfile.write_text(self.password + "\n")
            self._own(pwfile)
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "scram-sha-256",
                      "--pwfile", str(pwfile), "--no-sync")
            pwfile.unlink()
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-l",
                  str(self.data / "server.log"), "-o",
                  f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off -c max_connections=200", "start")
        return self

    @property
    def pid(self) -> int | None:
        f = self.data / "postmaster.pid"
        try:
            return int(f.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def env(self) -> dict:
        return {**os.environ, "PGPASSWORD": self.password}

    def createdb(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"dbname=postgres host=127.0.0.1 port={self.port} user=postgres "
                             f"password={self.password}", autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def url(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def crash(self) -> None:
        """Stop as a crash would (``pg_ctl stop -m immediate``)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)

    def stop(self) -> None:
        pid = self.pid
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)
        if pid is not None:  # by PID, should pg_ctl have failed
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
