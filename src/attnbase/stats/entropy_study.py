"""``study entropy``: the exact sink/content split of an entropy change (docs/metrics.md §4).

Papamichalis & Ruane, "Attention Rows as Compositional Data": ``H(p) = H_b(s) + (1 - s) H(pi)``,
so the change between two states a -> b of the same rows splits exactly into
``sink part = dH_b + bar(H(pi)) d(1 - s)`` and ``content part = bar(1 - s) dH(pi)`` (bars are
midpoints). The paper finds the entropy drop of training is mostly the sink (95% for Pythia-1B).

Two kinds of state pairs:

- ``runs=(A, B)``: two runs of one architecture on the same windows (checkpoints of a training
  trajectory); rows are matched on ``(layer, head, seq, query)``. Runs whose windows differ are
  refused: the comparison would mix data with training.
- ``run=R, layers=(a, b)``: layer a -> layer b of one run, matched on ``(head, seq, query)``; the
  ``entropy_change`` rows carry ``layer = b``.

With a sink set S (docs/metrics.md "Sink sets") the row entropy has a third term,
``H(p) = H_b(s) + s H(sigma) + (1 - s) H(pi)`` with ``sigma = p_S / s`` the spread inside the set;
``s H(sigma)`` is read as ``H - H_b(s) - (1 - s) H(pi)`` from the stored row statistics and its
change joins the sink part, so the split stays exact.

Everything comes from ``row_stats`` (``sink_mass``, ``content_entropy``, ``entropy``), so no Zarr
array is read except ``tokens`` for the window check. Per head: mean of the per-row parts over
rows with ``query >= min_query``; per layer: mean over its heads; the sink share of a layer is
its sink part / its dH (reported beside dH, so a tiny dH is visible).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from attnbase.contract import DEFAULT_SINK, sink_set
from attnbase.errors import StatsError
from attnbase.metrics import S
from attnbase.stats.compositional import binary_entropy, entropy_change
from attnbase.stats.studies import make_study_id, write_study
from attnbase.stats.weights_only import refuse_weights_only

if TYPE_CHECKING:
    from attnbase.warehouse import Database

__all__ = ["entropy_study", "check_same_windows"]


def check_same_windows(db: Database, run_a: str, run_b: str) -> None:
    """Refuse (one line) two runs that do not share architecture and windows."""
    a, b = db.run_info(run_a), db.run_info(run_b)
    for col in ("n_layers", "n_heads", "n_seqs", "seq_len", "corpus_hash"):
        if a[col] != b[col]:
            raise StatsError(
                f"runs {run_a!r} and {run_b!r} differ in {col} ({a[col]} vs {b[col]}); an entropy "
                "change needs two runs of one architecture on the same windows (same --corpus, "
                "--seqs, --seq-len and tokenizer)")
    ta = db.run(run_a).store().read("tokens")
    tb = db.run(run_b).store().read("tokens")
    if not np.array_equal(ta, tb):
        raise StatsError(
            f"runs {run_a!r} and {run_b!r} were extracted on different windows (tokens differ); "
            "re-extract one with the other's --corpus, --seqs, --seq-len and tokenizer")


_ROWS = """
SELECT a.layer AS layer, a.head AS head, a.sink_mass AS s_a, a.content_entropy AS h_a,
       a.entropy AS e_a, b.sink_mass AS s_b, b.content_entropy AS h_b, b.entropy AS e_b
FROM row_stats a JOIN row_stats b
  ON {join}
WHERE a.run_id = ? AND b.run_id = ? AND a.query >= ? {extra}
"""


def entropy_study(db: Database, *, runs: tuple[str, str] | None = None, run: str | None = None,
                  layers: tuple[int, int] | None = None,
                  min_query: int = 2) -> tuple[str, dict[str, dict[str, float]]]:
    """Write ``entropy_change`` and the per-layer / overall split; ``(study_id, summary)``.

    ``summary`` maps ``"L<l>"`` (and ``"all"``) to ``d_entropy``, ``sink_part``,
    ``content_part``, ``sink_share``.
    """
    for rid in (runs or ()) + ((run,) if run else ()):
        refuse_weights_only(db, rid, "`attnbase study entropy`")
    if min_query < 2:
        raise StatsError(f"min_query={min_query}: content entropy needs queries i >= 2")
    if runs is not None:
        run_a, run_b = runs
        check_same_windows(db, run_a, run_b)
        sql = _ROWS.format(join="a.layer = b.layer AND a.head = b.head AND a.seq = b.seq "
                                "AND a.query = b.query", extra="")
        params: list[Any] = [run_a, run_b, min_query]
        run_ids = [run_a, run_b]
        study_params = {"runs": run_ids, "min_query": min_query}
    elif run is not None and layers is not None:
        info = db.run_info(run)
        la, lb = layers
        for l in layers:
            if not 0 <= l < info["n_layers"]:
                raise StatsError(f"layer {l} out of range for run {run!r} (0..{info['n_layers'] - 1})")
        sql = _ROWS.format(join="a.head = b.head AND a.seq = b.seq AND a.query = b.query",
                           extra="AND a.layer = ? AND b.layer = ?")
        params = [run, run, min_query, la, lb]
        run_ids = [run]
        study_params = {"layers": [la, lb], "min_query": min_query}
    else:
        raise StatsError("an entropy study needs runs=(A, B) or run=R with layers=(a, b)")
    with db.connect(read_only=True) as con:
        d = con.execute(sql, params).fetchnumpy()
    if len(d["layer"]) == 0:
        raise StatsError(f"no matching row_stats rows for {run_ids} with query >= {min_query}")
    ch = entropy_change(d["s_a"], d["h_a"], d["s_b"], d["h_b"])
    if any(sink_set(db.run_info(r).get("sink_positions")) != DEFAULT_SINK for r in run_ids):
        # a sink set: the spread inside it, s H(sigma), belongs to the sink part
        inside = [d[f"e_{x}"] - binary_entropy(d[f"s_{x}"]) - (1 - d[f"s_{x}"]) * d[f"h_{x}"]
                  for x in ("a", "b")]
        dw = inside[1] - inside[0]
        ch = replace(ch, d_entropy=ch.d_entropy + dw, sink_part=ch.sink_part + dw)
        study_params["sink_positions"] = [list(sink_set(db.run_info(r).get("sink_positions")))
                                          for r in run_ids]
    # the split is exact: its total must be the change of the stored entropies
    resid = float(np.nanmax(np.abs(ch.d_entropy - (d["e_b"] - d["e_a"]))))
    layer = np.asarray(d["layer"]) if runs is not None else np.full(len(d["layer"]), layers[1])
    head = np.asarray(d["head"])
    keys = np.stack([layer, head], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.ravel()
    cnt = np.bincount(inv)

    def mean(x):
        return np.bincount(inv, weights=x) / cnt

    E = S.entropy_change
    per_head = {E.d_entropy: mean(ch.d_entropy), E.sink_part: mean(ch.sink_part),
                E.content_part: mean(ch.content_part)}
    study_params["rows"] = int(len(inv))
    sid = make_study_id("entropy_change", run_ids, study_params)
    tbl = pa.table({"study_id": [sid] * len(uniq), "layer": uniq[:, 0].astype(np.int16),
                    "head": uniq[:, 1].astype(np.int16), **per_head})
    summary: dict[str, dict[str, float]] = {}
    for l in np.unique(uniq[:, 0]):
        sel = uniq[:, 0] == l
        summary[f"L{int(l)}"] = _split({k: float(v[sel].mean()) for k, v in per_head.items()})
    summary["all"] = _split({k: float(v.mean()) for k, v in per_head.items()})
    results: dict[str, float] = {E.split_max_residual: resid}
    for lab, v in summary.items():
        for k, x in v.items():
            results[getattr(E, k)(lab)] = x
    write_study(db, "entropy_change", run_ids, study_params, results, {"entropy_change": tbl})
    return sid, summary


def _split(v: dict[str, float]) -> dict[str, float]:
    E = S.entropy_change
    dh = v[E.d_entropy]
    return {**v, E.sink_share: v[E.sink_part] / dh if dh != 0 else float("nan")}
