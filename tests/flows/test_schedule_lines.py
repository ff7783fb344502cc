"""``attnbase schedule`` prints one line per scheduled or triggered run when it finishes
(flows/serving.py: run_line, report_finished), in bounded and unbounded serving alike."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace as NS

from attnbase.flows.serving import report_finished, run_line


def _run(rid, state, *, auto=True, secs=3.0, start="2026-12-05 03:00"):
    final = state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
    st = NS(type=NS(value=state), is_final=lambda: final)
    return NS(id=rid, name=f"run-{rid}", auto_scheduled=auto, state=st,
              total_run_time=timedelta(seconds=secs), expected_start_time=start)


def test_each_finished_run_is_reported_once_as_it_finishes():
    lines: list[str] = []
    reported: set[str] = set()
    first = [_run("a", "COMPLETED", secs=41.24), _run("b", "RUNNING", auto=False, start="03:01")]
    assert report_finished(first, reported, lines.append) == 1
    assert lines == ["flow run run-a (a): COMPLETED (scheduled, 41.2 s)"]
    # the next poll: a is not repeated, b (a triggered run) has finished
    later = [_run("a", "COMPLETED", secs=41.24), _run("b", "FAILED", auto=False, start="03:01")]
    assert report_finished(later, reported, lines.append) == 1
    assert lines[1] == "flow run run-b (b): FAILED (triggered, 3.0 s)"
    assert report_finished(later, reported, lines.append) == 0  # nothing new, nothing printed


def test_pending_and_running_runs_print_nothing():
    """Negative control: runs that have not finished give no line."""
    lines: list[str] = []
    runs = [_run("p", "PENDING"), _run("s", "SCHEDULED"), _run("r", "RUNNING")]
    assert report_finished(runs, set(), lines.append) == 0 and lines == []


def test_run_line_without_a_state_or_run_time():
    r = NS(id="x", name="n", state=None, auto_scheduled=True, total_run_time=None)
    assert run_line(r) == "flow run n (x): UNKNOWN (scheduled)"


def test_unbounded_serving_prints_a_line_when_a_run_finishes(monkeypatch):
    """Serving with neither --once nor --for (until Ctrl-C): a fake Prefect runner serves for
    ~5 s while the deployment's runs move from RUNNING to COMPLETED; the line appears then."""
    import anyio
    import prefect.client.orchestration as orchestration
    import prefect.runner

    from attnbase.flows import serving

    polls = {"n": 0}

    class FakeRunner:
        def __init__(self, **kw):
            self.started = False

        def add_flow(self, *a, **kw):
            return "00000000-0000-4000-8000-000000000001"

        async def start(self):  # serving until the user stops it (here: after ~5 s)
            self.started = True
            await anyio.sleep(5.0)

        async def astop(self):
            pass

    class FakeClient:
        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        async def read_flow_runs(self, **kw):
            polls["n"] += 1
            return [_run("t1", "COMPLETED" if polls["n"] >= 2 else "RUNNING", auto=False)]

    monkeypatch.setattr(prefect.runner, "Runner", FakeRunner)
    monkeypatch.setattr(orchestration, "get_client", lambda: FakeClient())
    lines: list[str] = []
    runs = serving.serve_pipeline("p.toml", "0 3 * * *", echo=lines.append)
    assert runs == [] and polls["n"] >= 2, lines
    assert lines.count("flow run run-t1 (t1): COMPLETED (triggered, 3.0 s)") == 1, lines
    assert "until Ctrl-C" in lines[-2]
