"""A weights-only run (``attnbase weights``: the S-D metrics of a model's weights, no
activations) asked for what reads activations: one error that says what the run is and what it
supports, instead of advice to re-extract a run that never had arrays."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbase.contract import WEIGHTS_CORPUS
from attnbase.errors import StatsError

if TYPE_CHECKING:
    from attnbase.warehouse import Database

#: What a weights-only run supports (no ``attnbase study`` reads activations it lacks).
SUPPORTS = ("`attnbase report --run {run}` (routing vs filtering and the spectral cascade of its "
            "S-D metrics, docs/metrics.md §7), its head metrics in `attnbase sql` and on its run "
            "page, and it lends them to the reports of extraction runs of the same model revision")


def is_weights_only(info: dict) -> bool:
    """Whether a ``runs`` row is a weights-only run."""
    return info.get("corpus") == WEIGHTS_CORPUS


def refuse_weights_only(db: Database, run_id: str, what: str) -> None:
    """Raise :class:`StatsError` naming the run as weights only and what it supports when
    ``run_id`` is one; ``what`` is what was asked for (``"study distances"``). Any other run
    (or an unknown one: its own error comes later) passes."""
    try:
        info = db.run_info(run_id)
    except Exception:  # an unknown run: the caller's own lookup names it
        return
    if not is_weights_only(info):
        return
    model = info.get("model") or "MODEL"
    raise StatsError(
        f"run {run_id!r} is weights only (made by `attnbase weights`: no activations), so {what} "
        f"has nothing to read; no study reads a weights-only run. It supports "
        f"{SUPPORTS.format(run=run_id)}. For activations extract a run: "
        f"`attnbase extract --db {db.name} --model {model} --run NEW_RUN`")
