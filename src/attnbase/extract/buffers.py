"""Where a batch's captured arrays live: reused buffers (:class:`Buffers`, the runner) or a new
array per batch (:class:`Fresh`); on a GPU, pinned host memory the side stream copies into
(extract/recorder.py)."""

from __future__ import annotations

import torch


class Buffers:
    """Output arrays reused from batch to batch (``capture_batches(..., reuse_buffers=True)``).

    A batch's stacked arrays are 100-200 MB for a GPT-2-small batch of 8; allocated afresh each
    batch they come from ``mmap`` (above glibc's mmap threshold) and every page of them is faulted
    in and zeroed again (benchmarks/RESULTS.md: "output arrays reused"). Reused, they are touched once
    per run, and the process's memory does not depend on how the allocator placed them."""

    def __init__(self, slots: int = 1) -> None:
        #: ``slots`` sets used in turn, batch by batch: with 2, a batch's arrays stay valid
        #: while the next one is captured (a writer staging them in the background)
        self._sets: list[dict[str, torch.Tensor]] = [{} for _ in range(max(1, slots))]
        self._held = self._sets[0]
        self._turn = 0

    def next_batch(self) -> None:
        self._turn = (self._turn + 1) % len(self._sets)
        self._held = self._sets[self._turn]

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device | str = "cpu", pin: bool = False) -> torch.Tensor:
        t = self._held.get(name)
        if (t is None or tuple(t.shape) != tuple(shape) or t.dtype != dtype
                or t.device != torch.device(device)):
            self._held.pop(name, None)  # the last, shorter batch: the old one is freed first
            t = torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)
            self._held[name] = t
        return t


class Fresh:
    """A new array per batch (the default: every yielded batch stays valid)."""

    @staticmethod
    def get(name: str, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device | str = "cpu", pin: bool = False) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)

    @staticmethod
    def next_batch() -> None:
        pass
