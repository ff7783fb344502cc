"""The shared vocabulary of the write path: the one bottom module extract and warehouse both import.

It holds what a captured batch *is* and what a run *is*, with no behaviour that needs a model or
a database: array names and their named dimensions, the capture choices, the row/col statistics
columns, the model facts (:class:`ModelInfo`), one forward pass's output (:class:`CapturedBatch`),
the description of a run to register (:class:`RunSpec`) and the arrays it stores
(:class:`ArraySpec`, :func:`array_specs`). It imports numpy and :mod:`attnbase.errors` only.

Shape vocabulary (used alike in docstrings, Zarr dimension names and catalog columns):
``layer, head, kv_head, seq, pos, query, key, d_head, d_model``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Dimension names of every array a run store can hold (docs/architecture.md, "Arrays of a run").
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
#: The default capture: ``attn_logits`` are derived from queries and keys where the family
#: allows (:func:`logits_mode`) and stored otherwise; ``--capture ...,logits`` stores them always.
DEFAULT_CAPTURE: tuple[str, ...] = ("keys", "queries", "hidden")

#: Columns of ``row_stats`` computed at capture time (docs/metrics.md §3-4), besides the key columns
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
ROW_KEY_COLUMNS: tuple[str, ...] = ("layer", "head", "seq", "query")
COL_KEY_COLUMNS: tuple[str, ...] = ("layer", "head", "seq", "key")
COL_STAT_COLUMNS: tuple[str, ...] = ("received",)


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
    #: how ``attn_logits`` follow from the captured queries and keys, where the family adapter
    #: declares them derivable (None: they can only be stored)
    logits_recipe: "LogitsRecipe | None" = None
    #: the key positions every sink statistic reads as the sink (:data:`DEFAULT_SINK`: key 0;
    #: vision families declare a set, e.g. [CLS] + registers; docs/metrics.md "Sink sets")
    sink_positions: tuple[int, ...] = (0,)
    #: ``sum(p.numel() for p in model.parameters())`` of the loaded model (None: not counted)
    n_params: int | None = None


#: The sink of every text family: key 0 (BOS, [CLS] or the first text token).
DEFAULT_SINK: tuple[int, ...] = (0,)


def sink_set(positions) -> tuple[int, ...]:
    """A sink set as sorted distinct non-negative key positions; None or empty means
    :data:`DEFAULT_SINK` (a run registered before sink sets were recorded).

    >>> sink_set([4, 0, 1]), sink_set(None)
    ((0, 1, 4), (0,))
    """
    if positions is None:
        return DEFAULT_SINK
    out = tuple(sorted({int(p) for p in positions}))
    if not out:
        return DEFAULT_SINK
    if out[0] < 0:
        raise ValueError(f"sink positions must be >= 0, got {list(positions)}")
    return out


def content_keys(sink, n_keys: int) -> "slice | np.ndarray":
    """The index of the content keys (every key not in ``sink``) along a key axis of
    ``n_keys``: a slice ``m:`` where the sink set is the prefix ``0..m-1`` (a view, and for
    the default sink exactly ``z[..., 1:]``), else an ascending index array.

    >>> content_keys((0,), 5), content_keys((0, 1, 2), 5), content_keys((0, 3), 5).tolist()
    (slice(1, None, None), slice(3, None, None), [1, 2, 4])
    """
    sink = sink_set(sink)
    if sink == tuple(range(len(sink))):
        return slice(len(sink), None)
    return np.setdiff1d(np.arange(n_keys), np.asarray(sink))


def sink_keys(sink, n_keys: int) -> "slice | np.ndarray":
    """The index of the sink keys inside ``0..n_keys-1`` (a slice for a prefix set)."""
    sink = sink_set(sink)
    if sink == tuple(range(len(sink))):
        return slice(0, min(len(sink), n_keys))
    return np.asarray([p for p in sink if p < n_keys], dtype=np.int64)


#: Families whose windows are images: the tokens before the patches (after ``[CLS]``) per family.
IMAGE_EXTRA_TOKENS = {"vit": "", "deit": "[DIST]", "dinov2_with_registers": "reg"}


def image_token_names(family: str, n_sink: int, n_tokens: int) -> list[str] | None:
    """The token names of an image run (None for a text family): ``[CLS]``, then DeiT's
    ``[DIST]`` or DINOv2's registers ``reg0 ..`` (the sink set holds them all), then the
    patches ``p(row,col)`` of the square grid in raster order.

    >>> image_token_names("dinov2_with_registers", 3, 7)
    ['[CLS]', 'reg0', 'reg1', 'p(0,0)', 'p(0,1)', 'p(1,0)', 'p(1,1)']
    >>> image_token_names("llama", 1, 7) is None
    True
    """
    if family not in IMAGE_EXTRA_TOKENS:
        return None
    extra = IMAGE_EXTRA_TOKENS[family]
    names = ["[CLS]"] + ([extra] if extra == "[DIST]" else
                         [f"{extra}{i}" for i in range(n_sink - 1)] if extra else [])
    n_patch = n_tokens - len(names)
    g = math.isqrt(max(n_patch, 0))
    if g * g != n_patch:  # not a square grid: number the patches
        return names + [f"p{i}" for i in range(n_patch)]
    return names + [f"p({r},{c})" for r in range(g) for c in range(g)]


def image_extra_tokens(family: str, n_sink: int) -> str | None:
    """What an image run has before its patches besides ``[CLS]``, in words ("4 registers",
    "[DIST]", "none"); None for a text family (the runs compared for registers' effect).

    >>> image_extra_tokens("dinov2_with_registers", 5), image_extra_tokens("vit", 1)
    ('4 registers', 'none')
    """
    names = image_token_names(family, n_sink, n_sink)
    if names is None:
        return None
    extra = names[1:n_sink]
    regs = [t for t in extra if t.startswith(IMAGE_EXTRA_TOKENS["dinov2_with_registers"])]
    if regs:
        return f"{len(regs)} register{'s' if len(regs) > 1 else ''}"
    return ", ".join(extra) or "none"


@dataclass(frozen=True)
class LogitsRecipe:
    """How a run's ``attn_logits`` are formed from its stored queries and keys (derived arrays).

    ``z[l, h, s, i, j] = (q[l, h, s, i] . k[l, h // (H / H_kv), s, j]) * scale[l]`` computed by
    :func:`attnbase.logits.scaled_scores` (the capture's own arithmetic, so the derived values are
    the captured ones bit for bit); on a soft-capped layer (``softcap[l]`` = c, Gemma-2)
    ``tanh(z / c) * c``; then ``-inf`` where the mask rule blocks ``(i, j)``: ``j > i`` when
    ``causal``; with ``alibi`` slopes, ``+ alibi[h] * j`` before the mask; ``i - j >= window[l]`` on a sliding-window layer (and ``j - i >= window[l]``
    on a bidirectional one). ``keys`` names the key array the attention saw: ``keys_rot``
    (post-RoPE) on rotary families, else ``keys``.
    """

    keys: str
    scale: tuple[float, ...]
    causal: bool
    window: tuple[int | None, ...]
    #: per layer: the tanh soft-cap of the logits (None: none on any layer)
    softcap: tuple[float | None, ...] | None = None
    #: per query head: the ALiBi slope, ``+ slope[h] * key_position`` (BLOOM; None: no bias)
    alibi: tuple[float, ...] | None = None

    FORMULA = ("matmul(queries, {keys}^T) * scale[layer] (float32; query head h reads kv head "
               "h // (H / H_kv)), then -inf where the mask rule blocks (causal: key > query; "
               "sliding window W: key <= query - W)")
    FORMULA_CAP = ("matmul(queries, {keys}^T) * scale[layer] (float32; query head h reads kv "
                   "head h // (H / H_kv)), then tanh(z / softcap[layer]) * softcap[layer], then "
                   "-inf where the mask rule blocks (causal: key > query; sliding window W: "
                   "|key - query| >= W on the side the rule looks)")

    FORMULA_ALIBI = ("matmul(queries, {keys}^T) * scale[layer] (float32), then + alibi[head] * "
                     "key position (ALiBi), then -inf where the mask rule blocks (causal: key > "
                     "query)")

    @property
    def inputs(self) -> tuple[str, str]:
        return ("queries", self.keys)

    def to_json(self) -> str:
        d = {"inputs": list(self.inputs), "scale": list(self.scale),
             "mask": "causal" if self.causal else "none", "window": list(self.window),
             "dtype": "float32", "formula": self.FORMULA.format(keys=self.keys)}
        if self.softcap is not None:
            d["softcap"] = list(self.softcap)
            d["formula"] = self.FORMULA_CAP.format(keys=self.keys)
        if self.alibi is not None:
            d["alibi"] = list(self.alibi)
            d["formula"] = self.FORMULA_ALIBI.format(keys=self.keys)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | dict) -> "LogitsRecipe":
        d = json.loads(text) if isinstance(text, str) else text
        cap = d.get("softcap")
        return cls(keys=d["inputs"][1], scale=tuple(float(x) for x in d["scale"]),
                   causal=d["mask"] == "causal",
                   window=tuple(None if w is None else int(w) for w in d["window"]),
                   softcap=None if cap is None else tuple(None if c is None else float(c)
                                                          for c in cap),
                   alibi=None if d.get("alibi") is None else tuple(float(a) for a in d["alibi"]))

    def softcap_of(self, layer: int) -> float | None:
        return None if self.softcap is None else self.softcap[layer]


@dataclass
class CapturedBatch:
    """Everything one forward pass over ``n_seqs`` windows produced, as numpy arrays.

    ``arrays`` maps array names (keys of :data:`ARRAY_DIMS`) to arrays whose ``seq`` axis has
    length ``n_seqs`` and otherwise the full run shape, e.g. ``attn_logits`` is
    ``(layer, head, n_seqs, query, key)`` with masked entries ``-inf``.
    ``row_stats`` maps ``layer, head, seq, query`` and :data:`ROW_STAT_COLUMNS` to 1-D arrays of
    equal length (one entry per attention row; ``seq`` is the global sequence index);
    ``col_stats`` maps ``layer, head, seq, key, received`` likewise.
    """

    batch: int
    first_seq: int
    n_seqs: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    row_stats: dict[str, np.ndarray] = field(default_factory=dict)
    col_stats: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSpec:
    """Everything the warehouse needs to register a run and check a resume against it.

    Built above the warehouse (the runner) from the extraction config, the loaded model's
    :class:`ModelInfo` and the corpus windows. ``config`` is the JSON of the fields that define
    the run (``config_hash`` is the hash of it, minus the device); ``dtype`` is the model dtype
    (``float32 | float16 | bfloat16``); the stored float dtype is ``store_dtype``, by default
    :func:`stored_float_dtype` of it.
    """

    info: ModelInfo
    n_seqs: int
    seq_len: int
    batch_size: int
    dtype: str
    capture: tuple[str, ...]
    corpus: str
    corpus_hash: str
    config_hash: str
    config: str  # JSON object, sorted keys
    #: ``--store-dtype`` (None: :func:`stored_float_dtype`'s default for ``dtype``)
    store_dtype: str | None = None
    #: each window's source where the corpus is images: objects with ``file`` and ``box``
    #: ``(x0, y0, x1, y1)`` (extract/vision.py), registered in ``seq_sources``
    sources: tuple = ()

    @property
    def n_batches(self) -> int:
        return math.ceil(self.n_seqs / self.batch_size)

    def batch_range(self, batch: int) -> tuple[int, int]:
        """``(first_seq, n_seqs)`` of batch ``batch``."""
        first = batch * self.batch_size
        return first, min(self.batch_size, self.n_seqs - first)

    def config_dict(self) -> dict[str, Any]:
        return json.loads(self.config)


@dataclass(frozen=True)
class ArraySpec:
    """Name, named dims, full shape, chunk shape and stored dtype of one run array."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str
    #: zstd before the crc32c checksum. Only where it pays: causal ``attn_logits`` (half the
    #: entries are -inf) and ``tokens``; keys, queries, hidden and non-causal logits barely
    #: compress and write slower, so they are stored raw, still checksummed
    #: (benchmarks/RESULTS.md: "zstd level 1 on keys, queries, hidden").
    compressed: bool = True
    #: formed on read from other arrays (:class:`LogitsRecipe` JSON); nothing of it is stored
    derivation: str | None = None

    @property
    def derived(self) -> bool:
        return self.derivation is not None

    @property
    def seq_axis(self) -> int:
        return self.dims.index("seq")


#: What ``--store-dtype`` may choose for the float arrays of a run.
#: ``runs.corpus`` of a weights-only run (``attnbase weights``): no corpus, no arrays, no patterns.
WEIGHTS_CORPUS = "(weights)"

STORE_DTYPES = ("float32", "float16", "bfloat16")
#: numpy has no bfloat16: such arrays are stored as their raw 16 bits (``uint16``) with the
#: dtype recorded (``arrays.dtype`` and the array's attributes), and read back as float32.
STORAGE_DTYPES = {"bfloat16": "uint16"}


def stored_float_dtype(model_dtype: str, store_dtype: str | None = None) -> str:
    """The dtype a run's float arrays are written in: ``store_dtype`` when set, else float16
    for float16 models and float32 for float32 and bfloat16 ones (internals.md)."""
    if store_dtype is not None:
        return store_dtype
    return "float16" if model_dtype == "float16" else "float32"


def storage_dtype(dtype: str) -> str:
    """The numpy/zarr dtype that holds ``dtype``'s values on disk."""
    return STORAGE_DTYPES.get(dtype, dtype)


def logits_mode(info: ModelInfo, capture, dtype: str, store_dtype: str | None = None) -> str:
    """How a run of ``info`` with ``capture`` at model ``dtype`` holds ``attn_logits``:

    - ``"stored"``: ``logits`` is in ``capture``, or queries and keys are captured but the
      logits cannot be derived from them (no recipe for the family, or queries and keys stored
      in a dtype that rounds the model's: a float32 model stored as float16);
    - ``"derived"``: queries and keys are captured, stored exactly (``store_dtype`` float32, or
      the model's own dtype), and ``info.logits_recipe`` forms the logits from them on read,
      equal to what the capture saw (the capture forms logits in float32 from q and k, half
      models included);
    - ``"none"``: neither asked for nor derivable (queries or keys not captured).
    """
    capture = set(capture)
    if "logits" in capture:
        return "stored"
    if not {"queries", "keys"} <= capture:
        return "none"
    store = stored_float_dtype(dtype, store_dtype)
    exact = store == "float32" or store == dtype
    return "derived" if info.logits_recipe is not None and exact else "stored"


def stored_capture(info: ModelInfo, capture, dtype: str,
                   store_dtype: str | None = None) -> tuple[str, ...]:
    """``capture`` with ``logits`` added where :func:`logits_mode` stores them: the arrays a
    batch of this run carries (what :func:`attnbase.extract.capture_batches` is asked for)."""
    if logits_mode(info, capture, dtype, store_dtype) == "stored" and "logits" not in capture:
        capture = (*capture, "logits")
    return tuple(c for c in CAPTURE_CHOICES if c in capture)


def array_specs(info: ModelInfo, *, n_seqs: int, seq_len: int, batch_size: int, dtype: str,
                capture: tuple[str, ...], store_dtype: str | None = None) -> list[ArraySpec]:
    """The arrays of a run with this model ``info`` and capture set.

    ``tokens`` is always stored; ``keys`` brings ``keys_rot`` on rotary families; ``attn_logits``
    is stored or derived (``ArraySpec.derivation``) as :func:`logits_mode` says. Chunks are one
    layer x one extraction batch (docs/architecture.md: a batch writes whole chunks only); a derived
    array has the chunks of its queries.
    """
    mode = logits_mode(info, capture, dtype, store_dtype)
    capture = stored_capture(info, capture, dtype, store_dtype)
    if mode == "derived":
        capture = (*capture, "logits")
    sizes = {
        "layer": info.n_layers, "head": info.n_heads, "kv_head": info.n_kv_heads,
        "seq": n_seqs, "pos": seq_len, "query": seq_len, "key": seq_len,
        "d_head": info.d_head, "d_model": info.d_model,
    }
    names = ["tokens"]
    for choice in (c for c in CAPTURE_CHOICES if c in capture):
        for name in CAPTURE_CHOICES[choice]:
            if name == "keys_rot" and not info.rotary:
                continue
            names.append(name)
    fdtype = stored_float_dtype(dtype, store_dtype)
    b = min(batch_size, n_seqs)
    specs = []
    for name in names:
        dims = ARRAY_DIMS[name]
        shape = [sizes[d] for d in dims]
        if name == "hidden":  # layer 0 is the embedding output
            shape[0] = info.n_layers + 1
        chunks = [1 if d == "layer" else b if d == "seq" else n for d, n in zip(dims, shape)]
        compressed = name == "tokens" or (name == "attn_logits" and bool(info.causal))
        derivation = (info.logits_recipe.to_json()
                      if name == "attn_logits" and mode == "derived" else None)
        specs.append(ArraySpec(name, dims, tuple(shape), tuple(chunks),
                               "int32" if name == "tokens" else fdtype, compressed, derivation))
    return specs


def spec_arrays(spec: RunSpec) -> list[ArraySpec]:
    """:func:`array_specs` of a :class:`RunSpec`."""
    return array_specs(spec.info, n_seqs=spec.n_seqs, seq_len=spec.seq_len,
                       batch_size=spec.batch_size, dtype=spec.dtype, capture=spec.capture,
                       store_dtype=spec.store_dtype)


#: What computed a run, as ``attnbase runs`` and the report's methods show it: (field, label)
COMPUTED_ON = (("device", "device"), ("device_name", "device name"), ("dtype", "compute dtype"),
               ("store_dtype", "store dtype"), ("torch", "torch"), ("cuda", "CUDA"),
               ("stats_backend", "statistics backend"))


def computed_on(run: dict) -> dict[str, str]:
    """:data:`COMPUTED_ON` of a ``runs`` row (its ``config`` JSON and ``dtype``): the stored
    float dtype is the default one where ``--store-dtype`` was not given; ``CUDA`` is ``none``
    for a CPU-only torch; a run registered before these were recorded shows ``?``."""
    import json

    cfg = run.get("config")
    cfg = json.loads(cfg) if isinstance(cfg, str) else (cfg or {})
    dtype = run.get("dtype") or cfg.get("dtype")
    out = {k: cfg.get(k) for k, _ in COMPUTED_ON}
    out["dtype"] = dtype
    out["store_dtype"] = stored_float_dtype(dtype, cfg.get("store_dtype")) if dtype else None
    if "torch" in cfg and cfg.get("cuda") is None:
        out["cuda"] = "none"
    return {k: "?" if v in (None, "") else str(v) for k, v in out.items()}
