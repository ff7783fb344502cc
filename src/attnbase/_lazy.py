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


class LazyJit:
    """A numba kernel compiled on first use (from numba's on-disk cache after the first compile).

    ``import numba`` costs ~0.5 s, so modules holding kernels import it only here. The kernel's
    body refers to ``numba.prange`` through its module's global ``numba``, which is bound when
    the kernel is compiled. Thread-safe: the runner warms a kernel in a thread while a model loads.

    ``helpers`` maps names of plain functions in the same module, which the kernel calls, to
    their own ``numba.njit`` options (e.g. a ``fastmath`` flag set for one loop only): they are
    compiled and bound under the same names first.
    """

    def __init__(self, fn: Callable, module_globals: dict,
                 helpers: Mapping[str, dict] | None = None, **options: Any) -> None:
        import threading

        self._fn, self._globals, self._options = fn, module_globals, options
        self._helpers = dict(helpers or {})
        self._compiled: Callable | None = None
        self._lock = threading.Lock()

    def get(self) -> Callable:
        with self._lock:
            if self._compiled is None:
                import numba

                self._globals["numba"] = numba
                for name, opts in self._helpers.items():
                    helper = self._globals[name]
                    if not hasattr(helper, "py_func"):  # not yet a dispatcher
                        self._globals[name] = numba.njit(**opts)(helper)
                self._compiled = numba.njit(**self._options)(self._fn)
            return self._compiled
