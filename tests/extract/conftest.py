"""Fixtures of the extract tests: models are loaded once per session (tiny ones in ~0.1 s)."""

from __future__ import annotations

import functools
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")



@functools.cache
def _load(name: str, impl: str | None):
    from attnbase.extract import load_model

    return load_model(name, dtype="float32", device="cpu", attn_implementation=impl)


@pytest.fixture(scope="session")
def load_lm():
    """``load_lm(name, impl=None)``: a cached LoadedModel (capture by default, "eager" for HF's)."""
    return lambda name, impl=None: _load(name, impl)
