"""A pipeline over a team database runs its studies and report stages: ``attnbase flow run``
with ``studies`` and ``report = true`` against a real PostgreSQL, end to end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "flows"))  # poolhelpers.py

from poolhelpers import client_env, run  # noqa: E402

pytestmark = pytest.mark.slow

RUN = "pt-tiny-gpt2-default"


def test_a_pipeline_with_studies_and_a_report_runs_over_a_team_database(team, child_env, pg,
                                                                        tmp_path):
    from attnbase.warehouse import Database

    url, data = team
    cfg = tmp_path / "p.toml"
    cfg.write_text('db = "unused"\nmodels = ["tiny-gpt2"]\nrun_prefix = "pt-"\nseqs = 4\n'
                   'seq_len = 32\nbatch_size = 2\nworkers = 1\ndraws = 20\n'
                   'studies = ["distances", "reversal"]\nreport = true\n')
    env = client_env(tmp_path / "prefect-home", None, child_env("p"))
    r = run(["flow", "run", "--config", cfg, "--db", url], env)
    assert r.returncode == 0, r.stdout + r.stderr
    # the report where `attnbase report --db URL` writes it: the data location's reports/
    html = data / "reports" / RUN / "report.html"
    assert f"report: {html}" in r.stdout and html.with_suffix(".pdf").is_file()
    page = html.read_text(encoding="utf-8")
    assert f"<title>attnbase report: {RUN}</title>" in page  # it names the run
    with Database(url).connect(read_only=True) as con:
        rows = con.execute("SELECT s.kind, count(*) FROM studies s JOIN study_results r "
                           "USING (study_id) WHERE list_contains(s.run_ids, ?) GROUP BY 1 "
                           "ORDER BY 1", [RUN]).fetchall()
    assert [k for k, _ in rows] == ["distances", "reversal"] and all(n > 0 for _, n in rows)
    # the `attnbase study` command takes the address too (a study the pipeline did not run)
    s = run(["study", "entropy", "--db", url, "--run", RUN, "--layers", "0,1"], env)
    assert s.returncode == 0, s.stdout + s.stderr
    with Database(url).connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM studies WHERE kind = 'entropy_change'"
                           ).fetchone()[0] == 1
    texts = [r.stdout, r.stderr, s.stdout, s.stderr, page]
    assert not any(pg.password in t for t in texts)  # the password in no output or report
