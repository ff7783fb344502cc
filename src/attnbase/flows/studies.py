"""Studies after analysis: the pipeline's ``studies = [...]`` key (docs/metrics.md §4-6).

Every kind ``attnbase study`` offers (:mod:`attnbase.studies.kinds`). One Prefect task per run
runs the listed one-run kinds in order (``distances`` first: reversal, clusters and prune read it
back from the catalog; prune masks the run's own model on the pipeline's ``device``); then one
task runs the listed kinds over every run of the pipeline (``scaling``).
"""

from __future__ import annotations

from typing import Any

from prefect import task

from attnbase.flows._stages import open_db
from attnbase.studies.kinds import GROUP_KINDS, KINDS, RUN_KINDS, run_group_study, run_study

#: Study kinds a pipeline may list.
PIPELINE_STUDIES: tuple[str, ...] = KINDS


@task(name="studies")
def run_studies_task(db_dir: str, run_id: str, kinds: tuple[str, ...],
                     max_rows: int | None = None, seed: int = 0,
                     device: str = "cpu") -> dict[str, Any]:
    """Run the one-run kinds of ``kinds`` for ``run_id``; returns ``{kind: study_id}``."""
    db = open_db(db_dir)
    return {kind: run_study(kind, db, run_id, seed=seed, max_rows=max_rows, device=device)
            for kind in RUN_KINDS if kind in kinds}


@task(name="group-studies")
def run_group_studies_task(db_dir: str, run_ids: tuple[str, ...],
                           kinds: tuple[str, ...]) -> dict[str, Any]:
    """Run the kinds of ``kinds`` that compare runs over ``run_ids``; ``{kind: study_id}``."""
    return {kind: run_group_study(kind, open_db(db_dir), list(run_ids))
            for kind in GROUP_KINDS if kind in kinds}


def run_studies(db_dir: str, run_ids: list[str], kinds: tuple[str, ...],
                max_rows: int | None, seed: int, device: str = "cpu") -> dict[str, Any]:
    """One studies task per run, in turn (each holds the catalog's write lock while it stores),
    then the group kinds under the key ``run+run+...``."""
    out = {rid: run_studies_task(db_dir, rid, kinds, max_rows, seed, device) for rid in run_ids}
    if any(k in GROUP_KINDS for k in kinds):
        out["+".join(run_ids)] = run_group_studies_task(db_dir, tuple(run_ids), kinds)
    return out
