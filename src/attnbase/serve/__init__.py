"""serve: ``attnbase serve``, the service over a database (pages, JSON/Arrow HTTP API, tokens).

One module per resource (Datasette's layout): :mod:`.runs`, :mod:`.heads`, :mod:`.sql`,
:mod:`.reports`, :mod:`.auth`; every limit lives in :mod:`.settings`. A page and its ``/api`` twin
call the same data function. It reads through the warehouse (and reuses the reports' figures);
it never runs a model and never writes a run. Importing this package imports nothing heavy (the
catalog migrations import :mod:`.migrations`).
"""

from __future__ import annotations

from attnbase._lazy import lazy_getattr

_EXPORTS = {
    "create_app": "attnbase.serve.app",
    "Settings": "attnbase.serve.settings",
    "connect": "attnbase.serve.client",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
