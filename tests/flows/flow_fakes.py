"""In-memory fakes of the stage calls that flows make (see attnbase.flows._stages)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FakePlan:
    run_id: str
    config_hash: str
    n_batches: int
    pending: tuple[int, ...]
    created_at: str = field(default_factory=lambda: uuid.uuid4().hex)  # the run's incarnation


class FakeStages:
    """A resume ledger, a call log and injectable failures.

    ``fail_times[(run_id, batch)] = k`` makes the first k captures of that batch raise.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ledger: dict[str, set[int]] = {}
        self.n_batches: dict[str, int] = {}
        self.captures: Counter = Counter()  # (run_id, batch) -> calls
        self.fail_times: dict[tuple[str, int], int] = {}
        self.finished: list[str] = []
        self.families = ("norms", "geometry", "concentration")
        self.analyzed: list[tuple[str, str]] = []
        self.reports: list[tuple[str, tuple[str, ...]]] = []
        self.report_dirs: list[str | None] = []  # each report's out_dir

    def premark(self, run_id: str, n_batches: int, done: set[int]) -> None:
        self.n_batches[run_id] = n_batches
        self.ledger[run_id] = set(done)

    # --- the seams -------------------------------------------------------------------------
    def prepare_run(self, db_dir, run_id, cfg, overwrite, store=None, wait=False):
        n = -(-cfg.n_seqs // cfg.batch_size)
        with self.lock:
            self.n_batches.setdefault(run_id, n)
            done = self.ledger.setdefault(run_id, set())
            if overwrite:
                done.clear()
            pending = tuple(b for b in range(n) if b not in done)
        return FakePlan(run_id, f"hash-{cfg.model}", n, pending)

    def run_batch(self, db_dir, plan, batch):
        key = (plan.run_id, batch)
        with self.lock:
            self.captures[key] += 1
            k = self.captures[key]
        if k <= self.fail_times.get(key, 0):
            raise RuntimeError(f"injected failure {k} of {key}")
        return {"run_id": plan.run_id, "batch": batch, "files": [], "created_at": None}

    def mark_batches(self, plan, entries):  # the coordinator's ledger write
        with self.lock:
            self.ledger[plan.run_id].update(e["batch"] for e in entries)

    def finish_run(self, db_dir, plan):
        assert self.ledger[plan.run_id] == set(range(plan.n_batches)), "finish before all batches"
        self.finished.append(plan.run_id)

    def analysis_families(self):
        return self.families

    def analyze_family(self, db_dir, run_id, family, draws, seed):
        with self.lock:
            self.analyzed.append((run_id, family))

    def finish_analysis(self, db_dir, run_id):
        with self.lock:
            self.analyzed.append((run_id, "<finish>"))

    def analyze_run(self, db_dir, run_id, draws, seed, wait=False):
        with self.lock:
            self.analyzed.append((run_id, "all"))

    def build_report(self, db_dir, run_id, compare=(), out_dir=None):
        self.reports.append((run_id, tuple(compare)))
        self.report_dirs.append(out_dir)
        return {"html": f"{db_dir}/reports/{run_id}/report.html"}

    def install(self, monkeypatch) -> None:
        from attnbase.flows import _stages

        for name in ("prepare_run", "run_batch", "mark_batches", "finish_run", "analysis_families", "analyze_family",
                     "finish_analysis", "analyze_run", "build_report"):
            monkeypatch.setattr(_stages, name, getattr(self, name))
