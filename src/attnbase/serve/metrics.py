"""The metric registry as JSON: ``/api/metrics``.

The pages show a metric by its registry label, unit and digits (attnbase/metrics.py); the JSON
answers of ``/api/runs...`` key values by the metric's name. This route gives a JSON client the
same registry, so it can label those names as the pages do.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from attnbase.metrics import METRICS
from attnbase.serve.web import api_json

router = APIRouter()


def metrics_data() -> list[dict]:
    """Every registered metric: ``name, label, unit, family, levels, section, digits,
    parameter``, in the registry's order."""
    return [m.public() for m in METRICS.values()]


@router.get("/api/metrics", tags=["metrics"],
            summary="every registered metric: name, label, unit, family, levels, digits")
def api_metrics(request: Request):
    return api_json(metrics_data())
