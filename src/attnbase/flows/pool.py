"""Jobs through a Prefect work pool: workers on every GPU box pull pipeline runs from one queue.

The deployment ``attnbase-pipeline/pool-<POOL>`` is :func:`~attnbase.flows.pipeline.pipeline_flow`
by its module path (the installed attnbase: there is no source to pull) in the work pool POOL,
of type ``process``. :func:`serve_pool` (``attnbase worker``) makes the pool and the deployment
when missing and runs Prefect's :class:`~prefect.workers.process.ProcessWorker` on it: one flow
run at a time by default, each in a subprocess of its own (``python -m prefect.engine``).
:func:`submit` (``attnbase flow submit``) queues a flow run of the deployment that any worker
picks up.

A submission carries the config's text and the database's absolute location, so a worker
needs no copy of the file; the database (a team database's address, or a directory every
machine mounts at the same path) is what the workers share. Each run is written once: the
flow opens every run with ``wait`` (the run's lease in the catalog: a second worker given the
same run waits for the first, then finds it complete), and the ledger makes a resubmission
after a worker died write only the batches it lacks.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Callable

from attnbase.errors import AttnbaseError

POOL_TYPE = "process"
FLOW_NAME = "attnbase-pipeline"


class PoolError(AttnbaseError):
    """A work pool, or the Prefect server behind it, that attnbase cannot use."""


def deployment_name(pool: str) -> str:
    return f"pool-{pool}"


def deployment_ref(pool: str) -> str:
    """``FLOW/DEPLOYMENT``, as ``prefect deployment run`` and ``run_deployment`` name it."""
    return f"{FLOW_NAME}/{deployment_name(pool)}"


def require_api() -> str:
    """The Prefect API this process talks to (``PREFECT_API_URL``), checked to answer; a
    one-line :class:`PoolError` otherwise. Call before Prefect is imported (it sets the
    offline environment of :func:`~attnbase.flows.serving.prepare_environment`)."""
    from attnbase.flows.serving import prepare_environment, server_healthy

    url, _ = prepare_environment(server=False)
    if not url:  # a Prefect profile may name it
        from prefect.settings import PREFECT_API_URL

        url = PREFECT_API_URL.value()
    if not url:
        raise PoolError("no Prefect server is named: set PREFECT_API_URL=http://HOST:4200/api to "
                        "the team's server (`prefect server start --host 0.0.0.0` runs one)")
    if not server_healthy(url, timeout=5.0):
        raise PoolError(f"no Prefect server answers at PREFECT_API_URL={url}; start it there "
                        "(`prefect server start`) or fix the address")
    return url


async def _ensure_pool(client, pool: str):
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    try:
        wp = await client.read_work_pool(pool)
    except ObjectNotFound:
        try:
            wp = await client.create_work_pool(WorkPoolCreate(
                name=pool, type=POOL_TYPE,
                base_job_template=ProcessWorker.get_default_base_job_template()))
        except ObjectAlreadyExists:  # another worker made it meanwhile
            wp = await client.read_work_pool(pool)
    if wp.type != POOL_TYPE:
        raise PoolError(f"work pool {pool!r} is of type {wp.type!r}; attnbase workers serve "
                        f"pools of type {POOL_TYPE!r}: choose another --pool name, or delete "
                        f"it (`prefect work-pool delete {pool}`)")
    return wp


async def _deploy(pool: str):
    from prefect.client.orchestration import get_client
    from prefect.deployments.runner import EntrypointType

    from attnbase.flows.pipeline import pipeline_flow

    async with get_client() as client:
        await _ensure_pool(client, pool)
    dep = await pipeline_flow.ato_deployment(name=deployment_name(pool),
                                             entrypoint_type=EntrypointType.MODULE_PATH)
    return await dep.aapply(work_pool_name=pool)


def deploy(pool: str):
    """Make the pool (type ``process``) when missing, refuse one of another type, and create
    or update the pool's deployment of the pipeline flow; returns the deployment's id."""
    return asyncio.run(_deploy(pool))


def submit(config: str | Path, pool: str, db: str | None = None):
    """Queue ``config`` (validated first, as ``attnbase flow run`` does) as a flow run of the
    pool's deployment; returns the :class:`~prefect.client.schemas.objects.FlowRun`.

    ``db`` (else the config's ``db`` key) is sent as this machine resolves it: an address as
    is, a directory made absolute (the workers must see it at that path)."""
    from attnbase.flows.config import load_pipeline_config, pipeline_database

    path = Path(config)
    target = pipeline_database(load_pipeline_config(path), db)
    text = path.read_text(encoding="utf-8")
    require_api()
    deploy(pool)
    from prefect.deployments import run_deployment

    return run_deployment(deployment_ref(pool), timeout=0, parameters={
        "config": str(path.resolve()), "db": target, "toml": text, "wait": True})


def follow_lines(flow_run, api_url: str) -> list[str]:
    """What ``flow submit`` prints of a queued run: its id, and how to follow it."""
    return [f"flow run {flow_run.name} ({flow_run.id}) queued",
            f"follow it: PREFECT_API_URL={api_url} prefect flow-run logs {flow_run.id}",
            f"wait for it: PREFECT_API_URL={api_url} prefect flow-run watch {flow_run.id}"]


def wait_for(flow_run_id, poll_s: float = 1.0, timeout: float | None = None):
    """Poll the API until the flow run is in a final state; returns it (None at ``timeout``)."""
    import time

    from prefect import get_client

    deadline = None if timeout is None else time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            fr = client.read_flow_run(flow_run_id)
            if fr.state is not None and fr.state.is_final():
                return fr
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)


def serve_pool(pool: str, *, limit: int = 1, echo: Callable[[str], Any] = print) -> None:
    """Run a :class:`~prefect.workers.process.ProcessWorker` on ``pool`` until interrupted,
    after :func:`deploy`. ``limit``: flow runs at once on this worker."""
    import socket

    from prefect.workers.process import ProcessWorker

    deploy(pool)
    name = f"attnbase-{socket.gethostname()}-{os.getpid()}"

    async def _main() -> None:
        async with ProcessWorker(work_pool_name=pool, name=name, limit=limit,
                                 create_pool_if_not_found=False) as worker:
            echo(f"worker {name} serves pool {pool!r} (deployment {deployment_ref(pool)}, "
                 f"{limit} run(s) at a time) at {os.environ.get('PREFECT_API_URL')}; "
                 "Ctrl-C stops it")
            await worker.start(printer=echo)

    asyncio.run(_main())
