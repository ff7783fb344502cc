"""The extraction stage: model families, capture, corpus windows (see docs/internals.md).

``import attnbase.extract`` stays light (no torch / transformers); the functions that need them
are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbase._lazy import lazy_getattr

from attnbase.extract.config import ExtractConfig
from attnbase.contract import ARRAY_DIMS, CAPTURE_CHOICES, CapturedBatch, ModelInfo
from attnbase.extract.types import LoadedModel

if TYPE_CHECKING:
    from attnbase.extract.capture import capture_batches
    from attnbase.extract.corpus import CorpusWindows, corpus_windows
    from attnbase.extract.models import load_model, run_provenance
    from attnbase.extract.variants import load_for_config

_LAZY = {
    "load_model": "attnbase.extract.models",
    "corpus_windows": "attnbase.extract.corpus",
    "CorpusWindows": "attnbase.extract.corpus",
    "capture_batches": "attnbase.extract.capture",
    "load_for_config": "attnbase.extract.variants",
    "run_provenance": "attnbase.extract.models",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "ARRAY_DIMS",
    "CAPTURE_CHOICES",
    "CapturedBatch",
    "CorpusWindows",
    "ExtractConfig",
    "LoadedModel",
    "ModelInfo",
    "capture_batches",
    "corpus_windows",
    "load_for_config",
    "load_model",
    "run_provenance",
]
