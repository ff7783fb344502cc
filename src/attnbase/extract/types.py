"""The extraction stage's own type: :class:`LoadedModel` (it holds a torch model).

The vocabulary extract shares with the warehouse (array dims, capture choices,
:class:`~attnbase.contract.ModelInfo`, :class:`~attnbase.contract.CapturedBatch`) lives in
:mod:`attnbase.contract`.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbase.contract import ModelInfo


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
