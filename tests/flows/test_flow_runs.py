"""Real Prefect runs (one session-scoped harness) of the flows over fake stages."""

from __future__ import annotations

import pytest

from attnbase.flows import analyze_flow, extract_flow, pipeline_flow, report_flow, tasks
from attnbase.flows import extract as extract_mod
from attnbase.flows.errors import FlowStageError

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _task_runs(flow_run_id, name_prefix):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        trs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {tr.name: tr for tr in trs if tr.name.startswith(name_prefix)}


def test_extract_flow_runs_one_task_per_batch(fake_stages, tmp_path):
    state = extract_flow(db=str(tmp_path), run_id="ex", model="tiny-gpt2", seqs=10, batch_size=4,
                         return_state=True)
    assert state.is_completed()
    assert state.result()["submitted"] == [0, 1, 2]
    assert dict(fake_stages.captures) == {("ex", 0): 1, ("ex", 1): 1, ("ex", 2): 1}
    assert fake_stages.finished == ["ex"]
    runs = _task_runs(state.state_details.flow_run_id, "extract ex batch")
    assert sorted(runs) == [f"extract ex batch {b}" for b in range(3)]


def test_failing_batch_is_not_retried_the_flow_fails_and_a_rerun_resumes(fake_stages, tmp_path):
    """One retry policy (the warehouse's catalog-lock wait): a task failure is not retried by
    Prefect; the flow fails naming the batch, and the rerun captures only what is pending."""
    fake_stages.fail_times[("rt", 1)] = 1
    state = extract_flow(db=str(tmp_path), run_id="rt", model="tiny-gpt2", seqs=8, batch_size=4,
                         return_state=True)
    assert state.is_failed()
    assert fake_stages.captures[("rt", 1)] == 1 and fake_stages.captures[("rt", 0)] == 1
    runs = _task_runs(state.state_details.flow_run_id, "extract rt batch")
    assert runs["extract rt batch 1"].run_count == 1
    state = extract_flow(db=str(tmp_path), run_id="rt", model="tiny-gpt2", seqs=8, batch_size=4,
                         return_state=True)
    assert state.is_completed() and fake_stages.captures[("rt", 1)] == 2
    assert fake_stages.captures[("rt", 0)] == 1 and fake_stages.finished == ["rt"]


def test_resumed_flow_only_captures_pending_batches(fake_stages, tmp_path):
    fake_stages.premark("rs", 4, done={0, 2})  # an earlier, interrupted run finished these
    state = extract_flow(db=str(tmp_path), run_id="rs", model="tiny-gpt2", seqs=16, batch_size=4,
                         return_state=True)
    assert state.is_completed() and state.result()["submitted"] == [1, 3]
    assert set(fake_stages.captures) == {("rs", 1), ("rs", 3)}
    assert fake_stages.ledger["rs"] == {0, 1, 2, 3}


def test_failing_batch_fails_the_flow_then_resumes(fake_stages, tmp_path):
    fake_stages.fail_times[("fl", 0)] = 99
    state = extract_flow(db=str(tmp_path), run_id="fl", model="tiny-gpt2", seqs=8, batch_size=4,
                         return_state=True)
    assert state.is_failed()
    with pytest.raises(FlowStageError, match=r"run 'fl' batches \[0\].*rerun"):
        state.result()
    assert fake_stages.captures[("fl", 0)] == 1
    assert fake_stages.finished == [] and fake_stages.ledger["fl"] == {1}
    fake_stages.fail_times.clear()
    fake_stages.captures.clear()
    state = extract_flow(db=str(tmp_path), run_id="fl", model="tiny-gpt2", seqs=8, batch_size=4,
                         return_state=True)
    assert state.is_completed() and dict(fake_stages.captures) == {("fl", 0): 1}


def test_analyze_flow_one_task_per_family(fake_stages, tmp_path):
    out = analyze_flow(db=str(tmp_path), run_id="an", draws=5)
    assert [r["family"] for r in out] == list(fake_stages.families)
    assert fake_stages.analyzed[-1] == ("an", "<finish>")
    assert sorted(fake_stages.analyzed[:-1]) == sorted(("an", f) for f in fake_stages.families)


def test_report_flow(fake_stages, tmp_path):
    out = report_flow(db=str(tmp_path), run_id="a", compare=["b"])
    assert fake_stages.reports == [("a", ("b",))] and out["html"].endswith("a/report.html")


def test_pipeline_flow_over_models_and_corpora_ends_in_a_comparison_report(fake_stages, tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'db = "{tmp_path / "db"}"\nmodels = ["m1", "m2"]\nseqs = 8\nbatch_size = 4\n'
                   f'draws = 3\nworkers = 4\n')
    out = pipeline_flow(config=str(cfg))
    assert out["runs"] == ["m1-default", "m2-default"]
    assert set(fake_stages.captures) == {(r, b) for r in out["runs"] for b in (0, 1)}
    assert sorted(fake_stages.finished) == out["runs"]
    assert {(r, f) for r in out["runs"] for f in fake_stages.families} <= set(fake_stages.analyzed)
    assert fake_stages.reports == [("m1-default", ("m2-default",))]
    assert set(out["timings"]) == {"extract_s", "analyze_s", "report_s"}
    # a second run of the same pipeline extracts nothing: the ledger says every batch is done;
    # its report goes to report_dir (the first: the database's reports directory)
    fake_stages.captures.clear()
    cfg.write_text(cfg.read_text() + f'report_dir = "{tmp_path / "out"}"\n')
    pipeline_flow(config=str(cfg))
    assert not fake_stages.captures and len(fake_stages.reports) == 2
    assert fake_stages.report_dirs == [None, str(tmp_path / "out")]


def test_extract_runs_submits_all_shards_before_waiting(fake_stages, tmp_path, monkeypatch):
    """Shards run in parallel: every batch of every run is submitted before the first wait."""
    order = []
    real = extract_mod.extract_runs

    class Spy:
        def __init__(self, runner):
            self.runner = runner

        def submit(self, task, parameters, **kw):
            order.append(("submit", parameters["plan"].run_id, parameters["batch"]))
            fut = self.runner.submit(task, parameters=parameters, **kw)
            w = fut.wait

            def wait(*a, **k):
                order.append(("wait",))
                return w(*a, **k)

            fut.wait = wait
            return fut

    monkeypatch.setattr(extract_mod, "extract_runs", lambda runner, *a, **k: real(Spy(runner), *a, **k))
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'db = "{tmp_path / "db"}"\nmodels = ["m1", "m2"]\nseqs = 8\nbatch_size = 4\n'
                   f'report = false\n')
    from attnbase.flows import pipeline as pipeline_mod

    monkeypatch.setattr(pipeline_mod, "extract_runs", extract_mod.extract_runs)
    pipeline_flow(config=str(cfg))
    first_wait = order.index(("wait",))
    assert first_wait == 4 and all(o[0] == "submit" for o in order[:4])
