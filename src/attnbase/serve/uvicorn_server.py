"""One uvicorn server over the app, as a single server and each worker run it.

Both :mod:`attnbase.serve.server` (one process) and :mod:`attnbase.serve.workers` (N processes
on one socket) build their server here.
"""

from __future__ import annotations

import sys

from attnbase.serve.settings import Settings

#: Seconds uvicorn waits for open connections after Ctrl-C.
GRACE_S = 1


def one_thread_per_request() -> None:
    """Requests are the service's parallelism: the array arithmetic of one (torch's, for
    derived logits) runs on its own thread. A thread pool per request keeps idle threads
    spinning on the other cores (benchmarks/RESULTS.md: "one thread per request")."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read when torch is first imported
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def warm_up(app) -> None:
    """What a worker's first requests would otherwise pay: torch's import (derived logits,
    ~1.2 s), zarr's and pyarrow's, the templates' compilation, the catalog's first
    snapshot and the checksums of the statistics files it lists (:mod:`.filecheck`). Errors
    are the requests' to report, not the start's."""
    import pyarrow.parquet  # noqa: F401
    import zarr  # noqa: F401

    from attnbase.logits import preload
    from attnbase.serve.web import templates

    one_thread_per_request()  # before torch's import: it reads OMP_NUM_THREADS then
    preload()
    env = templates()
    for name in env.list_templates(extensions=["j2"]):
        env.get_template(name)
    try:
        cat = app.state.catalog
        cat.etag_state()
        if cat.filecheck is not None:
            from attnbase.serve.filecheck import damaged_in

            damaged_in(cat.reader(), cat.filecheck)
    except Exception:  # noqa: BLE001
        pass


def uvicorn_server(settings: Settings, app, *, access_log: bool = False, on_ready=None):
    """The uvicorn server of ``app``: on SIGINT/SIGTERM the catalog's running queries are
    interrupted at once; ``on_ready`` is called once it listens."""
    import uvicorn

    from attnbase.private_api import resolve

    cat = app.state.catalog
    # the two methods overridden below (docs/toolchain.md): one line if a release renames them,
    # rather than an override that is silently never called
    resolve("uvicorn.Server.startup"), resolve("uvicorn.Server.handle_exit")

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if not self.should_exit and on_ready is not None:
                on_ready()

        def handle_exit(self, sig, frame):
            cat.cancel.set()
            super().handle_exit(sig, frame)

    from attnbase.serve.deadlines import protocol_class

    config = uvicorn.Config(app, host=settings.host, port=settings.port,
                            log_level="info" if access_log else "warning",
                            access_log=access_log, timeout_graceful_shutdown=GRACE_S,
                            lifespan="on", server_header=False,
                            http=protocol_class(settings),
                            timeout_keep_alive=settings.keep_alive_s)
    if access_log:
        _paths_only()
    return Server(config)


class _PathOnly:
    """A filter of uvicorn's access log: the request's path without its query string (which
    may hold a token or a query's text)."""

    def filter(self, record) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
        return True


def _paths_only() -> None:
    import logging

    log = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _PathOnly) for f in log.filters):
        log.addFilter(_PathOnly())
