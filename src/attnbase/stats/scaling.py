"""``study scaling``: sink mass against parameter count across runs (docs/metrics.md §5, "Scaling").

Papamichalis & Ruane (2026, "Attention Rows as Compositional Data") report a scaling law of the
sink mass with model size. Per run: its parameter count ``n_params`` (every parameter of the
loaded model, counted at extraction and recorded in ``runs.n_params``) and its mean sink mass
(``row_stats.sink_mass`` averaged over every row of every head and sequence; the run's sink set,
docs/metrics.md "Sink sets"); beside them, where the run was analysed, the mean ``max_share`` over
its heads and its model figure ``key_norm_cv`` (``run_metrics``). The fit is ordinary least
squares of each statistic on ``log10(n_params)`` (:func:`scipy.stats.linregress`): slope with a
95% CI from the t distribution on ``n - 2`` degrees of freedom, Pearson r and its two-sided p.

``study_results`` keys: ``n_params/<run>``, ``sink_mass/<run>``, ``max_share/<run>``,
``key_norm_cv/<run>`` (the last two where analysed), ``slope``, ``intercept``, ``slope_ci_low``,
``slope_ci_high``, ``r``, ``p``, ``n_runs`` (the sink-mass fit), and the same fit keys suffixed
``/max_share`` and ``/key_norm_cv`` where every run has the statistic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from attnbase.errors import StatsError
from attnbase.formatting import fmt, fmt_p
from attnbase.metrics import N, S
from attnbase.stats.weights_only import refuse_weights_only

if TYPE_CHECKING:
    from attnbase.warehouse import Database

#: The study's keys (attnbase/metrics.py).
K = S.scaling
#: The per-run statistics the study reads, in the order it fits them.
STATISTICS = (K.sink_mass, K.max_share, K.key_norm_cv)
#: The keys of one fit, in order.
FIT_KEYS = (K.slope, K.intercept, K.slope_ci_low, K.slope_ci_high, K.r, K.p)


@dataclass(frozen=True)
class Fit:
    """OLS of ``y`` on ``x``: slope, intercept, the slope's 95% CI, Pearson r, two-sided p."""

    slope: float
    intercept: float
    slope_ci_low: float
    slope_ci_high: float
    r: float
    p: float
    n: int

    def results(self, suffix: str = "") -> dict[str, float]:
        return {f"{k}{suffix}": float(getattr(self, k)) for k in FIT_KEYS}


def log_fit(n_params, y, level: float = 0.95) -> Fit:
    """Fit ``y`` on ``log10(n_params)`` by least squares (:func:`scipy.stats.linregress`).

    The CI is ``slope +- t_{(1+level)/2, n-2} * stderr``; needs >= 3 points of >= 2 distinct sizes.

    Examples
    --------
    Three sizes on an exact line (slope 0.1 per decade):

    >>> f = log_fit([1e6, 1e7, 1e8], [0.2, 0.3, 0.4])
    >>> round(f.slope, 12), round(f.r, 12), f.slope_ci_low == f.slope_ci_high
    (0.1, 1.0, True)
    """
    from scipy import stats

    x = np.log10(np.asarray(n_params, dtype=np.float64))
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 3:
        raise StatsError(f"a scaling fit needs >= 3 runs (a slope's CI needs n - 2 >= 1 "
                         f"degrees of freedom); got {len(x)}")
    if np.unique(x).size < 2:
        raise StatsError("every run has the same parameter count; a scaling fit needs runs of "
                         "different sizes")
    res = stats.linregress(x, y)
    half = float(stats.t.ppf((1 + level) / 2, len(x) - 2)) * float(res.stderr)
    return Fit(float(res.slope), float(res.intercept), float(res.slope) - half,
               float(res.slope) + half, float(res.rvalue), float(res.pvalue), len(x))


def run_points(db: Database, run_ids: list[str]) -> dict[str, dict[str, float]]:
    """``{run: {n_params, sink_mass, max_share?, key_norm_cv?}}`` from the catalog."""
    out: dict[str, dict[str, float]] = {}
    with db.connect(read_only=True) as con:
        for run in run_ids:
            info = db.run_info(run)
            if info.get("n_params") is None:
                raise StatsError(f"run {run!r} has no parameter count (runs.n_params; registered "
                                 "before it was recorded); re-extract it with --overwrite")
            if info["status"] != "complete":
                raise StatsError(f"run {run!r} is {info['status']!r}, not complete; finish it "
                                 f"first (`attnbase extract ... --run {run}`)")
            sink = con.execute("SELECT avg(sink_mass) FROM row_stats WHERE run_id = ?",
                               [run]).fetchone()[0]
            if sink is None:
                raise StatsError(f"run {run!r} has no row_stats; re-extract it with --overwrite")
            point = {K.n_params: float(info["n_params"]), K.sink_mass: float(sink)}
            share = con.execute("SELECT avg(value) FROM head_metrics WHERE run_id = ? AND "
                                "metric = ?", [run, N.max_share]).fetchone()[0]
            cv = con.execute("SELECT avg(value) FROM run_metrics WHERE run_id = ? AND "
                             "metric = ?", [run, N.key_norm_cv]).fetchone()[0]
            if share is not None:
                point[K.max_share] = float(share)
            if cv is not None:
                point[K.key_norm_cv] = float(cv)
            out[run] = point
    return out


def scaling_study(db: Database, run_ids: list[str]) -> tuple[str, dict[str, float]]:
    """Fit each run's statistics on log10 of its parameter count and store the study;
    returns ``(study_id, study_results)``."""
    from attnbase.stats.studies import write_study

    if len(set(run_ids)) != len(run_ids):
        raise StatsError(f"--runs lists a run twice: {', '.join(run_ids)}")
    for rid in run_ids:
        refuse_weights_only(db, rid, "`attnbase study scaling`")
    points = run_points(db, run_ids)
    results: dict[str, float] = {K.n_runs: float(len(run_ids))}
    for run, pt in points.items():
        for k, v in pt.items():
            results[k(run)] = v
    n = [points[r][K.n_params] for r in run_ids]
    results.update(log_fit(n, [points[r][K.sink_mass] for r in run_ids]).results())
    for stat in STATISTICS[1:]:
        if all(stat in points[r] for r in run_ids):
            results.update(log_fit(n, [points[r][stat] for r in run_ids]).results(f"/{stat}"))
    infos = [db.run_info(r) for r in run_ids]
    params = {"runs": run_ids, "x": "log10(n_params)", "fit": "OLS (scipy.stats.linregress)",
              "ci": "95% t on n - 2 df", "families": sorted({i["family"] for i in infos}),
              "corpora": sorted({str(i["corpus"]) for i in infos})}
    return write_study(db, "scaling", run_ids, params, results), results


def fit_line(results: dict[str, float], xs) -> np.ndarray:
    """The fitted sink mass at parameter counts ``xs`` (for figures)."""
    return results[K.intercept] + results[K.slope] * np.log10(np.asarray(xs, dtype=np.float64))


def describe(results: dict[str, float]) -> str:
    """One line: the sink-mass slope per decade with its CI, r and p."""
    slope, lo, hi = (fmt(results[k], 4, signed=True) for k in (K.slope, K.slope_ci_low,
                                                                K.slope_ci_high))
    return (f"sink mass per decade of parameters: {slope} (95% CI {lo} to {hi}), "
            f"r = {fmt(results[K.r], 3, style='fixed')}, p = {fmt_p(results[K.p])}")
