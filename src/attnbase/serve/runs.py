"""Runs: ``/`` and ``/api/runs``, ``/runs/{run}`` and ``/api/runs/{run}``, ``/compare``.

Each page and its ``/api`` twin call one data function (:func:`runs_data`, :func:`run_data`,
:func:`compare_data`); the pages add only figures drawn from the same data.
"""

from __future__ import annotations

import json

import numpy as np
from fastapi import APIRouter, Query, Request

from attnbase.contract import WEIGHTS_CORPUS, image_extra_tokens, sink_set
from attnbase.errors import NotFoundError
from attnbase.formatting import fmt
from attnbase.metrics import (
    DEPTH_PROFILE, METRICS, RUN_LIST_COLUMNS, RUN_PAGE_PROFILES, N, S, uniform_max_share,
)
from attnbase.serve.colours import colour, ink
from attnbase.serve.web import api_json, catalog, in_session, page

router = APIRouter()

#: Per-layer profiles (layer means of head_metrics) the run page draws, with their axis labels.
PROFILES: tuple[tuple[str, str], ...] = tuple(
    (name, f"{METRICS[name].label} ({METRICS[name].unit})") for name in RUN_PAGE_PROFILES)
#: The head finder's metric when none is chosen.
DEFAULT_GRID_METRIC = RUN_PAGE_PROFILES[0]
#: Null models of the VE@8 null tests drawn as bands.
NULL_MODELS = ("gauss", "shuffle")


def runs_data(cat, model: str | None = None, status: str | None = None) -> list[dict]:
    """``runs`` rows (without ``config``) with ledger progress and their ``table1`` row."""
    rows = cat.rows(
        """
        SELECT r.* EXCLUDE (config), coalesce(b.done, 0) AS batches_done,
               coalesce(b.total, 0) AS batches_total
        FROM runs r
        LEFT JOIN (SELECT run_id, count(*) FILTER (WHERE status = 'complete') AS done,
                          count(*) AS total FROM batches GROUP BY run_id) b USING (run_id)
        WHERE (?::VARCHAR IS NULL OR r.model = ?) AND (?::VARCHAR IS NULL OR r.status = ?)
        ORDER BY r.created_at, r.run_id
        """, [model, model, status, status])
    t1 = {}
    if "table1" in cat.tables():
        t1 = {r["run_id"]: r for r in cat.rows("SELECT * FROM table1")}
    for r in rows:
        r["table1"] = t1.get(r["run_id"])
    return rows


def _reports(cat, run_id: str) -> dict:
    base = cat.root / "reports" / run_id
    return {kind: f"/reports/{run_id}/report.{kind}" if (base / f"report.{kind}").is_file()
            else None for kind in ("html", "pdf")}


def run_data(cat, run_id: str) -> dict:
    """The run row, its Table-1 row, arrays, per-layer profiles, studies and stored reports."""
    run = cat.run_row(run_id)
    if isinstance(run.get("config"), str):
        run["config"] = json.loads(run["config"])
    tables = cat.tables()
    table1 = None
    if "table1" in tables:
        found = cat.rows("SELECT * FROM table1 WHERE run_id = ?", [run_id])
        table1 = found[0] if found else None
    arrays = cat.rows("SELECT name, dims, shape, chunks, dtype FROM arrays WHERE run_id = ? "
                      "ORDER BY name", [run_id])
    n_layers = run["n_layers"]
    profiles: dict[str, list] = {}
    for r in cat.rows("SELECT metric, layer, avg(value) AS v FROM head_metrics WHERE run_id = ? "
                      "GROUP BY ALL ORDER BY metric, layer", [run_id]):
        profiles.setdefault(r["metric"], [None] * n_layers)
        if 0 <= r["layer"] < n_layers:
            profiles[r["metric"]][r["layer"]] = r["v"]
    layer_metrics: dict[str, dict] = {}
    for r in cat.rows("SELECT metric, layer, value FROM layer_metrics WHERE run_id = ? "
                      "ORDER BY metric, layer", [run_id]):
        layer_metrics.setdefault(r["metric"], {})[str(r["layer"])] = r["value"]
    nulls: dict[str, dict] = {}
    for r in cat.rows("SELECT metric, null_model, layer, avg(null_mean) AS mean, "
                      "avg(null_sd) AS sd FROM null_tests WHERE run_id = ? GROUP BY ALL "
                      "ORDER BY ALL", [run_id]):
        key = f"{r['metric']}/{r['null_model']}"
        d = nulls.setdefault(key, {"mean": [None] * n_layers, "sd": [None] * n_layers})
        if 0 <= r["layer"] < n_layers:
            d["mean"][r["layer"]], d["sd"][r["layer"]] = r["mean"], r["sd"]
    studies = cat.rows("SELECT study_id, kind, params, created_at FROM studies "
                       "WHERE list_contains(run_ids, ?) ORDER BY created_at, study_id", [run_id])
    for s in studies:
        s["results"] = cat.rows("SELECT key, value FROM study_results WHERE study_id = ? "
                                "ORDER BY key", [s["study_id"]])
    return {"run": run, "table1": table1, "arrays": arrays, "profiles": profiles,
            "layer_metrics": layer_metrics, "nulls": nulls, "studies": studies,
            "reports": _reports(cat, run_id)}


def grid_data(cat, run_id: str, metric: str | None = None) -> dict:
    """The head finder: ``metric`` (a head_metrics name, or ``z:<metric>/<null_model>`` for a
    null test's z) of every head as a [layer][head] grid, and the metrics one may choose."""
    run = cat.run_row(run_id)
    names = [r["metric"] for r in cat.rows(
        "SELECT DISTINCT metric FROM head_metrics WHERE run_id = ? ORDER BY metric", [run_id])]
    zs = [f"z:{r['metric']}/{r['null_model']}" for r in cat.rows(
        "SELECT DISTINCT metric, null_model FROM null_tests WHERE run_id = ? ORDER BY ALL",
        [run_id])]
    choices = names + zs
    if not choices:
        return {"metric": None, "choices": [], "values": None}
    if metric is None:
        metric = DEFAULT_GRID_METRIC if DEFAULT_GRID_METRIC in choices else choices[0]
    if metric not in choices:
        raise NotFoundError(f"run {run_id!r} has no head metric {metric!r} "
                            f"(valid: {', '.join(choices)})")
    if metric.startswith("z:"):
        base, null_model = metric[2:].split("/", 1)
        cells = cat.rows("SELECT layer, head, z AS value FROM null_tests WHERE run_id = ? AND "
                         "metric = ? AND null_model = ?", [run_id, base, null_model])
    else:
        cells = cat.rows("SELECT layer, head, value FROM head_metrics WHERE run_id = ? AND "
                         "metric = ?", [run_id, metric])
    values = [[None] * run["n_heads"] for _ in range(run["n_layers"])]
    for c in cells:
        if 0 <= c["layer"] < run["n_layers"] and 0 <= c["head"] < run["n_heads"]:
            values[c["layer"]][c["head"]] = c["value"]
    return {"metric": metric, "choices": choices, "values": values}


def compare_ids(runs: str, most: int) -> list[str]:
    """The distinct run ids of ``?runs=a,b,...`` in their order; at most ``most`` of them
    (:class:`QueryLimitError`, 400, beyond)."""
    from attnbase.errors import QueryLimitError

    ids = list(dict.fromkeys(r for r in (x.strip() for x in runs.split(",")) if r))
    if len(ids) > most:
        raise QueryLimitError(f"compare takes at most {most} distinct runs (got {len(ids)}; the "
                              "server's max_compare_runs); compare fewer at a time")
    return ids


def compare_data(cat, run_ids: list[str]) -> dict:
    """Table-1 rows side by side, the per-layer profiles of each run, and an image run's
    high-norm table with the tokens it has before its patches (registers' effect)."""
    from attnbase.serve.vision import high_norm_table

    if not run_ids:
        raise NotFoundError("compare needs ?runs=a,b (run ids separated by commas)")
    out = []
    for run_id in run_ids:
        d = run_data(cat, run_id)
        out.append({"run_id": run_id, "n_layers": d["run"]["n_layers"], "table1": d["table1"],
                    "profiles": d["profiles"], "high_norm": high_norm_table(d["layer_metrics"]),
                    "extra_tokens": image_extra_tokens(
                        d["run"].get("family") or "",
                        len(sink_set(d["run"].get("sink_positions"))))})
    return {"runs": out, "scaling": scaling_of(cat, run_ids)}


def scaling_of(cat, run_ids: list[str]) -> dict | None:
    """The newest ``scaling`` study over every one of ``run_ids`` (``study_id``, ``params``,
    ``results``), or None."""
    if len(run_ids) < 2 or "studies" not in cat.tables():
        return None
    rows = cat.rows("SELECT study_id, params FROM studies WHERE kind = 'scaling' AND "
                    "list_has_all(run_ids, ?) ORDER BY created_at DESC LIMIT 1", [run_ids])
    if not rows:
        return None
    import json

    sid = rows[0]["study_id"]
    params = rows[0]["params"]
    res = {r["key"]: r["value"] for r in cat.rows(
        "SELECT key, value FROM study_results WHERE study_id = ?", [sid])}
    return {"study_id": sid, "params": json.loads(params) if isinstance(params, str) else params,
            "results": res}


# --- figures (pages only) ---------------------------------------------------------------------
def _arr(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def profile_figures(d: dict, per_head: dict[str, list]) -> list[tuple[str, str]]:
    """``(caption, svg)`` of each per-layer profile the run has (the reports' layer_curve):
    one dot per head (``per_head[metric]``, [layer][head]), the layer mean as a line."""
    from attnbase.reports.figures import Band, Ref, layer_curve

    out = []
    run = d["run"]
    t1 = d["table1"] or {}
    for metric, label in PROFILES:
        if metric not in d["profiles"] or metric not in per_head:
            continue
        bands, refs = [], []
        caption = f"{label}: one dot per head, the line is the layer mean"
        for k, null_model in enumerate(NULL_MODELS):
            nd = d["nulls"].get(f"{metric}/{null_model}")
            if nd:
                bands.append(Band(f"{null_model} null", _arr(nd["mean"]), _arr(nd["sd"]),
                                  ("#2ca02c", "#9467bd")[k]))
        if bands:
            caption += ("; dotted: each null model's mean per layer, shaded ± its sd (averaged "
                        "over the layer's heads; a narrow shade hides behind the line)")
        if metric == N.key_norm_cv and t1.get(N.key_norm_cv_baseline) is not None:
            baseline = METRICS[N.key_norm_cv_baseline].label
            refs.append(Ref(baseline, t1[N.key_norm_cv_baseline]))
            caption += f"; dashed: the {baseline}"
        if metric == N.max_share:
            base = uniform_max_share(run["seq_len"], bool(run["causal"]))
            refs.append(Ref("uniform attention", base))
            caption += (f"; dashed: uniform attention ({'H_T / T' if run['causal'] else '1 / T'}"
                        f" = {fmt(base, style='plain')} at T = {run['seq_len']})")
        values = np.array([[np.nan if v is None else v for v in row] for row in per_head[metric]],
                          dtype=float)
        svg = layer_curve(values, ylabel=metric, title=label, label="layer mean",
                          layer_mean=_arr(d["profiles"][metric]), bands=bands, refs=refs)
        out.append((caption, str(svg)))
    rank = d["layer_metrics"].get(DEPTH_PROFILE)
    if rank:
        ys = _arr([rank.get(str(i)) for i in range(max(map(int, rank)) + 1)])
        title, unit = METRICS[DEPTH_PROFILE].label, METRICS[DEPTH_PROFILE].unit
        svg = layer_curve(ys.reshape(-1, 1), ylabel=f"‖res(H)‖₁,∞ / ‖H‖₁,∞ ({unit})",
                          title=title, label="mean over sequences",
                          xlabel="hidden state (0 = embeddings, l = after layer l)",
                          head_dots=False)
        out.append((f"{title} (layer_metrics {DEPTH_PROFILE}, docs/metrics.md §6): the "
                    "composite-norm ratio of the residual after removing the token mean, per "
                    f"hidden state H0 (embeddings) to H{len(ys) - 1}, mean over sequences",
                    str(svg)))
    return out


def grid_cells(grid: dict) -> list[list[dict]]:
    vals = [v for row in grid["values"] or [] for v in row if v is not None]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    rows = []
    for row in grid["values"] or []:
        cells = []
        for v in row:
            bg = colour(v, lo, hi)
            cells.append({"value": v, "bg": bg, "fg": ink(bg)})
        rows.append(cells)
    return rows


# --- routes ----------------------------------------------------------------------------------
@router.get("/api/runs", tags=["runs"], summary="every run (runs rows + table1 + progress)")
@in_session
def api_runs(request: Request, model: str | None = None, status: str | None = None):
    return api_json(runs_data(catalog(request), model, status))


@router.get("/api/runs/{run}", tags=["runs"], summary="a run, its table1 row and its arrays")
@in_session
def api_run(request: Request, run: str):
    return api_json(run_data(catalog(request), run))


@router.get("/", include_in_schema=False)
@in_session
def index_page(request: Request, model: str | None = None, status: str | None = None):
    cat = catalog(request)
    model, status = model or None, status or None
    all_runs = runs_data(cat)
    shown = runs_data(cat, model, status)
    return page(request, "index.html.j2", runs=shown, model=model, status=status,
                weights_corpus=WEIGHTS_CORPUS, table1_columns=RUN_LIST_COLUMNS,
                models=sorted({r["model"] for r in all_runs}),
                statuses=sorted({r["status"] for r in all_runs}), n_all=len(all_runs))


@router.get("/runs/{run}", include_in_schema=False)
@in_session
def run_page(request: Request, run: str, metric: str | None = None, seq: int = 0):
    cat = catalog(request)
    d = run_data(cat, run)
    grid = grid_data(cat, run, metric or None)
    per_head = {m: grid_data(cat, run, m)["values"] for m, _ in PROFILES if m in d["profiles"]}
    from attnbase.serve.massive import massive_table
    from attnbase.serve.vision import high_norm_table, rollout_image

    weights_only = d["run"].get("corpus") == WEIGHTS_CORPUS
    rollout = None if weights_only else rollout_image(cat, d["run"], seq)
    return page(request, "run.html.j2", d=d, run=d["run"], grid=grid, cells=grid_cells(grid),
                weights_only=weights_only, figures=profile_figures(d, per_head),
                massive=massive_table(d["run"], d["layer_metrics"]),
                high_norm=high_norm_table(d["layer_metrics"]), rollout=rollout, seq=seq)


@router.get("/compare", include_in_schema=False)
@in_session
def compare_page(request: Request, runs: str = Query("", description="run ids, comma-separated")):
    from attnbase.reports.figures import Series, overlay

    cat = catalog(request)
    d = compare_data(cat, compare_ids(runs, cat.settings.max_compare_runs))
    figures = []
    for metric, label in PROFILES:
        series = [Series(r["run_id"], np.arange(r["n_layers"]) / r["n_layers"],
                         _arr(r["profiles"][metric])) for r in d["runs"] if metric in r["profiles"]]
        if series:
            figures.append((f"{label}: layer means, x = layer / n_layers",
                            str(overlay(series, ylabel=metric, title=label))))
    if d["scaling"] is not None:
        from attnbase.reports.sections_compositional import scaling_figure

        s, res = d["scaling"], d["scaling"]["results"]
        SC = S.scaling
        slope, lo, hi = (fmt(res[k], 4, signed=True) for k in (SC.slope, SC.slope_ci_low,
                                                              SC.slope_ci_high))
        figures.append((f"study {s['study_id']}: mean sink mass against parameter count, slope "
                        f"{slope} per decade (95% CI {lo} to {hi}), r = "
                        f"{fmt(res[SC.r], 3, style='fixed')}, p = {fmt(res[SC.p], 3, style='plain')}",
                        scaling_figure(s["params"], res)))
    keys = []
    for r in d["runs"]:
        for k in (r["table1"] or {}):
            if k not in keys and k != "run_id":
                keys.append(k)
    return page(request, "compare.html.j2", d=d, keys=keys, figures=figures)
