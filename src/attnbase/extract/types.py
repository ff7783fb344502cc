"""Types of the extraction stage.

The shared vocabulary (array dims, capture choices, :class:`ModelInfo`, :class:`CapturedBatch`)
lives in :mod:`attnbase.contract`, below both extract and warehouse; it is re-exported here so
that ``from attnbase.extract.types import CapturedBatch`` keeps working. :class:`LoadedModel` is
extract's own: it holds a torch model.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbase.contract import (ARRAY_DIMS, CAPTURE_CHOICES, DEFAULT_CAPTURE, ROW_STAT_COLUMNS,
                               CapturedBatch, ModelInfo)

__all__ = ["ARRAY_DIMS", "CAPTURE_CHOICES", "DEFAULT_CAPTURE", "ROW_STAT_COLUMNS", "CapturedBatch",
           "LoadedModel", "ModelInfo"]


@dataclass
class LoadedModel:
    """A model ready for capture: HF base model (eval mode), its tokenizer, the family adapter,
    the catalog facts and the torch device string it lives on (``"cpu"``, ``"cuda"``)."""

    model: object  # transformers.PreTrainedModel (base model, no LM head)
    tokenizer: object  # transformers tokenizer
    adapter: object  # attnbase.extract.families.FamilyAdapter
    info: ModelInfo
    device: str
    #: the image processor of a vision model (extract/vision.py); None for text models
    processor: object = None
