"""Registry of family adapters, keyed by HF ``model_type``.

>>> get_adapter("mistral").name
'llama'
"""

from __future__ import annotations

from attnbase.errors import UnsupportedArchitectureError
from attnbase.extract.families import bert, gemma3, gpt2, gpt_neox, llama
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


def get_adapter(model_type: str) -> FamilyAdapter:
    """The adapter serving HF ``model_type``; :class:`UnsupportedArchitectureError` otherwise."""
    try:
        return _BY_MODEL_TYPE[model_type]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported; supported families (model types): "
            f"{supported()}; add one with attnbase.extract.families.register_adapter()"
        ) from None


for _mod in (gpt2, gpt_neox, llama, bert, gemma3):
    register_adapter(_mod.ADAPTER)

__all__ = ["FAMILIES", "FamilyAdapter", "get_adapter", "register_adapter", "supported"]
