"""Studies after analysis: the pipeline's ``studies = [...]`` key (docs/metrics.md §4-5).

One Prefect task per run runs the listed study kinds in order (``distances`` first: reversal
and clusters read it back from the catalog). Only the kinds that need nothing beyond one run are
offered here; ``entropy`` (two runs) and ``prune`` (a model) stay on the command line.
"""

from __future__ import annotations

from typing import Any

from prefect import task

#: Study kinds a pipeline may list, in the order they run.
PIPELINE_STUDIES: tuple[str, ...] = ("distances", "reversal", "clusters")


@task(name="studies")
def run_studies_task(db_dir: str, run_id: str, kinds: tuple[str, ...],
                     max_rows: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Run ``kinds`` for ``run_id``; returns ``{kind: study_id}``."""
    from attnbase.stats import studies

    out: dict[str, Any] = {}
    for kind in PIPELINE_STUDIES:
        if kind not in kinds:
            continue
        if kind == "distances":
            out[kind] = studies.distances_study(db_dir, run_id, max_rows=max_rows, seed=seed)
        elif kind == "reversal":
            out[kind] = studies.reversal_study(db_dir, run_id, seed=seed)[0]
        else:
            out[kind] = studies.clusters_study(db_dir, run_id, seed=seed)[0]
    return out


def run_studies(db_dir: str, run_ids: list[str], kinds: tuple[str, ...],
                max_rows: int | None, seed: int) -> dict[str, Any]:
    """One studies task per run, in turn (each holds the catalog's write lock while it stores)."""
    return {rid: run_studies_task(db_dir, rid, kinds, max_rows, seed) for rid in run_ids}
