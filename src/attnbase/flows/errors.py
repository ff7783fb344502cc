"""Errors of the orchestration layer (subclasses of :class:`attnbase.errors.AttnbaseError`)."""

from __future__ import annotations

from attnbase.errors import AttnbaseError


class PipelineConfigError(AttnbaseError):
    """A pipeline TOML file that is unreadable or has a bad key or value."""


class FlowStageError(AttnbaseError):
    """Some task of a flow failed; names the run and the batches/families."""
