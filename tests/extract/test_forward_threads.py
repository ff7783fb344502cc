"""A run's forward thread settings: recorded when it is registered, applied wherever its batches
are computed, and held through each forward (numba's OpenMP kernel changed them mid-forward)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from attnbase.extract import threads
from attnbase.extract.config import ExtractConfig
from attnbase.warehouse import Database

CFG = ExtractConfig(model="tiny-gpt2", n_seqs=4, seq_len=16, batch_size=2, device="cpu")


def observed_threads(lm, body):
    """``(body(), [torch's thread count as each leaf module of lm's forward starts])``."""
    seen: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append(torch.get_num_threads()))
             for m in lm.model.modules() if not list(m.children())]
    try:
        return body(), seen
    finally:
        for h in hooks:
            h.remove()


def in_thread(fn, *args):
    """``fn(*args)`` on a fresh thread (torch's OpenMP thread count is per thread)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


def _with_threads(n: int, fn, *args):
    torch.set_num_threads(n)
    return fn(*args)


def test_batches_run_under_the_recorded_threads(tmp_path):
    """Registered from a thread of 1 torch thread, the run records 1; its batches, computed
    on a thread of 2 (another process, a resume), run every module of every layer at 1.
    Before: no record, and numba's kernel after layer 0 left the thread at numba's count."""
    from attnbase import runner

    plan = in_thread(_with_threads, 1, runner.prepare_run, Database(tmp_path), "thr", CFG)
    assert plan.threads == {"torch_threads": 1,
                            "float32_matmul_precision": torch.get_float32_matmul_precision()}
    row = Database(tmp_path).find_run("thr")
    assert json.loads(row["config"])[threads.KEY] == plan.threads  # in the run's config
    lm, _, _ = runner._loaded_with_lock(CFG)
    for batch in (0, 1):
        _, seen = in_thread(lambda b=batch: observed_threads(
            lm, lambda: _with_threads(2, runner.run_batch, plan, b)))
        assert seen and set(seen) == {1}, seen
    # control: a plan without recorded settings leaves the thread's own count (2) in place
    bare = type(plan)(plan.writer, plan.cfg, None)
    _, seen = in_thread(lambda: observed_threads(
        lm, lambda: _with_threads(2, runner.run_batch, bare, 0)))
    assert set(seen) == {2}, seen


def test_resumed_run_uses_the_recorded_threads(tmp_path):
    """A run registered at 1 thread and resumed by ``extract_run`` (the CLI) on a thread of 2
    computes its pending batches at 1."""
    from attnbase import runner

    plan = in_thread(_with_threads, 1, runner.prepare_run, Database(tmp_path), "res", CFG)
    plan.writer.release()  # as a process that died would leave it: nothing written
    seen: list[int] = []

    def resume():
        torch.set_num_threads(2)
        real = runner._loaded

        def loaded(cfg):
            lm2, win = real(cfg)
            for m in lm2.model.modules():
                if not list(m.children()):
                    m.register_forward_pre_hook(
                        lambda mod, args: seen.append(torch.get_num_threads()))
            return lm2, win

        runner._loaded = loaded
        try:
            return runner.extract_run(Database(tmp_path), "res", CFG, progress=False)
        finally:
            runner._loaded = real

    assert in_thread(resume).status == "complete"
    assert seen and set(seen) == {1}, seen


#: A fresh process started as Dask starts its workers (OMP_NUM_THREADS=1) runs the row kernel
#: once and prints torch's thread count before and after.
FIRST_KERNEL = """import torch
from attnbase.extract.recorder import _row_col_stats
before = torch.get_num_threads()
_row_col_stats(torch.zeros(1, 2, 8, 8))
print(before, torch.get_num_threads())"""


def test_numba_kernel_leaves_torch_threads_alone():
    """The row-statistics kernel (numba, OpenMP) runs inside each layer's attention; its first
    call in a process set the thread's OpenMP count to numba's (1 -> 2 here, before: layer 0 of
    a Dask worker's first batch ran at 1 thread, the rest at 2). Now the count is kept."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", FIRST_KERNEL], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"], out.stdout


def test_thread_count_changes_float_results():
    """Negative control: on this machine torch's thread count changes a float32 sum's rounding
    (4,000,000 normals: -1431.0266 at 1 thread, -1431.0264 at 2), the kind of difference a run's
    bytes must not depend on. (MiniLM's forward gave identical keys at 1, 2, 3, 4 and 8 threads
    here: its matmuls were split alike; the issue's 6.7e-6 came from another machine.)"""
    x = torch.randn(4_000_000, generator=torch.Generator().manual_seed(0))

    def total(n):
        torch.set_num_threads(n)
        return x.sum().item()

    one, two = in_thread(total, 1), in_thread(total, 2)
    assert one != two
    assert in_thread(total, 2) == two and in_thread(total, 1) == one  # each deterministic


def test_apply_and_recorded():
    assert threads.recorded(None) is None and threads.recorded({"config": "{}"}) is None
    assert threads.recorded({"config": json.dumps({threads.KEY: {"torch_threads": 3}})}) == {
        "torch_threads": 3}

    def body():
        threads.apply({"torch_threads": 1, "float32_matmul_precision": "highest"})
        return threads.current()

    assert in_thread(body) == {"torch_threads": 1, "float32_matmul_precision": "highest"}
    assert np.isfinite(torch.get_num_threads())
