"""The one retry policy of catalog access: a transient fault is retried with a wait that doubles
from ``first_s`` up to ``cap_s``, for ``within_s`` seconds, then the last error is raised as it
is; any other error is raised at once (tenacity's ``Retrying``).

Both backends open through it: the embedded catalog waits for another process's file lock
(:mod:`~attnbase.warehouse.catalog.duckdb_file`), the team database for a server that refuses or
drops connections (:mod:`~attnbase.warehouse.catalog.ducklake`). The caller turns the error that
ends the wait into its one line.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import tenacity

T = TypeVar("T")


def retry_transient(attempt: Callable[[], T], *, transient: Callable[[BaseException], bool],
                    within_s: float, first_s: float, cap_s: float) -> T:
    """``attempt()``'s value; a raised error for which ``transient(err)`` is true is retried
    (waits ``first_s``, ``2 * first_s``, ... at most ``cap_s`` each) until ``within_s``
    seconds have passed since the first attempt; then, or for any other error, that error."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(transient),
        wait=tenacity.wait_exponential(multiplier=first_s, max=cap_s),
        stop=tenacity.stop_after_delay(within_s),
        reraise=True,
    )(attempt)
