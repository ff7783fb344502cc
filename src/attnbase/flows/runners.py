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
        kwargs = {"n_workers": workers, "processes": True, "threads_per_worker": 1,
                  "dashboard_address": None}
        api = coordinator_api_url()
        if api:  # the workers report to the flow's API, never to servers of their own
            kwargs["env"] = {"PREFECT_API_URL": api}
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)
    raise PipelineConfigError(f"unknown task runner {kind!r}; use one of {', '.join(TASK_RUNNERS)}")


def coordinator_api_url() -> str | None:
    """The Prefect API this (flow) process talks to: ``PREFECT_API_URL``, or the temporary
    server Prefect started for it (``attnbase flow run`` without a server).

    A LocalCluster's worker processes get it in their environment: without it each worker
    starts a temporary Prefect server of its own when its first task runs (seconds each), and a
    worker SIGKILLed mid-run leaves that server running, an orphan (found by the killed-worker
    test). With ``dask_address`` the workers' environment is their own: set ``PREFECT_API_URL``
    there to the flow's server."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url:
        return url
    from attnbase.private_api import resolve

    server = resolve("prefect.server.api.server.SubprocessASGIServer")()  # the one get_client() started (one per process)
    return server.api_url if server.running else None
