"""Flows over the real stages on tiny models (seeded random-init, bundled tokenizer)."""

from __future__ import annotations

import numpy as np
import pytest

import attnbase
from attnbase.extract.config import ExtractConfig
from attnbase.flows import extract_flow
from attnbase.warehouse import Database

pytestmark = pytest.mark.usefixtures("prefect_harness")

TINY = dict(model="tiny-gpt2", seqs=8, seq_len=16, batch_size=2, device="cpu")


def _cfg(**kw):
    d = {**TINY, **kw}
    return ExtractConfig(model=d["model"], n_seqs=d["seqs"], seq_len=d["seq_len"],
                         batch_size=d["batch_size"], device=d["device"])


def _same_run(db_a, run_a, db_b, run_b):
    a, b = attnbase.open_run(db_a, run_a), attnbase.open_run(db_b, run_b)
    assert set(a.data_vars) == set(b.data_vars)
    for k in a.data_vars:
        np.testing.assert_array_equal(a[k].values, b[k].values, err_msg=k)
    from attnbase.warehouse import read_sql

    q = ("SELECT layer, head, seq, query, entropy, sink_mass FROM row_stats WHERE run_id = ? "
         "ORDER BY layer, head, seq, query")
    assert read_sql(db_a, q, [run_a]).equals(read_sql(db_b, q, [run_b]))
    st = "SELECT status, n_seqs, config_hash FROM runs WHERE run_id = ?"
    assert read_sql(db_a, st, [run_a]).row(0) == read_sql(db_b, st, [run_b]).row(0)


@pytest.fixture(scope="module")
def reference_db(tmp_path_factory):
    """The same run written by the runner's one-call ``extract_run`` (what the CLI runs)."""
    from attnbase.runner import extract_run

    db = tmp_path_factory.mktemp("ref")
    rec = extract_run(Database(db), "ref", _cfg(), progress=False)
    assert rec.status == "complete"
    return db


def test_extract_flow_threads_matches_extract_run(reference_db, tmp_path):
    out = extract_flow(db=str(tmp_path), run_id="thr", task_runner="local", workers=2, **TINY)
    assert out == {"submitted": [0, 1, 2, 3], "status": "complete"}
    _same_run(reference_db, "ref", tmp_path, "thr")
    # resumed: nothing pending, nothing submitted
    assert extract_flow(db=str(tmp_path), run_id="thr", **TINY)["submitted"] == []


def test_extract_flow_resumes_from_the_real_ledger(reference_db, tmp_path, monkeypatch):
    from attnbase import runner

    plan = runner.prepare_run(Database(tmp_path), "res", _cfg())
    runner.run_batch(plan, 0)
    runner.run_batch(plan, 2)  # an interrupted run left batches 0 and 2
    calls = []
    real = runner.run_batch_unledgered
    monkeypatch.setattr(runner, "run_batch_unledgered", lambda p, b: (calls.append(b), real(p, b))[1])
    out = extract_flow(db=str(tmp_path), run_id="res", **TINY)
    assert out["submitted"] == [1, 3] and sorted(calls) == [1, 3]
    _same_run(reference_db, "ref", tmp_path, "res")


def test_batches_written_but_never_marked_are_written_again(reference_db, tmp_path, monkeypatch):
    """A flow whose coordinator dies after its workers wrote batches but before it marked any:
    the rerun removes those batches' unlisted files, so it must compute every batch again (an
    earlier task result kept by Prefect would list files that no longer exist)."""
    from attnbase import runner
    from attnbase.flows import _stages

    real_mark = _stages.mark_batches

    def dies(plan, entries):
        raise RuntimeError("the coordinator died before its ledger mark")

    monkeypatch.setattr(_stages, "mark_batches", dies)
    with pytest.raises(RuntimeError, match="coordinator died"):
        extract_flow(db=str(tmp_path), run_id="unm", **TINY)
    monkeypatch.setattr(_stages, "mark_batches", real_mark)
    calls = []
    real = runner.run_batch_unledgered
    monkeypatch.setattr(runner, "run_batch_unledgered", lambda p, b: (calls.append(b), real(p, b))[1])
    out = extract_flow(db=str(tmp_path), run_id="unm", **TINY)
    assert out["submitted"] == [0, 1, 2, 3] and sorted(calls) == [0, 1, 2, 3]
    _same_run(reference_db, "ref", tmp_path, "unm")


@pytest.mark.slow
def test_extract_flow_on_a_multiprocess_dask_cluster(reference_db, tmp_path):
    """Two Dask worker processes write batches of one run into one catalog (each waits for the other's catalog lock).

    40-90 s on 2 shared cores (each worker process imports torch and loads the model), so
    ``slow``: run it with ``make test-slow``."""
    out = extract_flow(db=str(tmp_path), run_id="dsk", task_runner="dask", workers=2, **TINY)
    assert out["submitted"] == [0, 1, 2, 3]
    _same_run(reference_db, "ref", tmp_path, "dsk")
