"""The pipeline's TOML configuration: models x corpora x options, validated into a frozen dataclass.

A pipeline file is flat: every key is optional except ``models``::

    db = "attnbase-db"
    models = ["minilm", "tiny-llama"]
    corpora = ["default"]
    seqs = 16
    seq_len = 64
    batch_size = 8
    dtype = "float32"
    capture = ["keys", "queries", "hidden"]   # logits derived from queries and keys; add
                                              # "logits" to store them
    seed = 0
    bos = "auto"               # "auto" (prepend the tokenizer's BOS) | "none" (position 0 is text)
    draws = 200
    task_runner = "local"      # "local" (threads) | "dask" (multi-process LocalCluster)
    workers = 2                # threads (local) or Dask worker processes (dask)
    dask_address = ""          # an existing scheduler, "tcp://host:8786" (then workers is ignored)
    store = ""                 # "s3://bucket/prefix": runs' arrays and statistics files there
    image_models = []          # vision models (ViT, DeiT, DINOv2), run on every image corpus
    image_corpora = ["images:sample"]   # or directories of PNG/JPEG (seq_len: the model's)
    report_dir = ""            # an absolute directory for the report; default: the database's
                               # reports/ (as `attnbase report` without --out)

Every problem is reported as one line naming the key, quoting the bad value and saying what to
write instead (as xarray's validation errors do).
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbase.extract.config import ExtractConfig
from attnbase.contract import DEFAULT_CAPTURE
from attnbase.flows.errors import PipelineConfigError
from attnbase.options import BOS_CHOICES, DB_DEFAULT, DTYPES, NULL_DRAWS, pipeline_options

TASK_RUNNERS = ("local", "dask")
_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
#: Suffixes stripped from a model's last path component for its run id (a file, not a name).
_MODEL_FILE_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt")


@dataclass(frozen=True)
class PipelineConfig:
    """One pipeline: every model on every corpus with the same extraction and analysis options.

    ``source`` is the file it came from (for messages).
    """

    models: tuple[str, ...]
    corpora: tuple[str, ...] = ("default",)
    #: vision models, each run on every image corpus (the token count is the model's)
    image_models: tuple[str, ...] = ()
    image_corpora: tuple[str, ...] = ("images:sample",)
    db: str = DB_DEFAULT
    seqs: int = 16
    seq_len: int = 64
    batch_size: int = 8
    dtype: str = "float32"
    capture: tuple[str, ...] = DEFAULT_CAPTURE
    seed: int = 0
    bos: str = "auto"
    draws: int = NULL_DRAWS
    device: str = "cpu"
    task_runner: str = "local"
    workers: int = 2
    #: an existing Dask scheduler (``tcp://host:8786``); then ``workers`` is ignored
    dask_address: str = ""
    #: ``s3://bucket/prefix``: every run's arrays and statistics files under ``<prefix>/<run>/``
    store: str = ""
    run_prefix: str = ""
    overwrite: bool = False
    analyze: bool = True
    report: bool = True
    #: where the report is written (absolute); "" = the database's reports directory
    #: (:func:`attnbase.reports.data.reports_dir`, as ``attnbase report`` without ``--out``)
    report_dir: str = ""
    studies: tuple[str, ...] = ()  #: study kinds run after analysis (flows.studies)
    study_max_rows: int = 0  #: rows of the head-distance row set (0 = all)
    source: str = "<dict>"

    def shards(self) -> list[tuple[str, ExtractConfig]]:
        """``(run_id, ExtractConfig)`` for every model x corpus, then every image model x image
        corpus, in file order."""
        out = []
        pairs = [(m, c, self.seq_len, self.bos) for m in self.models for c in self.corpora]
        pairs += [(m, c, None, "auto") for m in self.image_models for c in self.image_corpora]
        for model, corpus, seq_len, bos in pairs:
            cfg = ExtractConfig(model=model, corpus=corpus, n_seqs=self.seqs, seq_len=seq_len,
                                batch_size=self.batch_size, dtype=self.dtype,
                                capture=self.capture, seed=self.seed, device=self.device, bos=bos)
            out.append((run_id_for(model, corpus, self.run_prefix), cfg))
        return out


def run_id_for(model: str, corpus: str, prefix: str = "") -> str:
    """A catalog-safe run id: ``<prefix><model>-<corpus>`` from the last path component of each.

    >>> run_id_for("tiny-llama", "default")
    'tiny-llama-default'
    >>> run_id_for("/models/bert base/", "data/wiki.txt", prefix="nightly-")
    'nightly-bert_base-wiki'
    >>> run_id_for("EleutherAI/pythia-1.4b", "wikitext-103-validation.txt")
    'pythia-1.4b-wikitext-103-validation'
    """

    def slug(s: str, suffixes: tuple[str, ...] | None = None) -> str:
        s = s.rstrip("/\\")
        s = re.split(r"[/\\]", s)[-1]
        if "." in s and not s.startswith(".") and (suffixes is None or s.endswith(suffixes)):
            s = s.rsplit(".", 1)[0]
        return _RUN_ID_UNSAFE.sub("_", s).strip("_") or "x"

    # a model's dots are part of its name (pythia-1.4b), a corpus file's suffix is not
    return f"{prefix}{slug(model, _MODEL_FILE_SUFFIXES)}-{slug(corpus)}"


# key -> (python type(s) accepted, how to write it)
_KEYS: dict[str, tuple[Any, str]] = {
    "db": (str, f'db = "{DB_DEFAULT}"'),
    "models": (list, 'models = ["minilm", "tiny-llama"]'),
    "corpora": (list, 'corpora = ["default"]'),
    "image_models": (list, 'image_models = ["google/vit-base-patch16-224"]'),
    "image_corpora": (list, 'image_corpora = ["images:sample"] (or a directory of PNG/JPEG)'),
    "seqs": (int, "seqs = 16"),
    "seq_len": (int, "seq_len = 64"),
    "batch_size": (int, "batch_size = 8"),
    "dtype": (str, f'dtype = "float32" (one of {", ".join(DTYPES)})'),
    "capture": (list, 'capture = ["keys", "queries", "hidden"] (add "logits" to store them)'),
    "seed": (int, "seed = 0"),
    "bos": (str, f'bos = "auto" (one of {", ".join(BOS_CHOICES)})'),
    "draws": (int, f"draws = {NULL_DRAWS}"),
    "device": (str, 'device = "cpu" (or "auto", "cuda")'),
    "task_runner": (str, f'task_runner = "local" (one of {", ".join(TASK_RUNNERS)})'),
    "workers": (int, "workers = 2"),
    "dask_address": (str, 'dask_address = "tcp://scheduler:8786" (with task_runner = "dask")'),
    "store": (str, 'store = "s3://bucket/prefix"'),
    "run_prefix": (str, 'run_prefix = "nightly-"'),
    "overwrite": (bool, "overwrite = false"),
    "analyze": (bool, "analyze = true"),
    "report": (bool, "report = true"),
    "report_dir": (str, 'report_dir = "/shared/reports" (an absolute directory)'),
    "studies": (list, 'studies = ["distances", "reversal", "clusters"]'),
    "study_max_rows": (int, "study_max_rows = 2000 (0 = every row)"),
}
#: bounds of the keys that are no extraction or analysis option (those: attnbase.options)
_MIN = {"study_max_rows": 0, "workers": 1}


def _fail(src: str, key: str, msg: str, option: bool = False) -> PipelineConfigError:
    """One line naming the file and the key; ``option``: ``msg`` is an option's own message
    (:meth:`attnbase.options.Option.problem`, naming the key), the command line's for the same
    value."""
    return PipelineConfigError(f"{src}: key '{key}'{':' if option else ''} {msg}")


def parse_pipeline_config(data: dict[str, Any], source: str = "<dict>") -> PipelineConfig:
    """Validate a parsed TOML table into a :class:`PipelineConfig` (one-line errors)."""
    unknown = [k for k in data if k not in _KEYS]
    if unknown:
        k = unknown[0]
        close = difflib.get_close_matches(k, list(_KEYS), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise PipelineConfigError(f"{source}: unknown key '{k}'; {hint}valid keys: {', '.join(_KEYS)}")
    if "models" not in data:
        raise _fail(source, "models", f"is missing; add a list of models, e.g. {_KEYS['models'][1]}")
    kw: dict[str, Any] = {}
    for key, value in data.items():
        typ, example = _KEYS[key]
        # bool is an int in Python; TOML keeps them apart, so must we
        ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
        if not ok:
            raise _fail(source, key, f"must be {typ.__name__ if typ is not list else 'a list'}, "
                                     f"got {value!r} ({type(value).__name__}); write {example}")
        if typ is int and key in _MIN and value < _MIN[key]:
            raise _fail(source, key, f"must be >= {_MIN[key]}, got {value}; write {example}")
        if typ is list:
            if not value or not all(isinstance(v, str) and v for v in value):
                raise _fail(source, key, f"must be a non-empty list of strings, got {value!r}; "
                                         f"write {example}")
            if len(set(value)) != len(value):
                dup = next(v for v in value if value.count(v) > 1)
                raise _fail(source, key, f"lists {dup!r} twice; list each entry once")
            value = tuple(value)
        kw[key] = value
    options = pipeline_options()
    for key, value in kw.items():  # the extraction and analysis options: the command's checks
        msg = options[key].problem(value, key) if key in options else None
        if msg:
            raise _fail(source, key, msg, option=True)
    from attnbase.flows.studies import PIPELINE_STUDIES

    bad = [k for k in kw.get("studies", ()) if k not in PIPELINE_STUDIES]
    if bad:
        raise _fail(source, "studies", f"has unknown study {bad[0]!r}; choose from "
                                       f"{', '.join(PIPELINE_STUDIES)}")
    cap = set(kw.get("capture", DEFAULT_CAPTURE))
    if kw.get("studies") and "logits" not in cap and not {"queries", "keys"} <= cap:
        raise _fail(source, "studies", 'need attention logits: capture "queries" and "keys" '
                                       '(they are derived from them) or add "logits"')
    from attnbase.studies.kinds import CAPTURE_NEEDED

    for kind in kw.get("studies", ()):
        missing = [c for c in CAPTURE_NEEDED.get(kind, ()) if c not in cap]
        if missing:
            raise _fail(source, "studies", f"lists {kind!r}, which reads stored {missing[0]}; "
                                           f'add "{missing[0]}" to capture')
    if kw.get("task_runner", "local") not in TASK_RUNNERS:
        raise _fail(source, "task_runner", f"is {kw['task_runner']!r}; write {_KEYS['task_runner'][1]}")
    if kw.get("dask_address") and kw.get("task_runner", "local") != "dask":
        raise _fail(source, "dask_address", 'needs task_runner = "dask"; add it or drop '
                                            "dask_address")
    if kw.get("dask_address") and not re.match(r"^(tcp|tls|inproc|ucx)://\S+$", kw["dask_address"]):
        raise _fail(source, "dask_address", f"is {kw['dask_address']!r}; write "
                                            f"{_KEYS['dask_address'][1]}")
    if kw.get("store"):
        from attnbase.warehouse.runs.location import split_url

        try:
            split_url(kw["store"])
        except Exception as exc:
            raise _fail(source, "store", f"{exc}") from None
    if kw.get("report_dir") and not Path(kw["report_dir"]).is_absolute():
        raise _fail(source, "report_dir", f"is {kw['report_dir']!r}, a relative path (the process "
                                          f"that runs the pipeline writes there); write "
                                          f"{_KEYS['report_dir'][1]}")
    if kw.get("device", "cpu") not in ("cpu", "auto", "cuda") and not kw["device"].startswith("cuda:"):
        raise _fail(source, "device", f"is {kw['device']!r}; write {_KEYS['device'][1]}")
    cfg = PipelineConfig(source=source, **kw)
    ids = [rid for rid, _ in cfg.shards()]
    from attnbase.studies.kinds import GROUP_MIN_RUNS

    for kind in cfg.studies:
        if len(ids) < GROUP_MIN_RUNS.get(kind, 0):
            raise _fail(source, "studies", f"lists {kind!r}, which compares {GROUP_MIN_RUNS[kind]} "
                                           f"or more runs; the config makes {len(ids)}: list "
                                           "more models")
    if len(set(ids)) != len(ids):
        dup = next(r for r in ids if ids.count(r) > 1)
        raise PipelineConfigError(f"{source}: two model x corpus pairs map to run id {dup!r}; "
                                  f"rename a model or corpus path so their last components differ")
    return cfg


def pipeline_database(cfg: PipelineConfig, db: str | None = None) -> str:
    """The database the pipeline writes (``db``, else the config's ``db`` key) as a process
    elsewhere finds it: an address as is, a directory made absolute."""
    from attnbase.warehouse.database import location

    return location(db or cfg.db)


def load_pipeline_config(path: str | Path) -> PipelineConfig:
    """Read and validate a pipeline TOML file (a relative ``db`` is relative to the working
    directory, like ``--db`` everywhere else)."""
    p = Path(path)
    if not p.is_file():
        raise PipelineConfigError(f"pipeline config {str(p)!r} does not exist; pass --config FILE.toml "
                                  f"(see examples/pipeline.toml)")
    return parse_pipeline_text(p.read_text(encoding="utf-8"), str(p))


def parse_pipeline_text(text: str, source: str) -> PipelineConfig:
    """Validate a pipeline file's TOML ``text`` (``source`` names it in messages)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PipelineConfigError(f"{source}: not valid TOML ({exc}); fix the syntax there") from exc
    return parse_pipeline_config(data, source=source)
