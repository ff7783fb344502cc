"""Every study kind by name: what ``attnbase study <kind>`` offers and a pipeline's ``studies =
[...]`` key may list, each run here with the command's defaults.

Kinds over one run run in :data:`RUN_KINDS` order: ``distances`` first, since ``reversal``,
``clusters`` and ``prune`` read the run's latest distances study back from the catalog. Kinds
over several runs (:data:`GROUP_KINDS`) run once, over every run of the pipeline, after them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbase.errors import StatsError

if TYPE_CHECKING:
    from attnbase.warehouse import Database

#: Kinds over one run, in the order they run.
RUN_KINDS: tuple[str, ...] = ("distances", "reversal", "clusters", "paths", "r-conventions",
                              "entropy", "prune")
#: Kinds over several runs.
GROUP_KINDS: tuple[str, ...] = ("scaling",)
#: Every kind, by the name of its ``attnbase study`` command.
KINDS: tuple[str, ...] = RUN_KINDS + GROUP_KINDS
#: The ``studies.kind`` each kind stores (:data:`attnbase.metrics.STUDY_KINDS`).
STORED_KIND: dict[str, str] = {k: {"entropy": "entropy_change",
                                   "r-conventions": "r_conventions"}.get(k, k) for k in KINDS}
#: The fewest runs a group kind compares.
GROUP_MIN_RUNS = {"scaling": 3}
#: Arrays a kind reads that a run has only when its extraction captured them (``capture``).
CAPTURE_NEEDED: dict[str, tuple[str, ...]] = {"paths": ("logits",), "r-conventions": ("keys",)}
#: The two layers of a run whose entropy change the ``entropy`` kind splits (MiniLM's [CLS]
#: sink forms between layers 0 and 1).
ENTROPY_LAYERS: tuple[int, int] = (0, 1)


def _unknown(kind: str, kinds: tuple[str, ...]) -> StatsError:
    return StatsError(f"unknown study {kind!r}; choose from {', '.join(kinds)}")


def run_study(kind: str, db: Database, run_id: str, *, seed: int = 0, max_rows: int | None = None,
              device: str = "cpu") -> str:
    """Run the one-run study ``kind`` on ``run_id``; returns its ``study_id``. ``max_rows``
    subsamples the distances' row set; ``device`` is where ``prune`` runs the run's model."""
    from attnbase.stats import studies

    if kind == "distances":
        return studies.distances_study(db, run_id, max_rows=max_rows, seed=seed)
    if kind == "reversal":
        return studies.reversal_study(db, run_id, seed=seed)[0]
    if kind == "clusters":
        return studies.clusters_study(db, run_id, seed=seed)[0]
    if kind == "paths":
        from attnbase.studies.paths import paths_study

        return paths_study(db, run_id, seed=seed)[0]
    if kind == "r-conventions":
        from attnbase.stats.r_conventions import r_conventions_study

        return r_conventions_study(db, run_id, seed=seed)[0]
    if kind == "entropy":
        from attnbase.stats.entropy_study import entropy_study

        return entropy_study(db, run=run_id, layers=ENTROPY_LAYERS)[0]
    if kind == "prune":
        from attnbase.studies.prune import prune_study

        return prune_study(db, run_id, None, device=device)[0]
    raise _unknown(kind, RUN_KINDS)


def run_group_study(kind: str, db: Database, run_ids: list[str]) -> str:
    """Run the study ``kind`` over ``run_ids`` together; returns its ``study_id``."""
    if kind == "scaling":
        from attnbase.stats.scaling import scaling_study

        return scaling_study(db, list(run_ids))[0]
    raise _unknown(kind, GROUP_KINDS)
