"""Flows: ``/flows`` and ``/api/flows``, the deployments and last runs of a Prefect server.

Read-only, over Prefect's REST API (``POST {api}/deployments/filter``, ``/flows/filter``,
``/flow_runs/filter``) with httpx and the ``prefect_timeout_s`` timeout. Only when the service was
started with ``--prefect-api URL`` (or ``PREFECT_API_URL``, the setting ``attnbase schedule``
uses); otherwise both routes are 404 saying how to enable them. A server that does not answer is
a 503 in one line. Both routes call :func:`flows_data`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from attnbase.errors import AttnbaseError, NotFoundError
from attnbase.serve.web import api_json, error_response, page

router = APIRouter()

NOT_CONFIGURED = ("no Prefect server configured; start `attnbase serve` with --prefect-api URL "
                  "(or PREFECT_API_URL), e.g. --prefect-api http://127.0.0.1:4200/api")


class PrefectUnavailableError(AttnbaseError):
    """The configured Prefect server did not answer (or answered an error)."""


def _post(client, api: str, path: str, body: dict) -> list[dict]:
    import httpx

    url = f"{api.rstrip('/')}/{path}"
    try:
        r = client.post(url, json=body)
    except httpx.HTTPError as err:
        raise PrefectUnavailableError(f"the Prefect server at {api} did not answer "
                                      f"({type(err).__name__}); start it with `prefect server "
                                      "start` or fix --prefect-api") from None
    if r.status_code != 200:
        raise PrefectUnavailableError(f"the Prefect server at {api} answered HTTP "
                                      f"{r.status_code} to POST /{path}; check --prefect-api")
    return r.json()


def _schedule(s: dict) -> dict:
    """A deployment schedule as ``{"kind": cron|interval|rrule|unknown, "value", "timezone",
    "active"}``."""
    sch = s.get("schedule") or {}
    out = {"active": s.get("active"), "timezone": sch.get("timezone")}
    for kind, key in (("cron", "cron"), ("interval", "interval"), ("rrule", "rrule")):
        if key in sch:
            out.update(kind=kind, value=sch[key])
            return out
    out.update(kind="unknown", value=None)
    return out


def flows_data(settings) -> dict:
    """The server's deployments (name, flow, schedules, paused) and its last started runs."""
    import httpx

    api = settings.prefect_api
    if not api:
        raise NotFoundError(NOT_CONFIGURED)
    with httpx.Client(timeout=settings.prefect_timeout_s) as client:
        deps = _post(client, api, "deployments/filter",
                     {"sort": "NAME_ASC", "limit": settings.deployments_shown})
        runs = _post(client, api, "flow_runs/filter",
                     {"sort": "START_TIME_DESC", "limit": settings.flow_runs_shown,
                      "flow_runs": {"start_time": {"is_null_": False}}})
        flow_ids = sorted({d["flow_id"] for d in deps} | {r["flow_id"] for r in runs})
        flows = _post(client, api, "flows/filter",
                      {"flows": {"id": {"any_": flow_ids}}, "limit": len(flow_ids)}) \
            if flow_ids else []
    flow_name = {f["id"]: f["name"] for f in flows}
    dep_name = {d["id"]: d["name"] for d in deps}
    return {
        "prefect_api": api,
        "deployments": [{"name": d["name"], "flow": flow_name.get(d["flow_id"]),
                         "paused": d.get("paused"), "status": d.get("status"),
                         "schedules": [_schedule(s) for s in d.get("schedules") or []]}
                        for d in deps],
        "flow_runs": [{"name": r["name"], "flow": flow_name.get(r["flow_id"]),
                       "deployment": dep_name.get(r.get("deployment_id")),
                       "state": r.get("state_name") or r.get("state_type"),
                       "state_type": r.get("state_type"),
                       "start_time": r.get("start_time"), "end_time": r.get("end_time")}
                      for r in runs],
    }


def _answer(request: Request, render):
    try:
        data = flows_data(request.app.state.settings)
    except PrefectUnavailableError as err:
        return error_response(request, 503, str(err))
    return render(data)


@router.get("/api/flows", tags=["flows"],
            summary="the Prefect server's deployments and last flow runs (--prefect-api)")
def api_flows(request: Request):
    return _answer(request, api_json)


@router.get("/flows", include_in_schema=False)
def flows_page(request: Request):
    return _answer(request, lambda data: page(request, "flows.html.j2", data=data))
