"""``attnbase flow run --dry-run``: a pipeline's plan, offline, without loading a model.

For every model x corpus of the TOML: the run id, the extraction settings, the model's shape and
the bytes its arrays will take, estimated from the shapes (:func:`attnbase.contract.array_specs`,
the same arrays the warehouse registers). Shapes come from a model's ``config.json`` where one
is on disk (tiny aliases, MiniLM, local directories), else from the packaged shapes of the
paper's nine hub models (``attnbase/data/hub_shapes.csv``); anything else is "known at load".
Every shard also goes through the extraction preflight (corpus, seq_len against the model's
positions, device), which touches neither weights nor the network.
"""

from __future__ import annotations

from pathlib import Path

import csv
import io
import math
from dataclasses import dataclass
from importlib import resources

from attnbase.contract import ModelInfo, array_specs
from attnbase.errors import AttnbaseError

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}


@dataclass(frozen=True)
class Shape:
    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    rotary: bool
    causal: bool
    max_positions: int | None
    source: str  # where the shape came from


#: Packaged hub models that read images (non-causal; ``max_positions`` is their token count).
IMAGE_FAMILIES = ("vit", "deit", "dinov2_with_registers")


def hub_shapes() -> dict[str, Shape]:
    """The packaged shapes of the papers' hub models (lower-case hub id -> Shape): Table 1's
    nine, and the compositional paper's Qwen2.5, Llama-3.2 and ViT-B/16."""
    text = resources.files("attnbase").joinpath("data/hub_shapes.csv").read_text("utf-8")
    out = {}
    for r in csv.DictReader(io.StringIO(text)):
        out[r["hub_id"].lower()] = Shape(
            r["family"], int(r["n_layers"]), int(r["n_heads"]), int(r["n_kv_heads"]),
            int(r["d_head"]), int(r["d_model"]), r["rotary"] == "true",
            r["family"] not in IMAGE_FAMILIES,
            int(r["max_positions"]), "packaged hub shapes")
    return out


def model_shape(model: str) -> Shape | None:
    """The shape of ``model`` without its weights or the network, or None when unknown."""
    from attnbase.extract.preflight import config_shape

    shape = config_shape(model)
    if shape is not None:
        return Shape(source="config.json", **shape)
    return hub_shapes().get(model.split("@", 1)[0].lower())


def shard_bytes(shape: Shape, cfg) -> int:
    """Raw bytes of the arrays a run of ``cfg`` stores (before compression; derived logits
    store nothing)."""
    from attnbase.extract.preflight import logits_recipe_placeholder

    info = ModelInfo(model=cfg.model, model_revision="?", family=shape.family,
                     n_layers=shape.n_layers, n_heads=shape.n_heads, n_kv_heads=shape.n_kv_heads,
                     d_head=shape.d_head, d_model=shape.d_model, rotary=shape.rotary,
                     causal=shape.causal, sink_token="?",
                     logits_recipe=logits_recipe_placeholder(shape.family, shape.n_layers))
    # an image run's token count is the model's ([CLS] + extras + patches: max_positions here)
    seq_len = cfg.seq_len if cfg.seq_len is not None else shape.max_positions
    specs = array_specs(info, n_seqs=cfg.n_seqs, seq_len=seq_len, batch_size=cfg.batch_size,
                        dtype=cfg.dtype, capture=cfg.capture, store_dtype=cfg.store_dtype)
    return sum(math.prod(s.shape) * _ITEMSIZE[s.dtype] for s in specs if not s.derived)


#: How to get a corpus the plan found missing, by a word of its file name.
CORPUS_HOWTO = {
    "wikitext-103": (
        "WikiText-103 validation; with network: pip install datasets, then python -c "
        "\"from pathlib import Path; from datasets import load_dataset; ds = load_dataset("
        "'Salesforce/wikitext', 'wikitext-103-raw-v1', split='validation'); "
        "p = Path('{path}'); p.parent.mkdir(parents=True, exist_ok=True); "
        "p.write_text(''.join(ds['text']), encoding='utf-8')\" (docs/commands.md, the full "
        "reproduction)"),
}


def missing_corpus(corpus: str) -> str | None:
    """What to say of a corpus file that is not there (its path and how to get it), or None
    when the corpus is bundled (``default``, ``images:sample``, a built-in probe) or present."""
    from attnbase.extract.probes import is_probe

    if (corpus in ("default", "images:sample") or is_probe(corpus)
            or Path(corpus).expanduser().exists()):
        return None
    howto = next((h.format(path=corpus) for key, h in CORPUS_HOWTO.items()
                  if key in Path(corpus).name.lower()), None)
    return f"corpus {corpus} (not found): " + (howto or "a .txt, .jsonl or .parquet file, or a "
                                                         "directory of .txt files")


def pipeline_plan(cfg) -> list[dict]:
    """One dict per shard of the pipeline ``cfg``: run id, settings, shape, bytes, check, and
    ``missing``: the inputs a real run needs that are not here (a corpus file), which the dry
    run lists apart from the shard's problems; ``uncached``: the hub model when the local HF
    cache lacks it."""
    from attnbase.extract.preflight import missing_model, preflight

    rows = []
    for run_id, ex in cfg.shards():
        shape = model_shape(ex.model)
        problem = ""
        missing = [m for m in (missing_corpus(ex.corpus),) if m]
        uncached = missing_model(ex.model)
        try:
            if not missing_corpus(ex.corpus):  # a missing corpus is listed, not a failure
                preflight(ex)
            if (shape is not None and shape.max_positions and ex.seq_len is not None
                    and ex.seq_len > shape.max_positions):
                problem = (f"--seq-len {ex.seq_len} exceeds the {shape.max_positions} positions "
                           f"of {ex.model}")
        except AttnbaseError as err:
            problem = " ".join(str(err).split())
        rows.append({
            "run": run_id, "model": ex.model, "corpus": ex.corpus,
            "shape": "-" if shape is None else
            f"{shape.n_layers} x {shape.n_heads} ({shape.n_kv_heads} kv) x {shape.d_head}",
            "source": "known at load" if shape is None else shape.source,
            "bytes": None if shape is None else shard_bytes(shape, ex),
            "settings": f"{ex.n_seqs} x {ex.seq_len or 'image'}, {ex.dtype}, bos {ex.bos}, "
                        f"capture {','.join(ex.capture)}",
            "check": problem or "ok",
            "missing": missing,
            "uncached": uncached,
        })
    return rows
