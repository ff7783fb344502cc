"""A weights-only run (``attnbase weights``) with the S-D metrics (docs/metrics.md §7).

No corpus and no arrays: the run is registered in ``runs`` (``n_seqs = seq_len = 0``, corpus
``(weights)``) and its per-head routing/filtering metrics go to ``head_metrics``, the layer profile
(the cascade) to ``layer_metrics`` and the model means to ``run_metrics``, in one transaction.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from attnbase.contract import WEIGHTS_CORPUS

if TYPE_CHECKING:
    from attnbase.warehouse import Database


@dataclass(frozen=True)
class WeightsConfig:
    """What a weights run computed; its hash is the run's ``config_hash``. The attributes
    ``n_seqs``/``seq_len``/``batch_size``/``device`` let the warehouse register it like a run."""

    model: str
    init: str = "pretrained"
    seed: int = 0
    dtype: str = "float32"
    kind: str = "weights"
    n_seqs: int = 0
    seq_len: int = 0
    batch_size: int = 1
    device: str = "cpu"

    def hash_fields(self, *, model_revision: str, corpus_hash: str) -> dict:
        d = asdict(self)
        for k in ("n_seqs", "seq_len", "batch_size", "device"):
            d.pop(k)
        d["model_revision"] = model_revision
        d["corpus_hash"] = corpus_hash
        return d

    def config_hash(self, *, model_revision: str, corpus_hash: str) -> str:
        from attnbase.extract.config import fields_hash

        return fields_hash(self.hash_fields(model_revision=model_revision,
                                            corpus_hash=corpus_hash))


def weights_run(db: Database, run_id: str, model: str, *, init: str = "pretrained", seed: int = 0,
                overwrite: bool = False) -> dict[str, float]:
    """Compute the S-D metrics of every head of ``model`` into run ``run_id``; returns run_metrics.

    Re-running with the same configuration replaces the metrics; another configuration under
    the same name raises :class:`RunConfigConflictError` unless ``overwrite``.
    """
    import numpy as np
    import pyarrow as pa

    from attnbase.errors import RunConfigConflictError
    from attnbase.extract import load_model
    from attnbase.extract.weights import model_qk
    from attnbase.stats.spectral import sd_tables
    from attnbase.warehouse.runs.writer import (
        check_run_id, config_conflict_message, insert_run, utcnow,
    )

    check_run_id(run_id)
    cfg = WeightsConfig(model=model, init=init, seed=seed)
    lm = _load(model, init, seed, load_model)
    tables = sd_tables([qk.head_pairs() for qk in model_qk(lm)])
    config_hash = cfg.config_hash(model_revision=lm.info.model_revision, corpus_hash="")

    existing = db.find_run(run_id)
    if existing is not None and overwrite:
        db.delete_run(run_id)
        existing = None
    if existing is not None and existing["config_hash"] != config_hash:
        new = cfg.hash_fields(model_revision="?", corpus_hash="?")
        raise RunConfigConflictError(config_conflict_message(run_id, existing, new, config_hash))
    with db.transaction() as con:
        if existing is None:  # registered in the same transaction as its metrics: all or nothing
            insert_run(con, run_id, _run_spec(cfg, lm.info, config_hash))
        for table in ("head_metrics", "layer_metrics", "run_metrics"):
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            rows = tables[table]
            n = len(rows["metric"])
            tbl = pa.table({"run_id": np.full(n, run_id, dtype=object), **rows})
            con.register("_attnbase_sd_rows", tbl)
            try:
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _attnbase_sd_rows")
            finally:
                con.unregister("_attnbase_sd_rows")
        con.execute("UPDATE runs SET status = 'complete', finished_at = ? WHERE run_id = ?",
                    [utcnow(), run_id])
    return dict(zip(tables["run_metrics"]["metric"].tolist(),
                    tables["run_metrics"]["value"].tolist()))


def _run_spec(cfg: WeightsConfig, info, config_hash: str):
    """The run's spec as the warehouse registers it: no corpus, no sequences, no arrays."""
    from attnbase.contract import RunSpec

    config = {**cfg.hash_fields(model_revision=info.model_revision, corpus_hash=""),
              "device": cfg.device}
    return RunSpec(info=info, n_seqs=0, seq_len=0, batch_size=cfg.batch_size, dtype=cfg.dtype,
                   capture=(), corpus=WEIGHTS_CORPUS, corpus_hash="", config_hash=config_hash,
                   config=json.dumps(config, sort_keys=True))


def _load(model: str, init: str, seed: int, load_model):
    if init == "pretrained":
        return load_model(model, dtype="float32", device="cpu")
    from attnbase.extract.variants import load_variant

    return load_variant(model, variant="full", init=init, seed=seed, dtype="float32",
                        device="cpu")
