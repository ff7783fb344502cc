"""Lazy package attributes: import a submodule only when one of its names is first used.

Used by the stage packages so that light commands (``attnbase sql``) never import torch, zarr or
Prefect, and so that Prefect's environment can be set before Prefect is imported.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package`` resolving ``name -> exports[name]`` module."""

    def __getattr__(name: str) -> Any:
        mod = exports.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(mod), name)

    return __getattr__
