"""Heads: ``/api/runs/{run}/heads``, ``/runs/{run}/heads/{layer}/{head}`` and its API twin, and
the attention pattern ``.../pattern?seq=S&convention=with_sink|drop_sink``.

The pattern is the softmax over keys of one head's stored ``attn_logits`` for one sequence, read
lazily (one chunk) through :meth:`RunStore.read`; masked keys (``-inf`` logits) are 0.
``drop_sink`` (docs/metrics.md §4): the row renormalised without key 0, pi = p[1:] / (1 - p[0]), with
key 0 shown as 0; a query whose only key is the sink (query 0 of a causal run) has no such row
and is null.
"""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Query, Request

from attnbase.contract import DEFAULT_SINK, WEIGHTS_CORPUS, image_token_names, sink_set
from attnbase.errors import ArrayCorruptError, NotFoundError, WarehouseError
from attnbase.formatting import DEFAULT_DIGITS
from attnbase.logits import softmax
from attnbase.serve.colours import colours
from attnbase.serve.web import (api_json, catalog, check_choice, check_index,
                                fmt_num, in_session, page)

router = APIRouter()

CONVENTIONS = ("with_sink", "drop_sink")
#: Nearest heads listed per (study, dissimilarity, convention).
NEAREST_K = 5


def weights_only(run: dict) -> bool:
    """A run of ``attnbase weights``: head metrics from the weights, no corpus, no arrays."""
    return run.get("corpus") == WEIGHTS_CORPUS


def _head(cat, run_id: str, layer: int, head: int) -> dict:
    run = cat.run_row(run_id)
    check_index("layer", layer, run["n_layers"], run_id)
    check_index("head", head, run["n_heads"], run_id)
    return run


def heads_data(cat, run_id: str) -> list[dict]:
    """The run's ``head_summary`` rows."""
    cat.run_row(run_id)
    if "head_summary" not in cat.tables():
        return []
    return cat.rows("SELECT * FROM head_summary WHERE run_id = ? ORDER BY layer, head", [run_id])


def head_data(cat, run_id: str, layer: int, head: int) -> dict:
    """Every metric of a head with its rank in the run, its null tests, nearest heads and
    clusters. Rank 1 is the largest value of that metric among the run's heads; ``ties`` counts
    the heads with the same value (itself included)."""
    _head(cat, run_id, layer, head)
    b = _bundle(cat, run_id)
    ranked = b["ranked"].get((layer, head), [])
    return {"run_id": run_id, "layer": layer, "head": head,
            "metrics": {r["metric"]: r["value"] for r in ranked},
            "ranks": {r["metric"]: {"rank": r["r"] if r["value"] is not None else None,
                                    "of": r["n"],
                                    "ties": r["ties"] if r["value"] is not None else None}
                      for r in ranked},
            "null_tests": b["null_tests"].get((layer, head), []),
            "nearest": b["nearest"].get((layer, head), []),
            "cluster": b["cluster"].get((layer, head)) or None}


def _bundle(cat, run_id: str) -> dict:
    return cat.memo(("heads", run_id), lambda: _heads_bundle(cat, run_id),
                    version=lambda: _heads_version(cat, run_id))


def head_sections(cat, run_id: str, layer: int, head: int, d: dict) -> dict:
    """The head page's sections that depend on the head alone (``stats``: metrics and null
    tests; ``related``: nearest heads and clusters), rendered once per head of each heads
    bundle and kept with it: every sequence and convention of the head shows the same."""
    from attnbase.serve.web import templates

    held = _bundle(cat, run_id).setdefault("html", {})
    sections = held.get((layer, head))
    if sections is None:
        groups: dict[tuple, list] = {}
        for n in d["nearest"]:
            groups.setdefault((n["study_id"], n["dissimilarity"], n["convention"]), []).append(n)
        macros = templates().get_template("head_sections.html.j2").module
        sections = held[(layer, head)] = {
            "stats": macros.stats(d),
            "related": macros.related(d, cat.run_row(run_id), NEAREST_K,
                                      [(*key, items) for key, items in groups.items()])}
    return sections


def _heads_version(cat, run_id: str) -> tuple:
    """A fingerprint of what :func:`_heads_bundle` reads (benchmarks/RESULTS.md: "heads
    fingerprint"): the run's head_metrics and
    null_tests rows (count and a sum of row hashes) and its studies (id and date; a study's
    distances and clusters are written with its row)."""
    row = cat.query(
        """
        SELECT (SELECT count(*) || ':' || coalesce(sum(hash(t)), 0) FROM head_metrics t
                WHERE run_id = ?) AS metrics,
               (SELECT count(*) || ':' || coalesce(sum(hash(t)), 0) FROM null_tests t
                WHERE run_id = ?) AS nulls,
               (SELECT string_agg(study_id || '@' || created_at, ',' ORDER BY study_id)
                FROM studies WHERE list_contains(run_ids, ?)) AS studies
        """, [run_id, run_id, run_id]).table.to_pylist()[0]
    return tuple(row.values()) + (cat.tables(),)


def _by_head(rows: list[dict]) -> dict[tuple[int, int], list[dict]]:
    out: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        out.setdefault((r.pop("l"), r.pop("h")), []).append(r)
    return out


def _heads_bundle(cat, run_id: str) -> dict:
    """What the head pages of one run read, for all its heads at once (four queries, kept per
    catalog snapshot by :meth:`Catalog.memo`): metric values with their rank among the run's
    heads, null tests, the :data:`NEAREST_K` nearest heads per (study, dissimilarity,
    convention) and the clusters, each keyed by ``(layer, head)``."""
    ranked = cat.rows(
        """
        SELECT layer AS l, head AS h, metric, value,
               rank() OVER (PARTITION BY metric ORDER BY value DESC NULLS LAST) AS r,
               count(value) OVER (PARTITION BY metric) AS n,
               count(value) OVER (PARTITION BY metric, value) AS ties
        FROM head_metrics WHERE run_id = ? ORDER BY l, h, metric
        """, [run_id])
    null_tests = cat.rows(
        "SELECT layer AS l, head AS h, metric, null_model, statistic, null_mean, null_sd, z, "
        "p_value, q_value, p_method, draws, p_empirical, p_at_floor FROM null_tests "
        "WHERE run_id = ? "
        "ORDER BY l, h, metric, null_model, statistic, null_mean, null_sd, z, p_value, q_value, "
        "p_method, draws, p_empirical, p_at_floor", [run_id])
    tables = cat.tables()
    nearest, cluster = [], []
    if "head_distances" in tables:
        # a distances study stores the full matrix (each pair in both orders, and the
        # diagonal, stats/studies.py): a head's row of it, without itself
        nearest = cat.rows(
            """
            SELECT d.layer_a::INTEGER AS l, d.head_a::INTEGER AS h, d.study_id, d.dissimilarity,
                   d.convention, d.layer_b::INTEGER AS layer, d.head_b::INTEGER AS head, d.value
            FROM head_distances d JOIN studies s USING (study_id)
            WHERE list_contains(s.run_ids, ?)
              AND NOT (d.layer_a = d.layer_b AND d.head_a = d.head_b)
            QUALIFY row_number() OVER (
                PARTITION BY d.layer_a, d.head_a, d.study_id, d.dissimilarity, d.convention
                ORDER BY d.value, d.layer_b, d.head_b) <= ?
            ORDER BY l, h, d.study_id, d.dissimilarity, d.convention, d.value, layer, head
            """, [run_id, NEAREST_K])
    if "head_clusters" in tables:
        cluster = cat.rows(
            """
            SELECT c.layer AS l, c.head AS h, c.study_id, c.dissimilarity, c.convention,
                   c.cluster,
                   count(*) OVER (PARTITION BY c.study_id, c.dissimilarity, c.convention,
                                               c.cluster) AS size,
                   k.value IS NOT NULL AS qualified, m.value AS min_cluster
            FROM head_clusters c JOIN studies s USING (study_id)
            LEFT JOIN study_results k
                   ON k.study_id = c.study_id AND k.key = 'k/' || c.dissimilarity
            LEFT JOIN study_results m
                   ON m.study_id = c.study_id AND m.key = 'min_cluster/' || c.dissimilarity
            WHERE list_contains(s.run_ids, ?)
            ORDER BY l, h, c.study_id, c.dissimilarity, c.convention
            """, [run_id])
    # (head_summary itself is not read here: its pivot goes over every run;
    # metrics and null_tests hold the same numbers, tests/serve checks them against it)
    return {"ranked": _by_head(ranked), "null_tests": _by_head(null_tests),
            "nearest": _by_head(nearest), "cluster": _by_head(cluster)}


def _read(cat, run_id: str, name: str, index):
    # one store object per run and snapshot: its group and arrays are opened once
    store = cat.memo(("store", run_id), lambda: cat.run(run_id).store(keep_open=True,
                                                                     decoded=cat.decoded),
                     version=lambda: _store_version(cat, run_id))
    try:
        return store.read(name, index)
    except ArrayCorruptError:
        raise
    except WarehouseError as err:  # no store, or no such array: nothing to show
        raise NotFoundError(str(err)) from None


#: A complete run's token ids are kept whole per snapshot up to this size (a sequence's tokens label
#: every head's pattern of it; 8 MiB is 2,048 sequences of 1,024 tokens), else read per request
TOKENS_KEPT_BYTES = 8 << 20


def _tokens(cat, run_id: str, seq: int) -> np.ndarray:
    """The token ids of one sequence of the run."""
    run = cat.run_row(run_id)
    if (run["status"] != "complete"  # batches still to come: their tokens are not there yet
            or int(run["n_seqs"]) * int(run["seq_len"]) * 4 > TOKENS_KEPT_BYTES):
        return _read(cat, run_id, "tokens", seq)
    whole = cat.memo(("tokens", run_id), lambda: _read(cat, run_id, "tokens", ...),
                     version=lambda: _store_version(cat, run_id))
    return whole[seq]


def _store_version(cat, run_id: str) -> tuple:
    """A fingerprint of the run's store as the catalog describes it: where it lives, its
    arrays and their recipes (``attnbase compact`` turns stored logits into derived ones) and
    how many batches the ledger counts (whose chunks a read checks are there)."""
    rows = cat.rows("SELECT name, dtype, derived, shape, derivation FROM arrays WHERE run_id = ? "
                    "UNION ALL SELECT 'batches complete', NULL, NULL, NULL, count(*)::VARCHAR "
                    "FROM batches WHERE run_id = ? AND status = 'complete' ORDER BY 1",
                    [run_id, run_id])
    return (cat.run_row(run_id).get("store_url"),) + tuple(tuple(r.values()) for r in rows)


def _pending_batch(cat, run_id: str, seq: int) -> int | None:
    """The batch holding ``seq`` when the snapshot's ledger does not count it complete."""
    ledger = cat.memo(("ledger", run_id), lambda: cat.rows(
        "SELECT batch, first_seq, n_seqs, status FROM batches WHERE run_id = ? ORDER BY batch",
        [run_id]))
    for b in ledger:
        if b["first_seq"] <= seq < b["first_seq"] + b["n_seqs"]:
            return None if b["status"] == "complete" else int(b["batch"])
    return None


def pattern_data(cat, run_id: str, layer: int, head: int, seq: int,
                 convention: str = "with_sink") -> dict:
    """``{"seq", "tokens", "probs"}`` (query x key) of one head on one sequence."""
    run = _head(cat, run_id, layer, head)
    if weights_only(run):
        raise NotFoundError(f"run {run_id!r} is a weights-only run (attnbase weights): it has no "
                            "activations, so no attention pattern; its S-D metrics are on "
                            f"/api/runs/{run_id}/heads/{layer}/{head}")
    check_index("sequence", seq, run["n_seqs"], run_id)
    check_choice("convention", convention, CONVENTIONS)
    if run["seq_len"] > cat.settings.max_pattern_len:
        raise NotFoundError(f"run {run_id!r} has sequences of {run['seq_len']} tokens; the "
                            f"service draws patterns up to {cat.settings.max_pattern_len}")
    batch = _pending_batch(cat, run_id, seq)
    if batch is not None:  # its chunks may be there, but the ledger does not count them yet
        raise NotFoundError(f"run {run_id!r}: sequence {seq} is not written yet (its batch "
                            f"{batch} is not complete in the ledger: still being extracted, "
                            "or stopped before its end)")
    logits = _read(cat, run_id, "attn_logits", (layer, head, seq))
    if np.isnan(logits).all():
        raise NotFoundError(f"run {run_id!r}: sequence {seq} is not written yet (its batch is "
                            "still being extracted)")
    probs = softmax(logits)
    sink = sink_set(run.get("sink_positions"))
    if convention == "drop_sink" and sink != DEFAULT_SINK:  # a sink set: every key of it dropped
        content = np.ones(probs.shape[1], dtype=bool)
        content[[p for p in sink if p < probs.shape[1]]] = False
        with np.errstate(invalid="ignore", divide="ignore"):
            rest = probs[:, content] / probs[:, content].sum(axis=1, keepdims=True)
        bad = ~np.isfinite(rest).all(axis=1)
        probs = np.zeros_like(probs)
        probs[:, content] = rest
        probs[bad] = np.nan
    elif convention == "drop_sink":
        with np.errstate(invalid="ignore", divide="ignore"):
            rest = probs[:, 1:] / (1.0 - probs[:, :1])
        rest[~np.isfinite(rest).all(axis=1)] = np.nan  # only the sink: no drop_sink row
        probs = np.concatenate([np.where(np.isnan(rest[:, :1]), np.nan, 0.0), rest], axis=1)
    from attnbase.tokentext import token_labels

    ids = _tokens(cat, run_id, seq)
    labels = image_token_names(run["family"], len(sink), len(ids))
    if labels is not None:  # an image run: the family's token layout, not a tokenizer
        source = f"the {run['family']} token layout ([CLS], extra tokens, patches by row, col)"
    else:
        labels, source = token_labels(run["model"], ids)
    return {"run_id": run_id, "layer": layer, "head": head, "seq": seq, "convention": convention,
            "tokens": labels, "token_ids": [int(i) for i in ids], "token_source": source,
            "probs": probs}


ROW_COLUMNS = ("query", "n_keys", "sink_mass", "entropy", "max_prob", "argmax")


def row_stats_data(cat, run_id: str, layer: int, head: int, seq: int) -> dict[str, list]:
    """Per-query row statistics of one head on one sequence (``row_stats``), column by column
    in query order: read from the sequence's batch file (or the run's merged file) where it is
    local, its row groups kept decoded (:attr:`Catalog.decoded`), else through the view."""
    from attnbase.warehouse.runs.statfiles import read_batch_table

    batches = cat.memo(("batches", run_id), lambda: cat.rows(
        "SELECT batch, first_seq, n_seqs FROM batches WHERE run_id = ? ORDER BY batch",
        [run_id]))
    batch = next((b["batch"] for b in batches
                  if b["first_seq"] <= seq < b["first_seq"] + b["n_seqs"]), None)
    # the files the catalog lists for the batch (none while it is pending), then a merged one
    files = cat.memo(("stat_files", run_id), lambda: cat.rows(
        "SELECT batch, path FROM stat_files WHERE run_id = ? AND table_name = 'row_stats' "
        "ORDER BY path", [run_id]))
    paths = ([f["path"] for f in files if f["batch"] == batch]
             + [f["path"] for f in files if f["batch"] is None])
    cat.check_stat_files(paths)
    tbl = None if batch is None else read_batch_table(
        cat.run(run_id), paths, ROW_COLUMNS,
        {"layer": layer, "head": head, "seq": seq}, decoded=cat.decoded)
    if tbl is None:
        rows = cat.rows(f"SELECT {', '.join(ROW_COLUMNS)} FROM row_stats WHERE run_id = ? AND "
                        "layer = ? AND head = ? AND seq = ? ORDER BY query",
                        [run_id, layer, head, seq])
        return {c: [r[c] for r in rows] for c in ROW_COLUMNS}
    return tbl.sort_by("query").to_pydict()


def row_stats_table(cols: dict[str, list], tokens: list[str]):
    """The row statistics as an HTML table (one row per query, its token escaped), built here
    as :func:`pattern_table` is: Jinja's per-cell work was a third of the page's rendering."""
    from markupsafe import Markup, escape

    out = ['<table class="data" id="row-stats"><tr><th>query</th><th>token</th><th>keys</th>'
           '<th>sink mass</th><th>entropy (nats)</th><th>max prob</th><th>argmax</th></tr>']
    for q, n, sink, ent, top, arg in zip(*(cols[c] for c in ROW_COLUMNS)):
        token = escape(tokens[q]) if q is not None and 0 <= q < len(tokens) else ""
        out.append(f"<tr><td>{fmt_num(q)}</td><td>{token}</td><td>{fmt_num(n)}</td>"
                   f"<td>{fmt_num(sink)}</td><td>{fmt_num(ent)}</td><td>{fmt_num(top)}</td>"
                   f"<td>{fmt_num(arg)}</td></tr>")
    if len(out) == 1:
        out.append('<tr><td colspan="7">no row statistics for this sequence</td></tr>')
    out.append("</table>")
    return Markup("".join(out))


def pattern_table(tokens: list[str], probs: np.ndarray, hi: float):
    """The pattern as an HTML table (query rows x key columns, token labels on both axes), every
    token escaped. The values are one JSON matrix in the table's ``data-probs`` (float32's
    shortest text, null where a row has none); the page's script names query, key and value
    under the cursor from it and the labels, the value with ``data-digits`` significant digits.
    Built here rather than in the template: a 128 x 128 pattern is 16k cells, too many for
    Jinja's or Python's formatting per cell (benchmarks/RESULTS.md: "pattern cells built in
    Python"). Exact zeros (masked keys; key 0 under drop_sink)
    are white, missing rows grey."""
    import orjson
    from markupsafe import Markup, escape

    labels = [str(escape(t)) for t in tokens]
    ok = np.isfinite(probs)
    bg = np.where(ok & (probs == 0.0), "#ffffff", colours(probs, 0.0, hi)).tolist()
    values = orjson.dumps(np.ascontiguousarray(probs, dtype=np.float32),
                          option=orjson.OPT_SERIALIZE_NUMPY).decode()  # digits, commas, null
    out = [f'<table class="pattern" id="pattern" data-probs="{values}" '
           f'data-digits="{DEFAULT_DIGITS}"><tr><th class="corner">q \\ k</th>']
    out += [f'<th class="klabel"><span>{t}</span></th>' for t in labels]
    out.append("</tr>")
    for q, row_bg in enumerate(bg):
        out.append(f'<tr><th class="qlabel">{labels[q]}</th>')
        out += [f'<td style="background:{c}"></td>' for c in row_bg]
        out.append("</tr>")
    out.append("</table>")
    return Markup("".join(out))


# --- routes ----------------------------------------------------------------------------------
@router.get("/api/runs/{run}/heads", tags=["heads"], summary="the run's head_summary rows")
@in_session
def api_heads(request: Request, run: str):
    return api_json(heads_data(catalog(request), run))


@router.get("/api/runs/{run}/heads/{layer}/{head}", tags=["heads"],
            summary="a head's metrics, ranks, null tests, nearest heads and clusters")
@in_session
def api_head(request: Request, run: str, layer: int, head: int):
    return api_json(head_data(catalog(request), run, layer, head))


@router.get("/api/runs/{run}/heads/{layer}/{head}/pattern", tags=["heads"],
            summary="softmax of the head's attn_logits on one sequence (query x key)")
@in_session
def api_pattern(request: Request, run: str, layer: int, head: int,
                seq: int = Query(..., description="sequence index"),
                convention: str = Query("with_sink", description="with_sink | drop_sink")):
    return api_json(pattern_data(catalog(request), run, layer, head, seq, convention))


@router.get("/runs/{run}/heads/{layer}/{head}", include_in_schema=False)
@in_session
def head_page(request: Request, run: str, layer: int, head: int, seq: int = 0,
              convention: str = "with_sink"):
    cat = catalog(request)
    d = head_data(cat, run, layer, head)
    run_row = cat.run_row(run)
    sections = head_sections(cat, run, layer, head, d)
    if weights_only(run_row):
        return page(request, "head.html.j2", d=d, run=run_row, pattern=None, sections=sections)
    pattern = pattern_data(cat, run, layer, head, seq, convention)
    probs = pattern["probs"]
    finite = probs[np.isfinite(probs)]
    hi = float(finite.max()) if finite.size else 1.0
    from attnbase.serve.images import window_image

    sink = sink_set(run_row.get("sink_positions"))
    return page(request, "head.html.j2", d=d, run=run_row, pattern=pattern, sections=sections,
                image=window_image(cat, run_row, seq, len(sink)),
                sink=list(sink) if sink != DEFAULT_SINK else None,
                pattern_table=pattern_table(pattern["tokens"], probs, hi),
                conventions=CONVENTIONS, hi=hi,
                row_stats_table=row_stats_table(row_stats_data(cat, run, layer, head, seq),
                                                pattern["tokens"]))
