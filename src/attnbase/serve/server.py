"""Running the app: uvicorn on one host/port, one line with the URL, Ctrl-C within 2 s.

On SIGINT/SIGTERM every running query is interrupted at once (the catalog's ``cancel`` event,
watched by :mod:`attnbase.warehouse.sandbox.watchdog`) and uvicorn's graceful shutdown waits at most
:data:`attnbase.serve.uvicorn_server.GRACE_S` for open requests.
"""

from __future__ import annotations

import sys

from attnbase.errors import AttnbaseError, AuthError, WarehouseError
from attnbase.serve.settings import Settings
from attnbase.serve.uvicorn_server import one_thread_per_request, uvicorn_server
from attnbase.warehouse.runs.location import is_loopback

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


def _listening_socket(settings: Settings):
    """The workers' shared socket. Made with ``IPPROTO_TCP`` named: asyncio sets TCP_NODELAY
    only on connections whose socket says so, and one made with proto 0 (uvicorn's
    ``bind_socket``) left Nagle on (benchmarks/RESULTS.md: "TCP_NODELAY on the shared socket")."""
    import socket

    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings, *, access_log: bool = False) -> None:
    one_thread_per_request()

    from attnbase.serve.app import create_app

    app = create_app(settings)
    cat = app.state.catalog
    try:
        if not cat.db.exists():
            raise cat.db.catalog.missing()
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
