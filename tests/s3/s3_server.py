"""The real S3 endpoint of the object-storage tests: ``moto_server`` on a free loopback port.

The server is one subprocess per test session (up in ~0.5 s), stopped by its PID at the end
(the :func:`moto_endpoint` fixture, which tests/s3/conftest.py and the team tests import); each
test gets its own bucket (created with an explicit client: moto's state is in memory) and the
standard AWS_* environment pointing at the server, which is all attnbase reads.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

KEY, SECRET = "attnbase-test-key", "attnbase-test-secret-not-logged"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _moto_exe() -> str:
    exe = Path(sys.executable).with_name("moto_server")
    return str(exe) if exe.exists() else shutil.which("moto_server") or "moto_server"


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([_moto_exe(), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_moto(proc)
                raise RuntimeError(f"moto_server did not start on port {port}")
            time.sleep(0.05)


def stop_moto(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def moto_endpoint():
    """The URL of the session's moto_server, stopped by its PID at the end."""
    proc, url = start_moto()
    try:
        yield url
    finally:
        stop_moto(proc)


def aws_env(endpoint: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"}


def make_bucket(endpoint: str) -> str:
    import boto3

    name = f"attnbase-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                 aws_secret_access_key=SECRET, region_name="us-east-1").create_bucket(Bucket=name)
    return name


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                        aws_secret_access_key=SECRET, region_name="us-east-1")
