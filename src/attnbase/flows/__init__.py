"""Prefect flows that orchestrate the stages (extract -> warehouse -> stats -> reports).

Nothing here computes a statistic or touches an array: every task is one call into a stage
(see :mod:`attnbase.flows._stages`). Flows: :func:`extract_flow`, :func:`analyze_flow`,
:func:`report_flow`, :func:`pipeline_flow` (TOML-driven, see :mod:`attnbase.flows.config`).
Attributes are imported lazily, so that ``attnbase.flows.config`` / ``.serving`` can set
Prefect's environment before Prefect is first imported (it reads its settings at import).
"""

from __future__ import annotations

from attnbase._lazy import lazy_getattr

_EXPORTS = {
    "analyze_flow": "attnbase.flows.analyze",
    "extract_flow": "attnbase.flows.extract",
    "pipeline_flow": "attnbase.flows.pipeline",
    "run_pipeline": "attnbase.flows.pipeline",
    "report_flow": "attnbase.flows.report",
    "PipelineConfig": "attnbase.flows.config",
    "load_pipeline_config": "attnbase.flows.config",
    "parse_pipeline_config": "attnbase.flows.config",
    "FlowStageError": "attnbase.flows.errors",
    "PipelineConfigError": "attnbase.flows.errors",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__():
    return __all__
