"""The ``pipeline`` flow: extract every model x corpus, analyse every run, then write the report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from attnbase.flows import tasks
from attnbase.flows.analyze import analyze_runs
from attnbase.flows.config import load_pipeline_config, parse_pipeline_text, pipeline_database
from attnbase.flows.extract import extract_runs
from attnbase.flows.runners import make_task_runner


@flow(name="attnbase-pipeline")
def pipeline_flow(config: str, db: str | None = None, toml: str | None = None,
                  wait: bool = False) -> dict[str, Any]:
    """Run the pipeline described by the TOML file ``config`` (``db`` overrides its ``db`` key).

    ``toml``: the file's text, sent along by ``attnbase flow submit`` (``config`` then only
    names it in messages), so a worker on another machine needs no copy of the file.
    ``wait``: a run another process is writing is waited for (its lease) and then resumed or
    found complete, instead of refused (the work pool's runs: each is written once).

    Stages are barriers: all shards extract in parallel on the configured task runner, then all
    (run, family) analyses, then one report (a comparison report when there is more than one
    run: the first run against the others) in ``report_dir``, else where ``attnbase report``
    writes without ``--out`` (the database's reports directory). Returns what ran and how long
    each stage took.
    """
    cfg = parse_pipeline_text(toml, config) if toml is not None else load_pipeline_config(config)
    db_dir = pipeline_database(cfg, db)
    shards = cfg.shards()
    run_ids = [rid for rid, _ in shards]
    timings: dict[str, float] = {}
    t = time.perf_counter()
    with make_task_runner(cfg.task_runner, cfg.workers, cfg.dask_address) as runner:
        extracted = extract_runs(runner, db_dir, shards, cfg.overwrite, cfg.store or None, wait)
        timings["extract_s"] = round(time.perf_counter() - t, 2)
        analyzed = {}
        if cfg.analyze:
            t = time.perf_counter()
            analyzed = analyze_runs(runner, db_dir, run_ids, cfg.draws, cfg.seed,
                                    fan_out=cfg.task_runner == "dask", wait=wait)
            timings["analyze_s"] = round(time.perf_counter() - t, 2)
        studied = {}
        if cfg.studies:
            from attnbase.flows.studies import run_studies

            t = time.perf_counter()
            studied = run_studies(db_dir, run_ids, cfg.studies, cfg.study_max_rows or None,
                                  cfg.seed, cfg.device)
            timings["studies_s"] = round(time.perf_counter() - t, 2)
    report = None
    if cfg.report:
        t = time.perf_counter()
        report = tasks.build_report_task(db_dir, run_ids[0], tuple(run_ids[1:]),
                                         cfg.report_dir or None)
        timings["report_s"] = round(time.perf_counter() - t, 2)
    get_run_logger().info("pipeline %s: runs %s, %s", cfg.source, run_ids, timings)
    return {"db": db_dir, "runs": run_ids, "extract": extracted, "analyze": analyzed, "studies": studied,
            "report": _jsonable(report), "timings": timings, "task_runner": cfg.task_runner}


def _jsonable(x: Any) -> Any:
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "__dict__"):
        return {k: _jsonable(v) for k, v in vars(x).items() if not k.startswith("_")}
    return str(x)


def run_pipeline(config: str | Path, db: str | None = None) -> dict[str, Any]:
    """Validate ``config`` and the database first (one-line errors without starting Prefect),
    then run the flow."""
    pipeline_database(load_pipeline_config(config), db)
    return pipeline_flow(config=str(Path(config).resolve()), db=db)
