"""``attnbase flow run`` and ``attnbase schedule``: the Prefect pipeline, once or on a cron schedule."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from attnbase.commands.dbopt import db_option, directory_db
from attnbase.warehouse.database import location

flow_app = typer.Typer(add_completion=False, no_args_is_help=True,
                       help="Prefect flows: run the TOML-configured pipeline.")


#: What Ctrl-C prints before a flow run exits (exit status 130 = 128 + SIGINT).
INTERRUPTED = ("interrupted: the flow run stopped; every batch the ledger counts is durable; "
               "run the same command to resume")


def _end_children() -> None:
    """SIGTERM this process's children (Prefect's temporary API server, Dask's LocalCluster):
    ``os._exit`` skips the atexit hooks that would stop them, and a SIGINT sent to this process
    alone (not a terminal's whole process group) would leave them running."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.terminate()
            except psutil.Error:
                pass
    except Exception:  # best effort: the exit itself must happen
        pass


def stop_on_sigint(message: str = INTERRUPTED):
    """Make Ctrl-C end a flow run (or a worker) at once: one line, ``message``, exit 130.

    Prefect runs tasks in worker threads (or Dask processes) and retries them, and its main
    thread may sit in calls that a Python-level signal handler cannot interrupt, so a
    KeyboardInterrupt did not stop a run promptly (20 s and more were seen). Here SIGINT is
    blocked in this thread (and so in every thread started after it) and a daemon thread waits
    for it with ``sigwait``: it is acted on whatever the other threads are doing. A SIGINT
    delivered to a thread started earlier (a native library's) runs the Python handler, which
    the main thread may reach only seconds later (an idle event loop); the C-level handler
    also writes the signal's number to the wakeup fd, whose pipe another daemon thread reads,
    so that one acts at once too.

    Exiting without unwinding is safe for the data: the write path survives kill -9 at any
    point (tests/warehouse/test_faults.py) and the ledger makes the next run resume where this
    one stopped. Returns a function that restores the previous behaviour.
    """
    import os
    import signal
    import threading

    def _stop(*_args) -> None:
        try:  # os.write, not sys.stderr: another thread may hold sys.stderr's lock
            os.write(2, (message + "\n").encode())
            _end_children()
        finally:
            os._exit(130)

    def _wait() -> None:
        signal.sigwait({signal.SIGINT})
        _stop()

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def _read() -> None:
        while True:
            got = os.read(read_fd, 64)
            if not got:  # restore() closed the write end
                os.close(read_fd)
                return
            if signal.SIGINT in got:
                _stop()

    previous = signal.signal(signal.SIGINT, _stop)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    threading.Thread(target=_wait, name="attnbase-sigint", daemon=True).start()
    threading.Thread(target=_read, name="attnbase-sigint-fd", daemon=True).start()

    def restore() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, previous)
        signal.set_wakeup_fd(previous_fd)
        os.close(write_fd)

    return restore


def register(app: typer.Typer) -> None:
    app.add_typer(flow_app, name="flow")
    app.command("schedule")(schedule)


@flow_app.command("submit")
def submit(
    config: Path = typer.Argument(..., help="pipeline TOML (see examples/pipeline.toml)"),
    pool: str = typer.Option(..., "--pool", help="the work pool whose workers run it "
                             "(`attnbase worker --pool NAME`)"),
    db: Optional[str] = db_option("the database, overriding the TOML's db: a team database's "
                                   "postgresql:// address or a directory every worker sees at "
                                   "the same path (default $ATTNBASE_DB)", default=None),
    wait: bool = typer.Option(False, "--wait", help="wait for the flow run to finish and print "
                              "its final state (exit 1 unless it completed)"),
) -> None:
    """Queue CONFIG's pipeline as a flow run of a work pool; any of its workers runs it."""
    from attnbase.flows.serving import prepare_environment

    prepare_environment(server=False)  # before Prefect reads its settings
    from attnbase.flows.config import load_pipeline_config

    from attnbase.flows.config import pipeline_database

    pipeline_database(load_pipeline_config(config), db)  # one line, before a server is asked
    from attnbase.flows import pool as work_pool

    api = work_pool.require_api()
    fr = work_pool.submit(config, pool, db)
    for line in work_pool.follow_lines(fr, api):
        typer.echo(line)
    if wait:
        from attnbase.flows.serving import run_line

        done = work_pool.wait_for(fr.id)
        typer.echo(run_line(done))
        if not done.state.is_completed():
            raise typer.Exit(1)


@flow_app.command("run")
def run(
    config: Path = typer.Option(..., "--config", help="pipeline TOML (see examples/pipeline.toml)"),
    db: Optional[str] = db_option("the database, overriding the TOML's db: a directory or a "
                                   "postgresql:// address (default $ATTNBASE_DB)", default=None),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate CONFIG and print the plan "
                                 "(models, shapes, stored bytes); loads no model, no network"),
    strict: bool = typer.Option(False, "--strict", help="with --dry-run: exit 2 when an input "
                                "a real run needs is missing (a corpus file, an uncached model)"),
) -> None:
    """Extract every model x corpus of CONFIG, analyse every run, and write the report."""
    if dry_run:
        from attnbase.commands.flow_plan import print_plan

        print_plan(config, db, strict=strict)
        return
    restore = stop_on_sigint()  # first: every thread started from here on blocks SIGINT
    try:
        from attnbase.flows.serving import prepare_environment

        prepare_environment(server=False)  # before Prefect reads its settings
        from attnbase.flows.config import load_pipeline_config
        from attnbase.flows.pipeline import run_pipeline

        cfg = load_pipeline_config(config)  # one-line errors before Prefect starts
        t0 = time.perf_counter()
        out = run_pipeline(config, db=location(db) if db else None)
    finally:
        restore()
    stages = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in out["timings"].items())
    typer.echo(f"pipeline {cfg.source}: {len(out['runs'])} run(s) {', '.join(out['runs'])} on the "
               f"{out['task_runner']} task runner in {time.perf_counter() - t0:.1f} s "
               f"({stages})")
    report = out.get("report") or {}
    for kind in ("html", "pdf"):  # one path per line, like `attnbase report`
        if report.get(kind):
            typer.echo(f"report: {report[kind]}")


def schedule(
    config: Path = typer.Option(..., "--config", help="pipeline TOML (see examples/pipeline.toml)"),
    cron: str = typer.Option(..., "--cron", help='cron expression, e.g. "0 3 * * *" (daily at 03:00)'),
    name: str = typer.Option("attnbase-pipeline", "--name", help="deployment name"),
    db: Optional[str] = db_option("the database, overriding the TOML's db: a directory or a "
                                   "postgresql:// address (default $ATTNBASE_DB)", default=None),
    once: bool = typer.Option(False, "--once", help="stop after the first scheduled run has finished"),
    for_seconds: Optional[float] = typer.Option(None, "--for", metavar="SECONDS",
                                                help="stop picking up runs after SECONDS"),
    keep_server: bool = typer.Option(False, "--keep-server",
                                     help="leave a server this command started running afterwards"),
) -> None:
    """Serve the pipeline on a cron schedule against a local Prefect server (started if needed)."""
    from attnbase.flows.serving import ensure_server, prepare_environment

    api_url, home = prepare_environment(server=True)
    from attnbase.flows.config import load_pipeline_config

    load_pipeline_config(config)
    from prefect.client.schemas.schedules import CronSchedule  # validates before a server starts

    try:
        CronSchedule(cron=cron)
    except ValueError:
        typer.echo(f'error: --cron {cron!r} is not a cron expression; write e.g. --cron "0 3 * * *"',
                   err=True)
        raise typer.Exit(2)
    server = ensure_server(api_url, home)
    typer.echo(server.describe())
    if server.started:
        typer.echo("attnbase stops this server when serving ends" if not keep_server else
                   "the server keeps running after this command (--keep-server)")
    failed = False
    try:
        from attnbase.flows.serving import serve_pipeline

        runs = serve_pipeline(str(config), cron, name=name, db=location(directory_db(db, "schedule")) if db else None,
                              once=once, for_seconds=for_seconds, echo=typer.echo)
        for r in runs:  # a finished run's line was echoed when it finished
            if not r.get("reported"):
                typer.echo(f"flow run {r['name']} ({r['id']}): {r['state']} (still running when "
                           f"serving stopped)")
        failed = any(r["state"] in ("FAILED", "CRASHED") for r in runs)
    finally:
        if server.started and not keep_server:
            server.stop()
            typer.echo(f"stopped the Prefect server (pid {server.pid})")
        sys.stdout.flush()
    if failed:
        raise typer.Exit(1)
