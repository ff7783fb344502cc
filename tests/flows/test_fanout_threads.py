"""A run fanned out over a real Dask ``LocalCluster`` (2 worker processes, one thread each, as
``task_runner = "dask"`` starts it) is byte-identical to the same run in one process, every
forward in the workers running under the thread settings the run recorded."""

from __future__ import annotations

import numpy as np
import pytest

from attnbase.extract.config import ExtractConfig
from attnbase.warehouse import Database

CFG = ExtractConfig(model="tiny-gpt2", n_seqs=8, seq_len=32, batch_size=2, device="cpu")


@pytest.mark.slow
def test_dask_fanout_is_bit_identical_to_one_process(tmp_path):
    """~30-60 s on 2 shared cores (each worker imports torch and loads the model). Before:
    no settings were recorded, a worker started at OMP_NUM_THREADS=1 (Dask's default) and
    numba's first kernel moved it to numba's count after layer 0 of its first batch."""
    import attnbase
    from dask.distributed import Client, LocalCluster

    from attnbase import runner

    runner.extract_run(Database(tmp_path / "one"), "r", CFG, progress=False)
    plan = runner.prepare_run(Database(tmp_path / "fan"), "r", CFG)
    assert plan.threads and plan.threads["torch_threads"] >= 1

    def batch_on_worker(plan, b):
        """One batch on a worker, with torch's thread count seen as each module starts."""
        import os

        import torch

        from attnbase import runner

        lm, _, _ = runner._loaded_with_lock(plan.cfg)
        seen = []
        hooks = [m.register_forward_pre_hook(
            lambda mod, args: seen.append(torch.get_num_threads()))
            for m in lm.model.modules() if not list(m.children())]
        try:
            entry = runner.run_batch_unledgered(plan, b)
        finally:
            for h in hooks:
                h.remove()
        return entry, sorted(set(seen)), os.getpid(), os.environ.get("OMP_NUM_THREADS")

    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        done = client.gather([client.submit(batch_on_worker, plan, b, pure=False)
                              for b in plan.pending])
    plan.writer.mark_batches([entry for entry, *_ in done])
    runner.finish_run(plan)
    assert {omp for *_, omp in done} == {"1"}  # the workers started as Dask starts them
    assert all(seen == [plan.threads["torch_threads"]] for _, seen, _, _ in done), done
    one, fan = attnbase.open_run(tmp_path / "one", "r"), attnbase.open_run(tmp_path / "fan", "r")
    for name in one.data_vars:
        assert np.array_equal(one[name].values, fan[name].values, equal_nan=True), name
    # control: the comparison sees a change of one ulp in one element of the keys
    keys = fan["keys"].values.copy()
    keys.flat[100] = np.nextafter(keys.flat[100], np.inf)
    assert not np.array_equal(one["keys"].values, keys)
