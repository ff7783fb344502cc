"""The ``report`` flow: one call into :func:`attnbase.reports.build_report`."""

from __future__ import annotations

from typing import Any

from prefect import flow

from attnbase.flows import tasks


@flow(name="attnbase-report")
def report_flow(db: str, run_id: str, compare: list[str] | None = None,
                out_dir: str | None = None) -> Any:
    """HTML (+PDF) report of ``run_id``, compared against the runs in ``compare`` if any."""
    return tasks.build_report_task(db, run_id, tuple(compare or ()), out_dir)
