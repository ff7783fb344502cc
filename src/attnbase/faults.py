"""Seeded fault injection: named points where a test may SIGKILL the process, and named steps
where it may make the disk full.

The write path calls :func:`point` at each durability step (see ``POINTS``, and
``MAINTENANCE_POINTS`` of the maintenance commands); tests set
``ATTNBASE_KILL_AT=<name>[:<n>]`` to kill the process at the n-th time (1-based, default 1) that
point is reached. Unset, :func:`point` is one dictionary lookup. :func:`disk_full` wraps a step
that writes a file; ``ATTNBASE_DISK_FULL_AT=<name>:<bytes>`` makes every file the process
writes stop growing past ``bytes`` during that step (the kernel's ``RLIMIT_FSIZE``: a write
past it fails with EFBIG, as one on a full disk fails with ENOSPC). This module imports
nothing from the stages so every stage may call it.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

ENV = "ATTNBASE_KILL_AT"
DISK_FULL_ENV = "ATTNBASE_DISK_FULL_AT"

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

#: Points of the maintenance commands (not of a batch's write path).
MAINTENANCE_POINTS: tuple[str, ...] = (
    "merge_written",    # compact: a merged statistics file written as .partial, not renamed
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


@contextmanager
def disk_full(name: str):
    """While the block runs, files this process writes cannot grow past the byte count of
    ``ATTNBASE_DISK_FULL_AT=<name>:<bytes>`` when it names this step (SIGXFSZ ignored, so the
    write fails with EFBIG instead of killing the process). Unset: nothing. The main thread
    only (a signal's disposition is set there)."""
    spec = os.environ.get(DISK_FULL_ENV, "")
    step, _, limit = spec.partition(":")
    if step != name or not limit:
        yield
        return
    import resource

    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
        signal.signal(signal.SIGXFSZ, old)
