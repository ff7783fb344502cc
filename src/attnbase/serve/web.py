"""What every resource module shares: the catalog of a request, JSON and HTML responses, the
404/400/403 errors of bad input (the grids' colour scale is :mod:`.colours`).

HTML comes from Jinja2 templates in package data with autoescaping on: every value is text, never
markup (run names, token strings, SQL results alike).
"""

from __future__ import annotations

import functools

import numpy as np
from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from attnbase.errors import NotFoundError
from attnbase.formatting import DEFAULT_DIGITS, fmt, fmt_cell, fmt_p
from attnbase.metrics import HEAD_TYPES, METRICS
from attnbase.serve.catalog import Catalog, clean


def catalog(request: Request) -> Catalog:
    return request.app.state.catalog


def api_json(data, status_code: int = 200) -> Response:
    """``data`` as JSON with :func:`clean`'s rules (NaN/inf -> null, dates -> ISO text), by
    orjson: it writes numpy arrays itself, without a walk of Python floats
    (benchmarks/RESULTS.md: "orjson for a 128 x 128 pattern")."""
    import orjson

    body = orjson.dumps(data, default=_json_default,
                        option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    return Response(body, status_code=status_code, media_type="application/json")


def _json_default(value):
    """What orjson does not write itself (Decimal, numpy scalars of other kinds): as clean()
    would."""
    out = clean(value)
    if out is value:
        raise TypeError(f"{type(value).__name__} is not JSON serialisable")
    return out


@functools.lru_cache(maxsize=1)
def templates():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("attnbase.serve", "templates"),
                             autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    # metric names are shown by the registry's label, unit and digits (attnbase/metrics.py)
    env.filters["num"] = fmt_num
    env.filters["pval"] = p_value_text  # p- and q-values: never "0" (formatting.fmt_p)
    env.filters["cell"] = result_cell
    env.filters["label"] = metric_label
    env.filters["unit"] = metric_unit
    env.globals["head_types"] = HEAD_TYPES  # the head page's "types at a glance"
    return env


def page(request: Request, template: str, status_code: int = 200, **context) -> HTMLResponse:
    html = templates().get_template(template).render(
        request=request, authed=getattr(request.state, "authed", False), **context)
    return HTMLResponse(html, status_code=status_code)


def fmt_num(v, name: str | None = None) -> str:
    """A value as a page shows it (:func:`attnbase.formatting.fmt`, plain style: NULL for
    missing), with the registry's digits of metric ``name``."""
    import jinja2

    if isinstance(v, jinja2.Undefined):
        v = None
    return fmt(v, METRICS.get(name, DEFAULT_DIGITS) if name else DEFAULT_DIGITS, style="plain")


def p_value_text(p, draws=None, at_floor=False) -> str:
    """A p- or q-value as a page shows it (:func:`attnbase.formatting.fmt_p`, plain style): a
    stored 0 as a bound, an empirical p-value at its floor as ``"< 0.005, 200 draws"``."""
    import jinja2

    if isinstance(p, jinja2.Undefined):
        p = None
    return fmt_p(p, draws=draws, at_floor=bool(at_floor), style="plain")


def result_cell(v, name: str) -> str:
    """A cell of the /sql page's result in column ``name``: p-value columns by
    :func:`attnbase.formatting.fmt_cell`, the rest as :func:`fmt_num`."""
    return fmt_cell(name, v, style="plain")


def metric_label(name) -> str:
    """The registry's label of metric ``name``; a head finder's ``z:<metric>/<null model>`` as
    the z of that null test; any other column's name as it is."""
    if isinstance(name, str) and name.startswith("z:"):
        base, _, null_model = name[2:].partition("/")
        return f"z of {metric_label(base)} against the {null_model} null"
    m = METRICS.get(name)
    return m.label if m is not None else str(name)


def metric_unit(name) -> str:
    """The registry's unit of metric ``name`` ("" for a column that is no metric)."""
    if isinstance(name, str) and name.startswith("z:"):
        return "null sd"
    m = METRICS.get(name)
    return m.unit if m is not None else ""


def check_index(what: str, value: int, n: int, run_id: str) -> None:
    """404 naming the valid range unless ``0 <= value < n``."""
    if not 0 <= value < n:
        raise NotFoundError(f"run {run_id!r} has no {what} {value} (valid: 0..{n - 1})")


def check_choice(what: str, value: str, valid) -> None:
    if value not in valid:
        raise NotFoundError(f"unknown {what} {value!r} (valid: {', '.join(valid)})")


def status_for(err: Exception) -> int:
    """The HTTP status of one of attnbase's errors."""
    from attnbase import errors as e

    for kind, code in ((e.NotFoundError, 404), (e.RunNotFoundError, 404),
                       (e.ReadOnlyViolationError, 403), (e.AuthError, 401),
                       (e.CatalogLockedError, 503), (e.ArrayCorruptError, 500),
                       (e.StatsFileCorruptError, 500)):
        if isinstance(err, kind):
            return code
    return 400


def wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/") or request.url.path == "/healthz"


@functools.lru_cache(maxsize=4)
def _server_paths(db: str) -> tuple[tuple[str, str], ...]:
    """``(prefix, replacement)`` of :func:`without_server_paths`, longest prefix first."""
    import os
    from pathlib import Path

    from attnbase.serve.catalog import snapshot_root

    out = {}
    for d in {db, os.path.abspath(db), str(Path(db).resolve())}:
        out[d.rstrip("/") + "/"] = ""  # a file of the database: relative to it, as the catalog
        out[d.rstrip("/")] = "the database directory"
    out[str(snapshot_root())] = "<snapshot>"
    home = os.path.expanduser("~")
    if home not in ("", "/"):
        out[home] = "~"
    return tuple(sorted(out.items(), key=lambda kv: -len(kv[0])))


def without_server_paths(request: Request, message: str) -> str:
    """``message`` as a client may read it: the server's absolute paths taken out (a file of
    the database named relative to its directory, as the catalog names it; the snapshot and
    home directories by name)."""
    settings = getattr(request.app.state, "settings", None)
    if settings is None:
        return message
    for prefix, by in _server_paths(str(settings.db)):
        message = message.replace(prefix, by)
    return message


def error_response(request: Request, status_code: int, message: str):
    """One line of error: ``{"detail": message}`` for the API, an HTML page otherwise (the
    server's paths taken out, :func:`without_server_paths`)."""
    message = without_server_paths(request, " ".join(str(message).split("\n")))
    headers = {"Retry-After": "1"} if status_code == 503 else None
    if wants_json(request):
        return JSONResponse({"detail": message}, status_code=status_code, headers=headers)
    resp = page(request, "error.html.j2", status_code=status_code, code=status_code,
                message=message)
    if headers:
        resp.headers.update(headers)
    return resp


def in_session(route):
    """Run a route's catalog queries on one connection (:meth:`Catalog.session`); the route
    stays a plain ``def`` (a worker thread) with its own signature for FastAPI."""

    @functools.wraps(route)
    def wrapper(request: Request, *args, **kwargs):
        with catalog(request).session():
            return route(request, *args, **kwargs)

    return wrapper
