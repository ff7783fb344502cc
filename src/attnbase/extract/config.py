"""The frozen configuration of one extraction run; its hash goes into the catalog."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from attnbase.errors import ExtractError
from attnbase.contract import (CAPTURE_CHOICES, DEFAULT_CAPTURE, STORE_DTYPES, ModelInfo, RunSpec,
                               stored_float_dtype)

DTYPES = ("float32", "float16", "bfloat16")
#: How far a half-precision run's row statistics may be from the float32 run's on the same
#: windows (max |diff| of sink_mass and max_prob, probabilities, and entropy, nats): the
#: tolerance tests/extract/test_device_path.py and benchmarks/gpu.py hold runs to, above what
#: was measured (benchmarks/RESULTS.md: "half-precision row statistics" and "half precision,
#: tiny decoders").
#: ``--seq-len`` of a text corpus when none is given.
DEFAULT_SEQ_LEN = 64
HALF_TOLERANCE = {"float16": 1e-2, "bfloat16": 6e-2}
#: Config field -> the command-line flag a user types for it (errors name the flag).
FLAGS = {"n_seqs": "--seqs", "seq_len": "--seq-len", "batch_size": "--batch-size"}
#: Ablation variants and initialisations (model surgery in :mod:`attnbase.extract.variants`).
VARIANTS = ("full", "no-mlp", "no-skip", "attention-only")
INITS = ("pretrained", "random")
#: Position-0 conventions of causal LMs (``--bos``): ``auto`` prepends the tokenizer's BOS where it
#: declares one (extract/corpus.py); ``none`` adds nothing, so position 0 is a text token (the
#: convention of GPT-2, whose tokenizer has no BOS, in "All Routes Lead to Collapse").
BOS_CHOICES = ("auto", "none")


def fields_hash(fields: dict) -> str:
    """``runs.config_hash``: the first 16 hex digits of the sha256 of the sorted-key JSON."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ExtractConfig:
    """What to extract. ``device`` is where it runs and does not enter the hash."""

    model: str
    corpus: str = "default"
    n_seqs: int = 8
    #: tokens per window (None: 64 for text; an image corpus leaves it None, the model fixes it)
    seq_len: int | None = None
    batch_size: int = 4
    dtype: str = "float32"
    capture: tuple[str, ...] = DEFAULT_CAPTURE
    seed: int = 0
    device: str = "auto"
    variant: str = "full"
    init: str = "pretrained"
    init_seed: int = 0
    #: what the float arrays are written in (None: float32, float16 for float16 models)
    store_dtype: str | None = None
    bos: str = "auto"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ExtractError(f"unknown --dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.store_dtype is not None and self.store_dtype not in STORE_DTYPES:
            raise ExtractError(f"unknown --store-dtype {self.store_dtype!r}; use one of "
                               f"{', '.join(STORE_DTYPES)}")
        if self.store_dtype == stored_float_dtype(self.dtype):
            object.__setattr__(self, "store_dtype", None)  # the default, named: one hash
        bad = [c for c in self.capture if c not in CAPTURE_CHOICES]
        if bad:
            raise ExtractError(
                f"unknown --capture name(s) {', '.join(bad)}; choose from {', '.join(CAPTURE_CHOICES)}"
            )
        if self.variant not in VARIANTS:
            raise ExtractError(f"unknown variant {self.variant!r}; use one of {', '.join(VARIANTS)}")
        if self.init not in INITS:
            raise ExtractError(f"unknown init {self.init!r}; use one of {', '.join(INITS)}")
        if self.bos not in BOS_CHOICES:
            raise ExtractError(f"unknown --bos {self.bos!r}; use one of {', '.join(BOS_CHOICES)}")
        from attnbase.extract.vision import is_image_corpus

        if is_image_corpus(self.corpus):
            if self.seq_len is not None:
                raise ExtractError(f"--seq-len does not apply to image corpus {self.corpus!r}: "
                                   "the model fixes the token count ([CLS], its extra tokens "
                                   "and one per patch); leave --seq-len out")
        elif self.seq_len is None:
            object.__setattr__(self, "seq_len", DEFAULT_SEQ_LEN)
        for name in ("n_seqs", "seq_len", "batch_size"):
            if getattr(self, name) is None:
                continue
            if getattr(self, name) < 1:
                raise ExtractError(f"{FLAGS[name]} must be >= 1, got {getattr(self, name)}")
        for name, flag in (("seed", "--seed"), ("init_seed", "--init-seed")):
            if getattr(self, name) < 0:  # numpy's generators take non-negative seeds only
                raise ExtractError(f"{flag} must be >= 0, got {getattr(self, name)}")
        if self.seq_len is not None and self.seq_len < 4:
            raise ExtractError(f"--seq-len must be >= 4 (sink + content rows), got {self.seq_len}")
        # canonical order so that "--capture logits,keys" and "keys,logits" hash alike
        object.__setattr__(self, "capture", tuple(c for c in CAPTURE_CHOICES if c in self.capture))

    def hash_fields(self, *, model_revision: str, corpus_hash: str) -> dict:
        d = asdict(self)
        d.pop("device")
        # the ablation fields enter the hash only when set, so runs made before they existed
        # keep their config_hash (and stay resumable)
        if self.variant == "full":
            d.pop("variant")
        if self.init == "pretrained":
            d.pop("init")
            d.pop("init_seed")
        if self.store_dtype is None:  # enters the hash only when set (older runs keep theirs)
            d.pop("store_dtype")
        if self.bos == "auto":  # likewise: runs made before --bos existed keep their hash
            d.pop("bos")
        d["capture"] = list(self.capture)
        d["model_revision"] = model_revision
        d["corpus_hash"] = corpus_hash
        return d

    def config_hash(self, *, model_revision: str, corpus_hash: str) -> str:
        return fields_hash(self.hash_fields(model_revision=model_revision,
                                            corpus_hash=corpus_hash))

    def run_spec(self, info: ModelInfo, *, corpus: str, corpus_hash: str,
                 provenance: dict | None = None, seq_len: int | None = None,
                 sources: tuple = ()) -> RunSpec:
        """The :class:`~attnbase.contract.RunSpec` the warehouse registers for this config,
        the model ``info`` and the corpus it read. ``provenance`` (the resolved device, its name,
        the torch and CUDA versions, the statistics backend: :func:`run_provenance`) enters
        ``config`` but not the hash; a resume on another device is refused by the writer.
        ``seq_len``: the windows' token count where the config leaves it to the model (image
        corpora); ``sources``: each window's source (extract/vision.py), for ``seq_sources``."""
        if self.bos == "none":  # what position 0 is, whatever the tokenizer declares
            from dataclasses import replace

            from attnbase.extract.corpus import NO_SINK_TOKEN

            info = replace(info, sink_token=NO_SINK_TOKEN)
        fields = self.hash_fields(model_revision=info.model_revision, corpus_hash=corpus_hash)
        config = dict(fields, device=self.device)
        config.update(provenance or {})
        return RunSpec(info=info, n_seqs=self.n_seqs, seq_len=self.seq_len or seq_len,
                       batch_size=self.batch_size, dtype=self.dtype, capture=self.capture,
                       corpus=corpus, corpus_hash=corpus_hash,
                       config_hash=self.config_hash(model_revision=info.model_revision,
                                                    corpus_hash=corpus_hash),
                       config=json.dumps(config, sort_keys=True), store_dtype=self.store_dtype,
                       sources=tuple(sources))
