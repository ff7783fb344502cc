"""Ctrl-C that is never lost.

DuckDB's Python client turns a KeyboardInterrupt raised while it runs a statement into its own
exception, and drops it where the statement had finished: a Ctrl-C that lands there would be
forgotten and a long query would run to its time limit. :func:`handle_ctrl_c` installs a
SIGINT handler that records the interrupt (:func:`requested`) before raising
KeyboardInterrupt as Python's default handler does, so the loops that wait on long work check
the record as well as catching the exception.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

_requested = threading.Event()


def requested() -> bool:
    """Whether Ctrl-C came since :func:`handle_ctrl_c` began."""
    return _requested.is_set()


def _on_sigint(signum, frame) -> None:
    _requested.set()
    signal.default_int_handler(signum, frame)


@contextmanager
def handle_ctrl_c() -> Iterator[None]:
    """Record every SIGINT while the block runs (main thread only; elsewhere a no-op); the
    previous handler is restored after it, and the record cleared."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested.clear()
    before = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        _requested.clear()
