"""Fixtures of the object-storage tests (helpers in s3_server.py): one moto_server per session
(``moto_endpoint``, defined in s3_server.py), stopped by its PID; a fresh bucket and the AWS_*
environment per test."""

from __future__ import annotations

import pytest
from s3_server import aws_env, make_bucket, moto_endpoint  # noqa: F401  a fixture


@pytest.fixture
def s3_bucket(moto_endpoint, monkeypatch):
    """``s3://<fresh bucket>`` on the session's moto server, with AWS_* set for this test."""
    for k, v in aws_env(moto_endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return f"s3://{make_bucket(moto_endpoint)}"
