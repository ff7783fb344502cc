"""Running the app: uvicorn on one host/port, one line with the URL, Ctrl-C within 2 s.

On SIGINT/SIGTERM every running query is interrupted at once (the catalog's ``cancel`` event,
watched by :mod:`attnbase.warehouse.watchdog`) and uvicorn's graceful shutdown waits at most
:data:`GRACE_S` for open requests.
"""

from __future__ import annotations

import sys

from attnbase.errors import AttnbaseError, AuthError, WarehouseError
from attnbase.serve.settings import Settings
from attnbase.warehouse.location import is_loopback

#: Seconds uvicorn waits for open connections after Ctrl-C.
GRACE_S = 1


def _check_port(settings: Settings) -> None:
    """One clear line, before uvicorn's own, when the address cannot be listened on."""
    import socket

    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((settings.host, settings.port))
        except OSError as err:
            raise AttnbaseError(f"cannot listen on {settings.host}:{settings.port} "
                                f"({err.strerror}); choose another --port or --host") from None


def _one_thread_per_request() -> None:
    """Requests are the service's parallelism: the array arithmetic of one (torch's, for
    derived logits) runs on its own thread. A thread pool per request keeps idle threads
    spinning on the other cores (measured: a pattern's server CPU 19.7 -> 5.9 ms)."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read when torch is first imported
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def warm_up(app) -> None:
    """What a worker's first requests would otherwise pay: torch's import (derived logits,
    ~1.2 s), zarr's and pyarrow's, the templates' compilation and the catalog's first
    snapshot. Errors are the requests' to report, not the start's."""
    import pyarrow.parquet  # noqa: F401
    import zarr  # noqa: F401

    from attnbase.logits import preload
    from attnbase.serve.web import templates

    _one_thread_per_request()  # before torch's import: it reads OMP_NUM_THREADS then
    preload()
    env = templates()
    for name in env.list_templates(extensions=["j2"]):
        env.get_template(name)
    try:
        app.state.catalog.etag_state()
    except Exception:  # noqa: BLE001
        pass


def _listening_socket(settings: Settings):
    """The workers' shared socket. Made with ``IPPROTO_TCP`` named: asyncio sets TCP_NODELAY
    only on connections whose socket says so, and one made with proto 0 (uvicorn's
    ``bind_socket``) left Nagle on: measured 52 ms a JSON response against 9.6 ms."""
    import socket

    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.set_inheritable(True)
    return sock


def uvicorn_server(settings: Settings, app, *, access_log: bool = False, on_ready=None):
    """The uvicorn server of ``app``: on SIGINT/SIGTERM the catalog's running queries are
    interrupted at once; ``on_ready`` is called once it listens."""
    import uvicorn

    cat = app.state.catalog

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


def serve(settings: Settings, *, access_log: bool = False) -> None:
    _one_thread_per_request()

    from attnbase.serve.app import create_app

    app = create_app(settings)
    cat = app.state.catalog
    try:
        if not cat.db.exists():
            raise WarehouseError(f"no attnbase database at {settings.db} (no catalog.duckdb); "
                                 f"create one with `attnbase extract --db {settings.db} ...`")
        if not is_loopback(settings.host) and not app.state.tokens.required():
            raise AuthError(f"refusing to serve {settings.db} on {settings.host} (not loopback) "
                            f"without an API token; create one with `attnbase token create --db "
                            f"{settings.db} --name NAME`, or use --host 127.0.0.1")
        _check_port(settings)
    except BaseException:
        cat.close()  # a refused start leaves no snapshot behind
        raise

    if settings.workers > 1:  # the checks above were the parent's; each worker builds its app
        from attnbase.serve.workers import supervise

        cat.close()
        sys.exit(supervise(settings, _listening_socket(settings), access_log=access_log))

    server = uvicorn_server(settings, app, access_log=access_log, on_ready=lambda: print(
        f"attnbase serve: {settings.url} (database {settings.db}; Ctrl-C stops)", flush=True))
    try:
        server.run()
    finally:
        cat.close()  # after the lifespan's close, a no-op; else (no start) the snapshots go
    if not server.started:
        sys.exit(2)
