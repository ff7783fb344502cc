"""Task runners: local threads by default, a multi-process Dask ``LocalCluster`` on request.

Both are plain Prefect task runners used as context managers inside a flow, so the choice is
data (the pipeline TOML's ``task_runner``) rather than a decorator argument, and works the same
under ``attnbase flow run`` and a served (scheduled) deployment.
"""

from __future__ import annotations

from attnbase.flows.config import TASK_RUNNERS, PipelineConfigError


def make_task_runner(kind: str = "local", workers: int = 2, address: str = ""):
    """A fresh, unstarted task runner.

    ``local``: ``ThreadPoolTaskRunner(max_workers=workers)``.
    ``dask``: ``prefect_dask.DaskTaskRunner`` over a ``distributed.LocalCluster`` of ``workers``
    processes with one thread each (torch already uses several cores per forward pass, and one
    thread per process keeps each model's memory in one place); with ``address`` the existing
    scheduler there instead (its workers may live on other machines: give the runs a shared
    ``store``, since workers write chunks and statistics files straight to it).
    """
    if kind == "local":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=workers)
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        if address:
            return DaskTaskRunner(address=address)
        return DaskTaskRunner(
            cluster_class="distributed.LocalCluster",
            cluster_kwargs={"n_workers": workers, "processes": True, "threads_per_worker": 1,
                            "dashboard_address": None},
        )
    raise PipelineConfigError(f"unknown task runner {kind!r}; use one of {', '.join(TASK_RUNNERS)}")
