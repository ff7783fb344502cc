"""Derived arrays: ``attn_logits`` formed on read from a run's stored queries and keys.

A run whose family adapter declares its logits derivable (float32 models, the default capture)
stores ``queries`` (post-RoPE) and ``keys``/``keys_rot`` and no logits: at T = 1024 a GPT-2-small
sequence's logits are 604 MB against 75 MB for its queries and keys. The run store's group
attributes hold each derived array's recipe (:class:`~attnbase.contract.LogitsRecipe`, also in
the catalog's ``arrays.derivation``), and :meth:`attnbase.warehouse.runs.store.RunStore.array`
returns a :class:`DerivedLogits` for it: an object read like a zarr array (``shape``,
``chunks``, ``dtype``, ``metadata.dimension_names``, basic indexing), so every reader
(``analyze``, the studies, ``report``, ``verify``, ``open_run``, the web face) reads stored and
derived logits alike. Values are formed layer by layer with :func:`attnbase.logits.derive_layer`,
the capture's own arithmetic on the same float32 operands: equal to the captured logits bit for
bit. A selection along ``query``/``key`` is applied after forming whole rows (a row's values
never depend on which rows were asked for).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnbase.contract import ARRAY_DIMS, LogitsRecipe
from attnbase.errors import WarehouseError
from attnbase.logits import derive_layer
from attnbase.warehouse.runs.decoded import full_index, read_many

#: Key of the run store's group attributes that lists its derived arrays.
DERIVED_ATTR = "attnbase_derived"


@dataclass(frozen=True)
class _Meta:
    dimension_names: tuple[str, ...]


def _axis_indices(index: Any, shape: tuple[int, ...]) -> list[int | np.ndarray]:
    """Basic ``index`` (ints, slices, one Ellipsis) -> per axis an int (axis dropped) or the
    array of selected positions."""
    index = full_index(index, len(shape))
    if index is None:
        raise IndexError(f"too many indices for an array of {len(shape)} dimensions")
    out: list[int | np.ndarray] = []
    for sel, n in zip(index, shape):
        if isinstance(sel, slice):
            out.append(np.arange(n)[sel])
        elif isinstance(sel, (int, np.integer)):
            i = int(sel)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for an axis of size {n}")
            out.append(i % n)
        else:
            raise IndexError(f"derived arrays take ints and slices, not {type(sel).__name__}")
    return out


class DerivedLogits:
    """``attn_logits (layer, head, seq, query, key)`` of one run, formed from its stored
    ``queries`` and the recipe's key array when indexed."""

    name = "attn_logits"

    def __init__(self, queries, keys, recipe: LogitsRecipe) -> None:
        self.queries = queries  # zarr array (layer, head, seq, pos, d_head)
        self.keys = keys  # zarr array (layer, kv_head, seq, pos, d_head)
        self.recipe = recipe
        L, H, S, T, _ = queries.shape
        self.shape = (L, H, S, T, T)
        self.chunks = (1, H, queries.chunks[2], T, T)
        self.dtype = np.dtype(np.float32)
        self.ndim = 5
        self.metadata = _Meta(ARRAY_DIMS[self.name])
        self.groups = H // keys.shape[1]

    def __repr__(self) -> str:
        return f"<DerivedLogits shape={self.shape} from {', '.join(self.recipe.inputs)}>"

    def __getitem__(self, index: Any) -> np.ndarray:
        layers, heads, seqs, qsel, ksel = _axis_indices(index, self.shape)
        lay = np.atleast_1d(layers)
        hs = np.atleast_1d(heads)
        ss = np.atleast_1d(seqs)
        T = self.shape[3]
        out = np.empty((len(lay), len(hs), len(ss), T, T), dtype=np.float32)
        s_lo, s_hi = (int(ss.min()), int(ss.max()) + 1) if len(ss) else (0, 0)
        kv = hs // self.groups  # each query head's kv head
        kv_lo, kv_hi = (int(kv.min()), int(kv.max()) + 1) if len(kv) else (0, 0)
        h_lo, h_hi = (int(hs.min()), int(hs.max()) + 1) if len(hs) else (0, 0)
        for n, l in enumerate(lay):
            if not len(hs) or not len(ss):
                break
            # one contiguous read per array (whole chunks), then the selected rows of it
            q, k = read_many([(self.queries, (int(l), slice(h_lo, h_hi), slice(s_lo, s_hi))),
                              (self.keys, (int(l), slice(kv_lo, kv_hi), slice(s_lo, s_hi)))])
            q, k = q[hs - h_lo][:, ss - s_lo], k[:, ss - s_lo]
            out[n] = derive_layer(q, k[kv - kv_lo], scale=self.recipe.scale[int(l)],
                                  causal=self.recipe.causal, window=self.recipe.window[int(l)],
                                  softcap=self.recipe.softcap_of(int(l)),
                                  alibi=None if self.recipe.alibi is None
                                  else np.asarray(self.recipe.alibi, np.float32)[hs])
        final = tuple(0 if isinstance(a, int) else slice(None) for a in (layers, heads, seqs))
        block = out[final]
        # query and key selections on whole rows (an int drops its axis, as numpy does)
        whole = np.arange(T)
        if isinstance(qsel, int) or not np.array_equal(qsel, whole):
            block = block[..., qsel, :]
        if isinstance(ksel, int) or not np.array_equal(ksel, whole):
            block = block[..., ksel]
        return block

    def __array__(self, dtype=None, copy=None):
        a = self[...]
        return a if dtype is None else a.astype(dtype)


def read_derived_attrs(attrs: dict) -> dict[str, LogitsRecipe]:
    """``{name: recipe}`` of the derived arrays a run store's group attributes list."""
    raw = attrs.get(DERIVED_ATTR) or {}
    try:
        return {name: LogitsRecipe.from_json(spec) for name, spec in raw.items()}
    except (KeyError, TypeError, ValueError) as err:
        raise WarehouseError(f"run store lists derived arrays it cannot read ({err}); "
                             "re-extract the run with --overwrite") from None


def derived_attrs(specs: dict[str, str]) -> dict:
    """Group attributes for ``{name: recipe JSON}``."""
    return {DERIVED_ATTR: {name: json.loads(text) for name, text in specs.items()}}


def open_derived(name: str, recipe: LogitsRecipe, open_array) -> DerivedLogits:
    """The derived array ``name`` over the stored arrays ``open_array(name)`` returns."""
    if name != DerivedLogits.name:
        raise WarehouseError(f"no derivation is known for array {name!r}")
    return DerivedLogits(open_array("queries"), open_array(recipe.keys), recipe)
