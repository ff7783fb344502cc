"""The runner: the one loop that feeds captured batches into a run writer.

It sits above both stages it joins (docs/architecture.md): :mod:`attnbase.extract` produces
:class:`~attnbase.contract.CapturedBatch` es from a model, :class:`attnbase.warehouse.runs.writer.RunWriter`
makes them durable, and neither imports the other. The CLI (``attnbase extract``) calls
:func:`extract_run`; the flows call :func:`prepare_run` / :func:`run_batch` / :func:`finish_run`,
which are the same steps cut at batch boundaries. Tests and benchmarks drive
:func:`ingest_batches` with any batch source.

Retries: none here. A catalog held by another process is waited for inside the warehouse
(:meth:`attnbase.warehouse.catalog.duckdb_file.DuckDBFileBackend.open`, the one retry policy);
every other error, a run-config conflict included, propagates at once.

Ctrl-C: the batch being committed is finished (its ledger row stays consistent; a batch still being
staged is not counted and is rewritten on resume), the run is marked
``interrupted`` and :class:`~attnbase.errors.ExtractInterrupted` says
``interrupted after k/n batches; run the same command to resume`` (the CLI exits 130).
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from attnbase.contract import CapturedBatch, ModelInfo
from attnbase.errors import ExtractInterrupted, WarehouseError
from attnbase.warehouse.database import Database, RunRecord
from attnbase.warehouse.runs.writer import RunWriter, check_run_id

if TYPE_CHECKING:
    from attnbase.extract.config import ExtractConfig

BatchSource = Callable[[int], Iterable[CapturedBatch]]

#: Seconds between ledger marks of a streamed run (``RunWriter.commit(..., ledger_every=)``):
#: batches made durable meanwhile are counted in one catalog transaction (the first one at once),
#: and a crash rewrites at most this much work on resume. Ctrl-C, an error and the end of the
#: run count them at once.
LEDGER_EVERY_S = 10.0


# --- one call: the CLI --------------------------------------------------------------------------
def extract_run(db: Database, run_id: str, cfg: "ExtractConfig",
                overwrite: bool = False, progress: bool = True,
                store: str | None = None, wait: bool = False) -> RunRecord:
    """Extract ``cfg`` into run ``run_id`` of ``db``; resumable, idempotent.

    Loads the model and corpus windows first, so that model and corpus errors happen before any
    directory or catalog row exists; then opens the run (register or resume) and writes every
    pending batch. A complete run with the same configuration is not recomputed; a run of the
    same name with a different configuration raises :class:`RunConfigConflictError` unless
    ``overwrite``. ``store``: an ``s3://bucket/prefix`` root for the run's bytes
    (:meth:`RunWriter.open`). ``wait``: wait for another process writing the run instead of
    refusing (its lease, :mod:`attnbase.warehouse.catalog.lease`).
    """
    check_run_id(run_id)
    writer_threads(False)  # a malformed ATTNBASE_WRITER_THREADS fails before anything loads
    if store is not None:
        from attnbase.warehouse.runs.location import check_store_url

        check_store_url(store)  # a bad URL or endpoint fails before the model loads
    from attnbase.extract import rowkernel

    # the row-statistics kernel loads (numba import + cached machine code) while the model does;
    # a run on a GPU never calls it (statistics stay on the device), so it does not wait for it
    warm = None
    if not cfg.device.startswith("cuda"):
        warm = threading.Thread(target=rowkernel.warm, name="attnbase-warm", daemon=True)
        warm.start()
    lm, win = _loaded(cfg)
    if warm is not None:
        warm.join()
    from attnbase import extract as ex

    ahead = stage_ahead(lm.device)

    def batches(start: int) -> Iterable[CapturedBatch]:
        # each batch is staged (written out) before the next is requested: one set of buffers;
        # staged in the background (a GPU box), two sets used in turn
        return ex.capture_batches(lm, win.tokens, batch_size=cfg.batch_size, capture=cfg.capture,
                                  start_batch=start, reuse_buffers=IN_FLIGHT if ahead else True,
                                  store_dtype=cfg.store_dtype, pixels=win.pixels)

    return ingest_batches(db, run_id, cfg, info=lm.info, corpus=win.corpus,
                          corpus_hash=win.corpus_hash, batches=batches, overwrite=overwrite,
                          wait=wait,
                          progress=progress, provenance={**ex.run_provenance(lm), **(win.read or {})},
                          stage_ahead=ahead,
                          store=store, windows=win)


def _window_facts(win) -> dict:
    """``seq_len`` and ``sources`` of image windows for :meth:`ExtractConfig.run_spec`."""
    if win is None or getattr(win, "pixels", None) is None:
        return {}
    return {"seq_len": int(win.tokens.shape[1]), "sources": win.sources}


#: ``ATTNBASE_STAGE_AHEAD=1`` stages batches in the background on the CPU too (tests, benches).
STAGE_AHEAD_ENV = "ATTNBASE_STAGE_AHEAD"


def stage_ahead(device: str) -> bool:
    """Whether batch ``k`` is staged in a writer thread while batch ``k + 1`` is captured: on a
    GPU (the forward leaves the cores idle), not on a CPU-only box, where a writer busy during
    a forward slows it more than its own CPU (see :func:`_feed_loop`)."""
    import os

    return str(device).startswith("cuda") or os.environ.get(STAGE_AHEAD_ENV) == "1"


#: ``ATTNBASE_WRITER_THREADS=N`` sizes the writer pool by hand (benches, a shared machine).
WRITER_THREADS_ENV = "ATTNBASE_WRITER_THREADS"
#: The most threads the writer pool takes: a batch writes one chunk per layer of each array at
#: once (12-36 layers in the models served), and the fsync pool stops at 16 too (store.py).
MAX_WRITER_THREADS = 16
#: Batches between capture and commit at once: the one being captured and the one being
#: staged (the source keeps as many buffer sets, ``reuse_buffers=IN_FLIGHT``); a third, being
#: committed, holds no buffers.
IN_FLIGHT = 2


def usable_cores() -> int:
    """The cores this process may run on (the affinity mask: a container's or ``taskset``'s
    share, not the machine's count)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this platform
        return os.cpu_count() or 1


def writer_threads(ahead: bool, cores: int | None = None) -> int:
    """How many threads encode and write a batch's chunks (the writer pool's size).

    The rule: staged between forwards (a CPU box, ``ahead`` False: the forward owns every core
    and staging waits for it), :data:`~attnbase.warehouse.runs.store.CHUNK_THREADS` (2); staged
    beside the forward (a GPU box), every usable core but one (left to the thread that drives
    the device and the commit), at least ``CHUNK_THREADS``, at most :data:`MAX_WRITER_THREADS`.
    So a 2-core box gets 2 either way and a 16-core GPU box 15. ``ATTNBASE_WRITER_THREADS``
    overrides it."""
    import os

    from attnbase.warehouse.runs.store import CHUNK_THREADS

    forced = os.environ.get(WRITER_THREADS_ENV, "").strip()
    if forced:
        if not forced.isdigit() or int(forced) < 1:
            raise WarehouseError(f"{WRITER_THREADS_ENV}={forced!r} is not a thread count; "
                                 "set a whole number >= 1 or unset it")
        return int(forced)
    if not ahead:
        return CHUNK_THREADS
    cores = usable_cores() if cores is None else cores
    return max(CHUNK_THREADS, min(cores - 1, MAX_WRITER_THREADS))


def ingest_batches(db: Database, run_id: str, cfg: "ExtractConfig", *,
                   info: ModelInfo, corpus: str, corpus_hash: str, batches: BatchSource,
                   overwrite: bool = False, progress: bool = True,
                   background_write: bool = True, provenance: dict | None = None,
                   stage_ahead: bool = False, store: str | None = None,
                   wait: bool = False, windows=None) -> RunRecord:
    """Open run ``run_id`` for ``cfg`` and feed it ``batches(start_batch)`` until complete.
    ``windows`` (:class:`~attnbase.extract.corpus.CorpusWindows`): the token count and the
    sources of an image corpus's windows, which the config leaves to the model.

    ``batches(start)`` yields CapturedBatches from batch ``start`` on (a model's capture, or a
    test's synthetic batches). Batch ``k`` is committed (fsync, statistics, ledger) in a
    background thread while batch ``k+1`` is computed (``background_write``; see :func:`_feed_loop`).
    """
    spec = cfg.run_spec(info, corpus=corpus, corpus_hash=corpus_hash, provenance=provenance,
                        **_window_facts(windows))
    writer = RunWriter.open(db, run_id, spec, overwrite=overwrite, store=store, wait=wait)
    if writer.complete:
        n = spec.n_batches
        return RunRecord(run_id, "complete", spec.config_hash, n, n, 0, writer.store_path)
    from attnbase.extract import threads

    # the forwards run in this thread with the settings the run recorded when registered
    threads.apply(threads.recorded(db.find_run(run_id)))
    written = feed(writer, batches, progress=progress, background=background_write,
                   stage_ahead=stage_ahead)
    writer.finish()
    n = spec.n_batches
    return RunRecord(run_id, "complete", spec.config_hash, n, n, written, writer.store_path)


def feed(writer: RunWriter, batches: BatchSource, *, progress: bool = False,
         background: bool = True, stage_ahead: bool = False) -> int:
    """Write every pending batch of ``writer`` from ``batches``; returns how many were written.

    Any error marks the run ``failed`` and propagates; Ctrl-C marks it ``interrupted`` and raises
    :class:`ExtractInterrupted`. Either way every batch the ledger counts is complete.
    """
    todo = list(writer.pending)
    if not todo:
        return 0
    state = {"written": 0, "tokens": 0}
    t0 = time.perf_counter()
    try:
        with _progress_bar(progress) as bar:
            task = bar.add_task(f"extract {writer.run_id}", total=len(todo), tps=0.0)

            def done(cb: CapturedBatch) -> None:
                state["written"] += 1
                state["tokens"] += cb.n_seqs * writer.spec.seq_len
                bar.update(task, advance=1,
                           tps=state["tokens"] / max(time.perf_counter() - t0, 1e-9))

            threads = writer_threads(stage_ahead)
            if stage_ahead:
                _feed_ahead(writer, batches, todo, done, threads)
            else:
                _feed_loop(writer, batches, todo, done, background, threads)
    except KeyboardInterrupt:
        _ignore_sigint()
        writer.mark("interrupted")
        k = sum(writer.ledger().values())
        raise ExtractInterrupted(f"interrupted after {k}/{writer.n_batches} batches; "
                                 "run the same command to resume") from None
    except BaseException:
        writer.mark("failed")
        raise
    return state["written"]


def _feed_loop(writer: RunWriter, batches: BatchSource, todo: list[int],
               done: Callable[[CapturedBatch], None], background: bool, threads: int) -> None:
    """Per batch: stage it (chunks written: checksums, compression, page-cache copies) between
    two forwards, when the model's threads are idle, then commit it (fsync, statistics files,
    ledger) in a background thread while the next batch is computed. A writer thread busy
    during a forward costs more than its own CPU on a machine the forward already fills (the
    forward's threads wait for the descheduled one; benchmarks/RESULTS.md: "writer beside the
    forward"), so only the commit, which mostly waits for the disk, overlaps it."""
    expected = set(todo)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnbase-commit") if background else None
    pending: Future | None = None

    def commit(staged, cb_done: CapturedBatch) -> None:
        writer.commit(staged, ledger_every=LEDGER_EVERY_S)
        done(cb_done)

    try:
        # the batch source calls the "batch_start" / "after_forward" fault points around its
        # forward (extract.capture_batches does), the writer calls the rest
        for cb in batches(todo[0]):
            if cb.batch not in expected:  # already complete (a resume past a gap)
                continue
            if pending is not None:
                pending.result()
                pending = None
            staged = writer.stage(cb, release=True, threads=threads)
            if pool is None:
                commit(staged, cb)
            else:
                pending = pool.submit(commit, staged, cb)
            expected.discard(cb.batch)
        if pending is not None:
            pending.result()
    finally:
        if pool is not None:
            # on Ctrl-C the batch being committed is finished, so its ledger row is consistent
            pool.shutdown(wait=True)
    _check_all_produced(writer, expected)


def _feed_ahead(writer: RunWriter, batches: BatchSource, todo: list[int],
                done: Callable[[CapturedBatch], None], threads: int) -> None:
    """The GPU box's loop, a writer pool beside the forward: batch ``k`` is staged in the stage
    thread, its chunks encoded and written by ``threads`` workers (:func:`writer_threads`),
    while batch ``k + 1`` is captured, and committed (in order, one commit thread: fsyncs in
    their own pool, statistics files, ledger) once staged. The queue is bounded: at most
    :data:`IN_FLIGHT` (2) batches between capture and staged, so the source keeps two sets of
    buffers (``reuse_buffers=2``): batch ``k - 1``'s set is reused for ``k + 1`` only after
    ``k - 1`` is staged, and a forward that outruns the disk waits for it."""
    expected = set(todo)
    stage_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnbase-stage")
    commit_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnbase-commit")
    prev: tuple[Future, CapturedBatch] | None = None
    committing: Future | None = None

    def commit(staged, cb_done: CapturedBatch) -> None:
        writer.commit(staged, ledger_every=LEDGER_EVERY_S)
        done(cb_done)

    def hand_over(item: tuple[Future, CapturedBatch]) -> None:
        nonlocal committing
        staged = item[0].result()  # its buffers are free from here on
        if committing is not None:
            committing.result()
        committing = commit_pool.submit(commit, staged, item[1])

    try:
        for cb in batches(todo[0]):
            if cb.batch not in expected:
                continue
            staging = stage_pool.submit(writer.stage, cb, release=True, threads=threads)
            if prev is not None:
                hand_over(prev)
            prev = (staging, cb)
            expected.discard(cb.batch)
        if prev is not None:
            hand_over(prev)
        if committing is not None:
            committing.result()
    finally:
        stage_pool.shutdown(wait=True)
        commit_pool.shutdown(wait=True)
    _check_all_produced(writer, expected)


def _check_all_produced(writer: RunWriter, expected: set[int]) -> None:
    if expected:
        raise WarehouseError(f"run {writer.run_id!r}: the capture ended before batches "
                             f"{sorted(expected)} were produced")


def _ignore_sigint() -> None:
    # a second Ctrl-C while the run is being marked would leave it 'running'
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _progress_bar(enabled: bool):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    console = Console(stderr=True)
    return Progress(  # a bar is for a person at a terminal: none when stderr is piped
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("batches"), TextColumn("{task.fields[tps]:>9,.0f} tok/s"),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=console, disable=not (enabled and console.is_terminal), transient=False,
    )


# --- per batch: the flows -----------------------------------------------------------------------
_cache_lock = threading.Lock()
_loaded_cache: dict[tuple, tuple[Any, Any, threading.Lock]] = {}


def _loaded(cfg: "ExtractConfig"):
    lm, win, _ = _loaded_with_lock(cfg, cache=False)
    return lm, win


def _loaded_with_lock(cfg: "ExtractConfig", cache: bool = True):
    """The loaded model and corpus windows of ``cfg`` (cached per process for the flows), and
    the lock that serialises captures on that model instance: capture hooks are registered on
    the model's modules, so two concurrent forwards on one instance would record into each
    other's recorder."""
    from attnbase import extract as ex

    key = (cfg.model, cfg.dtype, cfg.device, cfg.variant, cfg.init, cfg.init_seed, cfg.corpus,
           cfg.n_seqs, cfg.seq_len, cfg.seed, cfg.bos)
    with _cache_lock:
        if cache and key in _loaded_cache:
            return _loaded_cache[key]
        lm = ex.load_for_config(cfg)  # the model, re-initialised and ablated as cfg says
        win = ex.corpus_windows(lm, corpus=cfg.corpus, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len,
                                seed=cfg.seed, bos=cfg.bos)
        entry = (lm, win, threading.Lock())
        if cache:
            _loaded_cache[key] = entry
        return entry


@dataclass(frozen=True)
class RunPlan:
    """What a flow task needs to write batches of an opened run (picklable, no open handles):
    the run's writer and the extraction config that produces its batches."""

    writer: RunWriter
    cfg: "ExtractConfig"
    #: the thread settings the run recorded (:mod:`attnbase.extract.threads`), set before
    #: each batch in whichever process computes it
    threads: dict | None = None

    @property
    def run_id(self) -> str:
        return self.writer.run_id

    @property
    def config_hash(self) -> str:
        return self.writer.spec.config_hash

    @property
    def n_batches(self) -> int:
        return self.writer.n_batches

    @property
    def pending(self) -> tuple[int, ...]:
        return self.writer.pending

    @property
    def created_at(self) -> str:
        return self.writer.created_at


def preflight_run(run_id: str, cfg: "ExtractConfig") -> None:
    """Every check of a requested run that needs no model weights (run name, corpus, seq_len
    against the config's positions, family, device): the CLI and the flows call it before any
    model loads or any run is registered."""
    from attnbase.extract.preflight import preflight

    check_run_id(run_id)
    preflight(cfg)


def prepare_run(db: Database, run_id: str, cfg: "ExtractConfig",
                overwrite: bool = False, store: str | None = None,
                wait: bool = False) -> RunPlan:
    """Register ``run_id`` (or find it again) and return its plan, whose ``pending`` lists the
    batches to run. Model and corpus load first, so their errors leave no catalog row.
    ``wait``: wait for another process writing the run instead of refusing."""
    check_run_id(run_id)
    from attnbase import extract as ex

    lm, win, _ = _loaded_with_lock(cfg)
    spec = cfg.run_spec(lm.info, corpus=win.corpus, corpus_hash=win.corpus_hash,
                        **_window_facts(win),
                        provenance={**ex.run_provenance(lm), **(win.read or {})})
    from attnbase.extract import threads

    writer = RunWriter.open(db, run_id, spec, overwrite=overwrite, store=store, wait=wait)
    return RunPlan(writer, cfg, threads.recorded(db.find_run(run_id)))


def _capture_batch(plan: RunPlan, batch: int):
    """The captured batch ``batch`` of the run (one forward of its windows)."""
    from attnbase import extract as ex

    writer, cfg = plan.writer, plan.cfg
    if not 0 <= batch < writer.n_batches:
        raise WarehouseError(f"run {writer.run_id!r} has batches 0..{writer.n_batches - 1}, "
                             f"not {batch}")
    lm, win, lock = _loaded_with_lock(cfg)
    from attnbase.extract import threads

    with lock:  # capture_batches calls the batch_start / after_forward fault points
        threads.apply(plan.threads)  # this thread (a worker's, a pool's) as the run recorded
        gen = ex.capture_batches(lm, win.tokens, batch_size=cfg.batch_size, capture=cfg.capture,
                                 start_batch=batch, store_dtype=cfg.store_dtype,
                                 pixels=win.pixels)
        try:
            return next(iter(gen))
        finally:
            gen.close()


def run_batch(plan: RunPlan, batch: int) -> int:
    """Capture batch ``batch`` of the run and make it durable; returns the batch index.
    Rerunning a batch rewrites the same chunks and files (idempotent)."""
    plan.writer.write(_capture_batch(plan, batch))
    return batch


def run_batch_unledgered(plan: RunPlan, batch: int) -> dict:
    """Capture batch ``batch`` and write its chunks and files, but nothing to the catalog;
    returns the batch's ledger entry (:meth:`RunWriter.write_unledgered`) for the coordinator
    to mark. Idempotent like :func:`run_batch`."""
    return plan.writer.write_unledgered(_capture_batch(plan, batch))


def finish_run(plan: RunPlan) -> dict:
    """Mark the run complete (returns its ``runs`` row); raises naming batches still pending."""
    return plan.writer.finish()
