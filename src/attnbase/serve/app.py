"""The ASGI app: ``create_app(settings)`` assembles the resource modules.

Layers, outermost first: the body-size limit (413), the token check (401) and the ETag (304)
in one layer (:mod:`.gate`);
then the routes of :mod:`.runs`, :mod:`.heads`, :mod:`.sql`, :mod:`.reports`, :mod:`.flows`
and the login form.
Routes are plain ``def`` functions: FastAPI runs them in its worker threads (``sql_threads`` of
them), so catalog reads, array reads and queries never block the event loop.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnbase.errors import AttnbaseError
from attnbase.serve import auth, flows, heads, metrics, reports, runs, sql, vision
from attnbase.serve.catalog import Catalog, FileCatalog
from attnbase.serve.gate import Gate
from attnbase.serve.settings import Settings
from attnbase.serve.web import error_response, page, status_for


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes (413), by Content-Length or while reading."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        too_big = JSONResponse({"detail": f"request body over {self.limit} bytes (the server's "
                                          "max_body_bytes); send a shorter query"},
                               status_code=413)
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await too_big(scope, receive, send)
        seen, refused = 0, False

        async def limited():
            # a body without Content-Length (chunked): count while the app reads it; past the
            # limit answer 413 ourselves and tell the app the client left
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refused = True
                    await too_big(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            if not refused:
                await send(message)

        try:
            await self.app(scope, limited, guarded_send)
        except Exception:
            if not refused:  # the app's own error: not ours to hide
                raise


def open_catalog(settings: Settings) -> Catalog:
    """The catalog reader of ``settings.db``: a team database's address or a directory."""
    from attnbase.warehouse.catalog.team_url import is_team_url

    if is_team_url(str(settings.db)):
        from attnbase.serve.lake_catalog import LakeCatalog

        return LakeCatalog(settings)
    return FileCatalog(settings)


def create_app(settings: Settings) -> FastAPI:
    cat = open_catalog(settings)
    tokens = auth.TokenCheck(cat)

    @asynccontextmanager
    async def lifespan(app):
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.sql_threads
        app.state.query_limiter = anyio.CapacityLimiter(settings.sql_concurrency)
        app.state.query_threads = anyio.CapacityLimiter(settings.sql_concurrency)
        # the ad-hoc query processes (sql_concurrency), started in the background and reused
        # (a query's time limit counts from a ready process)
        cat.query_pool.fill()
        yield
        cat.cancel.set()  # a running query stops now, not when it would have ended
        cat.close()

    app = FastAPI(title="attnbase", version=_version(), openapi_url="/api/openapi.json",
                  docs_url=None, redoc_url=None, lifespan=lifespan,
                  description="The HTTP API of an attnbase database (read-only).")
    app.state.catalog = cat
    app.state.settings = settings
    app.state.tokens = tokens

    @app.exception_handler(AttnbaseError)
    async def _attnbase_error(request: Request, err: AttnbaseError):
        return error_response(request, status_for(err), str(err))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        detail = err.detail if err.status_code != 404 else (
            f"no page {request.url.path!r}; start at / or see /api/openapi.json")
        return error_response(request, err.status_code, detail)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return error_response(request, 422, f"invalid {where or 'request'}: "
                                             f"{first.get('msg', 'bad input')}")

    @app.get("/healthz", tags=["service"], summary="liveness; never behind a token")
    def healthz():
        return {"status": "ok"}

    @app.get("/login", include_in_schema=False)
    def login_page(request: Request, next: str = "/", why: str = ""):
        return page(request, "login.html.j2", next=_safe_next(next), why=why)

    @app.post("/login", include_in_schema=False)
    def login(request: Request, token: str = Form(...), next: str = Form("/")):
        problem = tokens.problem(token.strip())
        if problem is not None:
            return page(request, "login.html.j2", status_code=401, next=_safe_next(next),
                        why=problem)
        resp = RedirectResponse(_safe_next(next), status_code=303)
        resp.set_cookie(settings.cookie_name, token.strip(), httponly=True, samesite="strict",
                        path="/")
        return resp

    @app.post("/logout", include_in_schema=False)
    def logout():
        resp = RedirectResponse("/login", status_code=303)
        resp.delete_cookie(settings.cookie_name, path="/")
        return resp

    for module in (runs, heads, vision, metrics, sql, reports, flows):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(packages=[("attnbase.serve", "static")]), name="static")
    app.add_middleware(Gate, catalog=cat, tokens=tokens, settings=settings, version=_version())
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)  # the outermost
    return app


def _safe_next(target: str) -> str:
    """Only a path of this site (no scheme, no ``//host``) to go back to after logging in."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


def _version() -> str:
    from attnbase._version import __version__

    return __version__
