"""The token check (401) and the ETag (304) of every request: one pure ASGI layer.

Both need the catalog's state (:meth:`Catalog.etag_state`, which may wait for a snapshot to be
opened). Where the current snapshot and the loaded tokens already are of the state on disk
(:meth:`Catalog.fresh_state`, two ``stat`` calls) both are answered on the event loop; else they
run together in one worker thread. Two ``@app.middleware("http")`` layers took two hops and two
of Starlette's ``BaseHTTPMiddleware`` (a task group and memory streams per request each).

- Open paths (:data:`attnbase.serve.auth.OPEN_PATHS`) need no token.
- Once any token exists, a missing, wrong, revoked or expired one gets 401 (JSON, with
  ``WWW-Authenticate: Bearer``) on the API and on anything but GET; a page redirects to the
  login form, saying why.
- A cacheable GET/HEAD carries ``ETag: W/"<version>-<catalog state>"``; ``If-None-Match``
  with the current tag gets 304 without running the route.
"""

from __future__ import annotations

from urllib.parse import quote

import anyio.to_thread
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from attnbase.errors import AttnbaseError
from attnbase.serve import auth
from attnbase.serve.web import error_response, status_for

#: Paths whose responses carry no ETag (files, the login form, the Prefect server's state).
UNTAGGED = ("/static/", "/reports/", "/healthz", "/login", "/flows", "/api/flows")


class Gate:
    def __init__(self, app, *, catalog, tokens, settings, version: str) -> None:
        self.app, self.cat, self.tokens = app, catalog, tokens
        self.cookie, self.version = settings.cookie_name, version

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        scope.setdefault("state", {})["authed"] = False
        open_path = path.startswith(auth.OPEN_PATHS)
        tagged = method in ("GET", "HEAD") and not path.startswith(UNTAGGED)
        if open_path and not tagged:
            return await self.app(scope, receive, send)
        request = Request(scope)
        token = None if open_path else auth.bearer(request.headers, request.cookies, self.cookie)

        def check(state=None):
            required = not open_path and self.tokens.required(state)
            problem = self.tokens.problem(token, state) if required else None
            tag = (f'W/"{self.version}-{state or self.cat.etag_state()}"'
                   if tagged and problem is None else None)
            return required, problem, tag

        # the snapshot and the tokens of the catalog's state at hand: answered here, no
        # thread; else (a commit since, or the first request) in a thread, which may wait
        state = self.cat.fresh_state()
        try:
            if state is not None and (open_path or self.tokens.loaded_at(state)):
                required, problem, tag = check(state)
            else:
                required, problem, tag = await anyio.to_thread.run_sync(check)
        except AttnbaseError as err:  # e.g. no snapshot yet and the catalog held: 503
            return await error_response(request, status_for(err), str(err))(scope, receive, send)
        if problem is not None:
            if path.startswith("/api/") or method != "GET":
                resp = JSONResponse({"detail": f"{problem}: send Authorization: Bearer <token> "
                                               "(see `attnbase token create`)"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            else:
                resp = RedirectResponse(f"/login?next={quote(path)}&why={quote(problem)}",
                                        status_code=303)
            return await resp(scope, receive, send)
        scope["state"]["authed"] = bool(required)
        if tag is None:
            return await self.app(scope, receive, send)
        if request.headers.get("if-none-match") == tag:
            return await Response(status_code=304, headers={"ETag": tag})(scope, receive, send)

        async def tagged_send(message):
            if message["type"] == "http.response.start" and message["status"] == 200:
                headers = MutableHeaders(scope=message)
                headers["ETag"] = tag
                headers["Cache-Control"] = "no-cache"
            await send(message)

        await self.app(scope, receive, tagged_send)
