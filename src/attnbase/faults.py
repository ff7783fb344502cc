"""Seeded fault injection: named points where a test may SIGKILL the process.

The write path calls :func:`point` at each durability step (see ``POINTS``); tests set
``ATTNBASE_KILL_AT=<name>[:<n>]`` to kill the process at the n-th time (1-based, default 1) that
point is reached. Unset, :func:`point` is one dictionary lookup. This module imports nothing from
the stages so every stage may call it.
"""

from __future__ import annotations

import os
import signal

ENV = "ATTNBASE_KILL_AT"

#: Every fault point, in the order one batch reaches them. Tests iterate over this tuple, so a
#: point added to the write path must be added here too (a test checks the write path uses each).
POINTS: tuple[str, ...] = (
    "batch_start",      # before the forward of a batch
    "after_forward",    # the batch is captured in memory, nothing written
    "chunk_written",    # after each chunk file is written (before fsync / rename completes a set)
    "chunks_durable",   # all chunks of the batch written and fsynced, catalog not yet touched
    "stats_written",    # row/col statistics of the batch written, ledger not yet updated
    "ledger_updated",   # the batch is counted complete in the ledger
    "run_finishing",    # every batch done, run status not yet 'complete'
)

_hits: dict[str, int] = {}


def _target() -> tuple[str, int] | None:
    spec = os.environ.get(ENV)
    if not spec:
        return None
    name, _, n = spec.partition(":")
    return name, int(n) if n else 1


def point(name: str) -> None:
    """Kill this process with SIGKILL if ``ATTNBASE_KILL_AT`` names this point and hit count."""
    target = _target()
    if target is None or target[0] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == target[1]:
        os.kill(os.getpid(), signal.SIGKILL)
