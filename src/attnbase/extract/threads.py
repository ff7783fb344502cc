"""The settings of a process that change a forward pass's float results, recorded with a run
and applied wherever its batches are computed.

A run's bytes must not depend on how it was computed (one process, a resume, Dask workers).
On the CPU torch's intra-op thread count is per thread and per process: Dask's worker
processes start with ``OMP_NUM_THREADS=1``, and numba's OpenMP kernel (the row statistics,
:mod:`attnbase.extract.rowkernel`) sets the calling thread's OpenMP thread count to numba's own
when it runs, so without care a forward changed its thread count after its first layer. The
thread count picks how a matrix product is split, which can change its rounding (a fan-out's
keys then differ from one process's from layer 1 on).

:func:`current` is recorded in the run's config under :data:`KEY` (provenance, outside the
config hash) when the run is registered; :func:`apply` sets it in the thread that computes a
batch, before each batch (the runner); :func:`kept` holds it across a numba kernel call.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

#: The run config's field (provenance) holding the settings.
KEY = "forward_threads"


def current() -> dict:
    """This thread's settings: torch's intra-op threads and its float32 matmul precision."""
    import torch

    return {"torch_threads": int(torch.get_num_threads()),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def apply(settings: dict | None) -> None:
    """Set ``settings`` (:func:`current`'s form) in this thread; None: leave them."""
    if not settings:
        return
    import torch

    n = int(settings["torch_threads"])
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    precision = settings.get("float32_matmul_precision")
    if precision and torch.get_float32_matmul_precision() != precision:
        torch.set_float32_matmul_precision(precision)


@contextmanager
def kept():
    """Run the body (a numba kernel) and give torch its thread count back afterwards."""
    import torch

    n = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)


def recorded(run_row: dict | None) -> dict | None:
    """The settings a run's ``runs`` row recorded (None for a run registered before they were)."""
    if not run_row or not run_row.get("config"):
        return None
    config = run_row["config"]
    config = json.loads(config) if isinstance(config, str) else config
    return config.get(KEY)
