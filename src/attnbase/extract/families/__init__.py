"""Registry of family adapters, keyed by HF ``model_type``; every other model type whose
attention goes through transformers' attention interface is served by the generic capture
(:mod:`attnbase.extract.families.generic`).

>>> get_adapter("mistral").name
'llama'
"""

from __future__ import annotations

from attnbase.errors import UnsupportedArchitectureError
from attnbase.extract.families import bert, bloom, falcon, gemma3, gpt2, gpt_neox, llama
from attnbase.extract.families.base import FamilyAdapter

#: family name -> adapter
FAMILIES: dict[str, FamilyAdapter] = {}
#: HF model_type -> adapter
_BY_MODEL_TYPE: dict[str, FamilyAdapter] = {}


def register_adapter(adapter: FamilyAdapter, *, replace: bool = False) -> FamilyAdapter:
    """Register ``adapter`` for each of its ``model_types``; a clash raises unless ``replace``."""
    for mt in adapter.model_types:
        other = _BY_MODEL_TYPE.get(mt)
        if other is not None and other.name != adapter.name and not replace:
            raise ValueError(f"model_type {mt!r} is already served by family {other.name!r}")
    FAMILIES[adapter.name] = adapter
    for mt in adapter.model_types:
        _BY_MODEL_TYPE[mt] = adapter
    return adapter


def supported() -> str:
    """One-line list of families and the model types each serves."""
    return "; ".join(a.describe() for a in FAMILIES.values())


def hand_written(model_type: str) -> FamilyAdapter | None:
    """The hand-written adapter reading ``model_type`` with the installed transformers, or None.

    An adapter marked ``outside_interface_only`` steps aside where the installed modeling file
    routes the attention through the attention interface: what the code does decides, not a
    version number."""
    adapter = _BY_MODEL_TYPE.get(model_type)
    if adapter is None or not adapter.outside_interface_only:
        return adapter
    from attnbase.extract.families.generic import modeling_source_facts

    try:
        through_interface = modeling_source_facts(model_type)["interface"]
    except (KeyError, ValueError, ImportError):
        through_interface = False
    return None if through_interface else adapter


def get_adapter(model_type: str) -> FamilyAdapter:
    """The adapter serving HF ``model_type``; :class:`UnsupportedArchitectureError` otherwise."""
    adapter = hand_written(model_type)
    if adapter is not None:
        return adapter
    raise UnsupportedArchitectureError(
        f"model_type {model_type!r} is not supported; supported families (model types): "
        f"{supported()}; add one with attnbase.extract.families.register_adapter()")


def served_by(model_type: str) -> FamilyAdapter | None:
    """The hand-written adapter of ``model_type``, or None where the generic capture serves it
    (its modeling file routes attention through the attention interface); one-line
    :class:`UnsupportedArchitectureError` naming why and what to do otherwise."""
    adapter = hand_written(model_type)
    if adapter is not None:
        return adapter
    from attnbase.extract.families.generic import modeling_source_facts

    try:
        facts = modeling_source_facts(model_type)
    except (KeyError, ValueError, ImportError):
        facts = {"found": False}
    if not facts["found"]:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} has no modeling file in this transformers, so it cannot "
            "be loaded; upgrade transformers or use another model (attnbase models lists "
            "what is served)")
    if not facts["interface"]:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported: its attention does not go through "
            "the attention interface (ALL_ATTENTION_FUNCTIONS), so the generic capture cannot "
            "see it; write a family adapter (attnbase.extract.families.register_adapter) or "
            "use a served model (attnbase models)")
    return None


def prepare(model_type: str, attn_implementation: str) -> None:
    """Before building a model of ``model_type`` with ``attn_implementation``: a family that
    picks its attention class by implementation name (Falcon) learns the capture's name."""
    adapter = hand_written(model_type)
    if adapter is not None and hasattr(adapter, "on_register"):
        adapter.on_register(attn_implementation)


def adapter_for_model(model) -> FamilyAdapter:
    """The adapter reading a loaded HF base model: its hand-written one, else the generic
    capture discovered from the model."""
    adapter = served_by(model.config.model_type)
    if adapter is not None:
        return adapter
    from attnbase.extract.families.generic import discover

    return discover(model)


def adapter_for_config(config) -> FamilyAdapter:
    """:func:`adapter_for_model` of a HF config, without weights: a generic model is built on
    the meta device (no memory) for its discovery."""
    adapter = served_by(config.model_type)
    if adapter is not None:
        return adapter
    import torch
    from transformers import AutoModel

    from attnbase.extract.families.generic import discover

    with torch.device("meta"):
        model = AutoModel.from_config(config)
    return discover(model)


for _mod in (gpt2, gpt_neox, llama, bert, gemma3, bloom, falcon):
    register_adapter(_mod.ADAPTER)

__all__ = ["FAMILIES", "FamilyAdapter", "adapter_for_config", "adapter_for_model", "get_adapter",
           "hand_written", "prepare", "register_adapter", "served_by", "supported"]
