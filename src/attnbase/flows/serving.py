"""Serving the pipeline on a cron schedule against a local Prefect server.

Cron schedules only fire against a real ``prefect server start`` (the ephemeral server that a
plain flow call brings up has no scheduler running long enough). :func:`ensure_server` starts
one when nothing answers at ``PREFECT_API_URL`` (project-local ``PREFECT_HOME``, UI and analytics
off) and returns its PID; :func:`serve_pipeline` is ``flow.serve(name=, cron=, parameters=)``
with two bounds a test (or a cron smoke check) needs: ``once`` (stop after the first scheduled
run has finished) and ``for_seconds`` (stop picking up runs after that long, then let an
in-flight run finish).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

from attnbase.errors import AttnbaseError

DEFAULT_API_URL = "http://127.0.0.1:4200/api"

#: Environment every Prefect process of this project runs with (docs/toolchain.md: offline Prefect).
OFFLINE_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_UI_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}


class ServerError(AttnbaseError):
    """A local Prefect server that could not be reached or started."""


@dataclass(frozen=True)
class ServerHandle:
    api_url: str
    pid: int | None  # None when a server was already running (not ours to stop)
    started: bool
    log: str | None
    prefect_home: str

    def describe(self) -> str:
        if not self.started:
            return f"using the Prefect server already running at {self.api_url}"
        return (f"started a local Prefect server: `python -m prefect server start` at {self.api_url} "
                f"(pid {self.pid}, PREFECT_HOME={self.prefect_home}, log {self.log}); "
                f"stop it with `kill -TERM {self.pid}`")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server we started (its whole process group), then SIGKILL if it lingers."""
        if not self.started or self.pid is None:
            return
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:  # reap the leader when it is our child: a zombie still counts in its group
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pass  # not our child, or reaped already
            try:
                os.killpg(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def prepare_environment(*, server: bool, cwd: Path | None = None) -> tuple[str | None, str]:
    """Set the offline Prefect env (unless already set); return ``(api_url, prefect_home)``.

    Must run before Prefect is imported (it reads its settings then; this module and
    ``attnbase.flows`` import it lazily). ``PREFECT_HOME`` defaults to ``./.prefect``; with
    ``server`` (serving a schedule needs a real server) ``PREFECT_API_URL`` defaults to
    ``http://127.0.0.1:4200/api``, else it stays unset and a flow run uses an ephemeral server.
    """
    unset = [k for k in (*OFFLINE_ENV, "PREFECT_HOME") if k not in os.environ]
    if "prefect" in sys.modules and unset:  # too late for this process; children still see it
        import warnings

        warnings.warn(f"Prefect was imported before attnbase set {', '.join(unset)}",
                      stacklevel=2)
    cwd = cwd or Path.cwd()
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    home = os.environ.setdefault("PREFECT_HOME", str((cwd / ".prefect").resolve()))
    api = os.environ.setdefault("PREFECT_API_URL", DEFAULT_API_URL) if server else \
        os.environ.get("PREFECT_API_URL")
    return api, home


def server_healthy(api_url: str, timeout: float = 1.0) -> bool:
    """Whether ``<api_url>/health`` answers 200 within ``timeout`` seconds (redirects followed);
    False for any other status, no answer, or a URL that is not one."""
    import httpx

    try:
        r = httpx.get(f"{api_url.rstrip('/')}/health", timeout=timeout, follow_redirects=True)
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError):
        return False
    return r.status_code == 200


def ensure_server(api_url: str, prefect_home: str, startup_timeout: float = 120.0) -> ServerHandle:
    """Reuse the server at ``api_url`` if it answers, else start ``prefect server start`` there."""
    if server_healthy(api_url):
        return ServerHandle(api_url, None, False, None, prefect_home)
    u = urlparse(api_url)
    if u.hostname not in ("127.0.0.1", "localhost", "0.0.0.0") or not u.port:
        raise ServerError(f"no Prefect server answers at PREFECT_API_URL={api_url} and it is not a "
                          f"local host:port attnbase could start one on; start it yourself or unset "
                          f"PREFECT_API_URL to use {DEFAULT_API_URL}")
    Path(prefect_home).mkdir(parents=True, exist_ok=True)
    log = Path(prefect_home) / "server.log"
    env = {**os.environ, **OFFLINE_ENV, "PREFECT_HOME": prefect_home}
    env.pop("PREFECT_API_URL", None)  # the server itself needs no client URL
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", u.hostname,
             "--port", str(u.port)],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,  # its own process group: SIGTERM reaches its children too
        )
    handle = ServerHandle(api_url, proc.pid, True, str(log), prefect_home)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"`prefect server start` exited with code {proc.returncode} before "
                              f"answering at {api_url}; see {log}")
        if server_healthy(api_url):
            return handle
        time.sleep(0.5)
    handle.stop()
    raise ServerError(f"the Prefect server did not answer at {api_url} within {startup_timeout:.0f} s; "
                      f"see {log}")


def local_timezone() -> str:
    """This machine's IANA time zone (``TZ`` or the system's, as tzlocal reads it), else UTC."""
    try:
        from tzlocal import get_localzone_name

        return get_localzone_name() or "UTC"
    except Exception:  # noqa: BLE001 - an unreadable zone setup: say UTC rather than fail
        return "UTC"


def next_run(cron: str, tz: str, now=None):
    """The first time after ``now`` (default: this moment) that ``cron`` fires in zone ``tz``."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from cronsim import CronSim

    zone = ZoneInfo(tz)
    now = (now or datetime.now(zone)).astimezone(zone)
    return next(CronSim(cron, now.replace(second=0, microsecond=0)))


def schedule_lines(deployment: str, cron: str, tz: str, api_url: str, now=None) -> list[str]:
    """What ``attnbase schedule`` says of its deployment: name, cron and zone, the next run
    time and a command that triggers a run now against this server."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    now = (now or datetime.now(ZoneInfo(tz))).astimezone(ZoneInfo(tz))
    nxt = next_run(cron, tz, now)
    wait = int((nxt - now).total_seconds() // 60) + 1
    hours, minutes = divmod(wait, 60)
    return [f"deployment: {deployment}",
            f"schedule: cron {cron!r} in time zone {tz} (this machine's)",
            f"next run: {nxt:%Y-%m-%d %H:%M} {tz} (in {f'{hours} h ' if hours else ''}"
            f"{minutes} min)",
            f"run it now: PREFECT_API_URL={api_url} prefect deployment run '{deployment}'"]


def run_line(flow_run) -> str:
    """One line for a flow run of the deployment that has finished: its name, id, final state,
    whether the schedule or a trigger (``prefect deployment run``) made it, and its run time.

    >>> from types import SimpleNamespace as NS
    >>> from datetime import timedelta
    >>> r = NS(id="5f0c", name="calm-otter", auto_scheduled=False,
    ...        total_run_time=timedelta(seconds=12.34), state=NS(type=NS(value="COMPLETED")))
    >>> run_line(r)
    'flow run calm-otter (5f0c): COMPLETED (triggered, 12.3 s)'
    """
    state = flow_run.state.type.value if flow_run.state else "UNKNOWN"
    how = "scheduled" if getattr(flow_run, "auto_scheduled", False) else "triggered"
    took = getattr(flow_run, "total_run_time", None)
    took = f", {took.total_seconds():.1f} s" if took is not None else ""
    return f"flow run {flow_run.name} ({flow_run.id}): {state} ({how}{took})"


def report_finished(flow_runs, reported: set[str], echo: Callable[[str], Any]) -> int:
    """Echo :func:`run_line` once for each run of ``flow_runs`` in a final state whose id is
    not in ``reported`` (which it then joins); returns how many lines were echoed."""
    n = 0
    for r in sorted(flow_runs, key=lambda r: str(getattr(r, "expected_start_time", "") or "")):
        if r.state and r.state.is_final() and str(r.id) not in reported:
            reported.add(str(r.id))
            echo(run_line(r))
            n += 1
    return n


def serve_pipeline(config: str, cron: str, *, name: str = "attnbase-pipeline", db: str | None = None,
                   once: bool = False, for_seconds: float | None = None,
                   echo: Callable[[str], Any] = print, grace_s: float = 900.0) -> list[dict[str, Any]]:
    """Serve :func:`pipeline_flow` on ``cron``; return the deployment's flow runs seen.

    Every run of the deployment, scheduled or triggered (``prefect deployment run``), gets one
    line (:func:`run_line`) through ``echo`` when it finishes. Unbounded (neither ``once`` nor
    ``for_seconds``) this is ``flow.serve(name=, cron=, parameters=)``'s runner and returns when
    the process is interrupted. Bounded, it runs the same
    :class:`prefect.runner.Runner` that ``flow.serve`` builds and stops it when the first run
    has finished (``once``) or ``for_seconds`` have passed (then waiting up to ``grace_s`` for a
    run already in flight).
    """
    from prefect.deployments.runner import EntrypointType
    from prefect.runner import Runner

    from attnbase.flows.pipeline import pipeline_flow

    import anyio
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.settings import PREFECT_API_URL

    params = {"config": str(Path(config).resolve()), "db": db}
    tz = local_timezone()
    runner = Runner(name=name, pause_on_shutdown=True)
    deployment_id = runner.add_flow(pipeline_flow, name=name,
                                    schedules=[CronSchedule(cron=cron, timezone=tz)],
                                    parameters=params, entrypoint_type=EntrypointType.MODULE_PATH)
    for line in schedule_lines(f"attnbase-pipeline/{name}", cron, tz, PREFECT_API_URL.value()):
        echo(line)
    echo(f"serving deployment {deployment_id}"
         + (f" for {for_seconds:.0f} s" if for_seconds is not None else "")
         + (" until one run has finished" if once else "")
         + ("" if once or for_seconds is not None else " until Ctrl-C"))
    bounded = once or for_seconds is not None
    t_start = time.monotonic()
    runs: list[dict[str, Any]] = []
    reported: set[str] = set()  # runs whose line was echoed as they finished

    async def _runs() -> list[Any]:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        async with get_client() as client:
            return await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))

    async def _watch() -> None:
        while not runner.started:
            await anyio.sleep(0.2)
        while True:
            await anyio.sleep(2.0)
            try:
                frs = await _runs()
            except Exception as err:  # unbounded serving outlives a server hiccup
                if bounded:
                    raise
                echo(f"could not read the deployment's flow runs ({err}); trying again")
                continue
            report_finished(frs, reported, echo)  # one line per scheduled or triggered run
            if not bounded:  # flow.serve's loop: until Ctrl-C stops the runner
                continue
            finished = [r for r in frs if r.state and r.state.is_final()]
            in_flight = [r for r in frs if r.state and (r.state.is_running() or r.state.is_pending())]
            elapsed = time.monotonic() - t_start
            if once and finished:
                break
            if for_seconds is not None and elapsed >= for_seconds:
                if not in_flight or elapsed >= for_seconds + grace_s:
                    break
        frs = await _runs()
        report_finished(frs, reported, echo)
        runs.extend({"id": str(r.id), "name": r.name, "state": r.state.type.value if r.state else None,
                     "scheduled": str(r.expected_start_time), "reported": str(r.id) in reported}
                    for r in frs)
        await runner.astop()

    async def _main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch)
            await runner.start()
            tg.cancel_scope.cancel()

    anyio.run(_main)
    return runs
