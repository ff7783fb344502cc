"""``attnbase serve --workers N``: N server processes on one listening socket.

One process runs Python on one core at a time (the GIL): under 16 clients a single server
leaves cores idle while its requests queue (benchmarks/RESULTS.md: "one server process"). Here the
parent binds the socket once, starts N spawned workers that each build their own app (their own
catalog snapshots, DuckDB instance, memo and query pools) and accept on that socket, and prints
the one URL line when every worker is ready: warm
(:func:`attnbase.serve.uvicorn_server.warm_up`), so
that no client's first request on a fresh worker pays for torch's import or the first snapshot
(benchmarks/RESULTS.md: "a worker started cold"). Everything
a worker shares with another lives in the database (tokens, the catalog state behind ETags),
so any worker answers any request.

Ctrl-C (SIGINT) or SIGTERM to the parent goes to every worker; each interrupts its running
queries and stops as a single server does, and a worker still there after
:data:`STOP_WAIT_S` is killed. A worker that dies while serving is started again (one line on
stderr); one that dies before it is ready stops them all with exit 2.

Kept in place of uvicorn's own supervisor (``uvicorn.supervisors.Multiprocess``, ``--workers``):
each of its workers runs a plain ``uvicorn.Server`` built from a pickled ``Config``, so the
server of :func:`attnbase.serve.uvicorn_server.uvicorn_server` (which interrupts the running
queries on SIGINT/SIGTERM and reports when it listens) is not the one that runs; it prints no
line once every worker is warm, and its parent exits 0 after a signal (benchmarks/RESULTS.md:
"the workers' supervisor, uvicorn's").
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import time

#: Seconds the parent waits for its workers to stop before killing them (uvicorn's graceful
#: shutdown inside each is :data:`attnbase.serve.uvicorn_server.GRACE_S`).
STOP_WAIT_S = 1.5
#: Seconds a worker may take to import and open its app before the start is given up.
START_WAIT_S = 120.0

_spawn = multiprocessing.get_context("spawn")
multiprocessing.allow_connection_pickling()  # the listening socket travels to each worker


def _worker(settings, sock, access_log: bool, ready) -> None:
    """One worker: its own app on the shared socket (runs in a spawned process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until uvicorn installs its handlers
    from attnbase.serve.app import create_app
    from attnbase.serve.uvicorn_server import uvicorn_server, warm_up

    app = create_app(settings)
    warm_up(app)
    server = uvicorn_server(settings, app, access_log=access_log,
                            on_ready=lambda: ready.put(os.getpid()))
    server.run(sockets=[sock])


def supervise(settings, sock, *, access_log: bool = False) -> int:
    """Run ``settings.workers`` workers on ``sock`` until SIGINT/SIGTERM; the exit status
    (130 after SIGINT, 143 after SIGTERM, 2 when a worker cannot start)."""
    ready = _spawn.Queue()

    def start():
        p = _spawn.Process(target=_worker, args=(settings, sock, access_log, ready),
                           name="attnbase-serve-worker", daemon=False)
        p.start()
        return p

    procs = [start() for _ in range(settings.workers)]
    stop = {"sig": None}

    def on_signal(sig, frame):
        stop["sig"] = sig

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    up, deadline = 0, time.monotonic() + START_WAIT_S
    while up < len(procs) and stop["sig"] is None:
        try:
            ready.get(timeout=0.2)
            up += 1
        except queue.Empty:
            dead = [p for p in procs if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                why = (f"exited with code {dead[0].exitcode}" if dead
                       else f"not ready after {START_WAIT_S:.0f} s")
                print(f"error: a server worker {why} before it was ready; nothing is served",
                      file=sys.stderr, flush=True)
                _stop_all(procs)
                return 2
    if stop["sig"] is None:
        print(f"attnbase serve: {settings.url} (database {settings.db}; {len(procs)} workers; "
              "Ctrl-C stops)", flush=True)
    while stop["sig"] is None:
        time.sleep(0.2)
        for i, p in enumerate(procs):
            if not p.is_alive() and stop["sig"] is None:
                print(f"attnbase serve: worker {p.pid} exited with code {p.exitcode}; starting "
                      "another", file=sys.stderr, flush=True)
                procs[i] = start()
    _stop_all(procs)
    return 128 + stop["sig"]  # as a signal's death reads: 130 after Ctrl-C, 143 after SIGTERM


def _stop_all(procs) -> None:
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGINT)
    deadline = time.monotonic() + STOP_WAIT_S
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0.0))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(1.0)
