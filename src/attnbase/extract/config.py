"""The frozen configuration of one extraction run; its hash goes into the catalog."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from attnbase.errors import ExtractError
from attnbase.contract import CAPTURE_CHOICES, ModelInfo, RunSpec, stored_float_dtype
from attnbase.options import (BOS_CHOICES, DTYPES, EXTRACT_OPTIONS, INITS,  # noqa: F401
                              VARIANTS, first_problem)

#: How far a half-precision run's row statistics may be from the float32 run's on the same
#: windows (max |diff| of sink_mass and max_prob, probabilities, and entropy, nats): the
#: tolerance tests/extract/test_device_path.py and benchmarks/gpu.py hold runs to, above what
#: was measured (benchmarks/RESULTS.md: "half-precision row statistics" and "half precision,
#: tiny decoders").
#: ``--seq-len`` of a text corpus when none is given.
DEFAULT_SEQ_LEN = 64
HALF_TOLERANCE = {"float16": 1e-2, "bfloat16": 6e-2}


def fields_hash(fields: dict) -> str:
    """``runs.config_hash``: the first 16 hex digits of the sha256 of the sorted-key JSON."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ExtractConfig:
    """What to extract. ``device`` is where it runs and does not enter the hash."""

    model: str
    corpus: str = EXTRACT_OPTIONS["corpus"].default
    n_seqs: int = EXTRACT_OPTIONS["n_seqs"].default
    #: tokens per window (None: 64 for text; an image corpus leaves it None, the model fixes it)
    seq_len: int | None = EXTRACT_OPTIONS["seq_len"].default
    batch_size: int = EXTRACT_OPTIONS["batch_size"].default
    dtype: str = EXTRACT_OPTIONS["dtype"].default
    capture: tuple[str, ...] = EXTRACT_OPTIONS["capture"].default
    seed: int = EXTRACT_OPTIONS["seed"].default
    device: str = EXTRACT_OPTIONS["device"].default
    variant: str = EXTRACT_OPTIONS["variant"].default
    init: str = EXTRACT_OPTIONS["init"].default
    init_seed: int = EXTRACT_OPTIONS["init_seed"].default
    #: what the float arrays are written in (None: float32, float16 for float16 models)
    store_dtype: str | None = EXTRACT_OPTIONS["store_dtype"].default
    bos: str = EXTRACT_OPTIONS["bos"].default

    def __post_init__(self) -> None:
        """Every field within its declaration's bounds (attnbase.options: the message a
        pipeline file gets for the same value)."""
        from attnbase.extract.vision import is_image_corpus

        if is_image_corpus(self.corpus):
            if self.seq_len is not None:
                raise ExtractError(f"--seq-len does not apply to image corpus {self.corpus!r}: "
                                   "the model fixes the token count ([CLS], its extra tokens "
                                   "and one per patch); leave --seq-len out")
        elif self.seq_len is None:
            object.__setattr__(self, "seq_len", DEFAULT_SEQ_LEN)
        msg = first_problem(EXTRACT_OPTIONS, {f: getattr(self, f) for f in EXTRACT_OPTIONS})
        if msg:
            raise ExtractError(msg)
        if self.store_dtype == stored_float_dtype(self.dtype):
            object.__setattr__(self, "store_dtype", None)  # the default, named: one hash
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
