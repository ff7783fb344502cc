"""Shared vocabulary of the extraction stage: model facts, the captured batch, array dims.

Shape vocabulary (used alike in docstrings, Zarr dimension names and catalog columns):
``layer, head, kv_head, seq, pos, query, key, d_head, d_model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Dimension names of every array a run store can hold (ARCHITECTURE.md, "Arrays of a run").
ARRAY_DIMS: dict[str, tuple[str, ...]] = {
    "tokens": ("seq", "pos"),
    "keys": ("layer", "kv_head", "seq", "pos", "d_head"),
    "keys_rot": ("layer", "kv_head", "seq", "pos", "d_head"),
    "queries": ("layer", "head", "seq", "pos", "d_head"),
    "attn_logits": ("layer", "head", "seq", "query", "key"),
    "hidden": ("layer", "seq", "pos", "d_model"),
}

#: Names accepted by ``--capture`` and the arrays each one selects. ``tokens`` is always stored;
#: ``keys`` brings ``keys_rot`` along on rotary families.
CAPTURE_CHOICES: dict[str, tuple[str, ...]] = {
    "keys": ("keys", "keys_rot"),
    "queries": ("queries",),
    "logits": ("attn_logits",),
    "hidden": ("hidden",),
}
DEFAULT_CAPTURE: tuple[str, ...] = ("keys", "queries", "logits", "hidden")

#: Columns of ``row_stats`` computed at capture time (METRICS.md §3-4), besides the key columns
#: ``layer, head, seq, query``.
ROW_STAT_COLUMNS: tuple[str, ...] = (
    "n_keys",
    "sink_mass",
    "max_prob",
    "argmax",
    "entropy",
    "sink_balance",
    "content_entropy",
    "content_dispersion",
)


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a loaded model that the catalog's ``runs`` table records."""

    model: str  # what the user asked for (alias, path or hub id)
    model_revision: str  # hub commit / "local:<sha256-of-config+weights-prefix>" / "seed:<n>"
    family: str  # registered adapter name: gpt2 | gpt_neox | llama | bert
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    rotary: bool
    causal: bool
    sink_token: str  # the token string at position 0 of every window ("[CLS]", "<|bos|>", ...)


@dataclass
class CapturedBatch:
    """Everything one forward pass over ``n_seqs`` windows produced, as numpy arrays.

    ``arrays`` maps array names (keys of :data:`ARRAY_DIMS`) to arrays whose ``seq`` axis has
    length ``n_seqs`` and otherwise the full run shape, e.g. ``attn_logits`` is
    ``(layer, head, n_seqs, query, key)`` with masked entries ``-inf``.
    ``row_stats`` maps ``layer, head, seq, query`` and :data:`ROW_STAT_COLUMNS` to 1-D arrays of
    equal length (one entry per attention row; ``seq`` is the global sequence index).
    """

    batch: int
    first_seq: int
    n_seqs: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    row_stats: dict[str, np.ndarray] = field(default_factory=dict)
    col_stats: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class LoadedModel:
    """A model ready for capture: HF base model (eval mode), its tokenizer, the family adapter,
    the catalog facts and the torch device string it lives on (``"cpu"``, ``"cuda"``)."""

    model: object  # transformers.PreTrainedModel (base model, no LM head)
    tokenizer: object  # transformers tokenizer
    adapter: object  # attnbase.extract.families.FamilyAdapter
    info: ModelInfo
    device: str
