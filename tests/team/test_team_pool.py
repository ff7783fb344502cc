"""Jobs through a Prefect work pool over a team database: two ``attnbase worker`` processes
given the same run over PostgreSQL write it once; ``attnbase flow run`` takes the address too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "flows"))  # poolhelpers.py

from poolhelpers import ledger, logs, pipeline_config, pool_with_workers, run, submit  # noqa: E402

pytestmark = pytest.mark.slow


def test_workers_and_flow_run_over_a_team_database(team, child_env, pg, tmp_path):
    url, _ = team
    cfg = pipeline_config(tmp_path, "p", "tiny-gpt2", 8, 2, analyze=True, db=url)
    with pool_with_workers(tmp_path, "team", 2, env=child_env("w")) as (_api, env, _workers):
        subs = [submit(env, cfg, "team", "--wait") for _ in range(2)]
        outs = [p.communicate(timeout=600) for p in subs]
        for p, (out, err) in zip(subs, outs):
            assert p.returncode == 0 and ": COMPLETED (triggered" in out, (out, err,
                                                                           logs(tmp_path))
        # the same run twice at once: one worker wrote it, the other waited and found it done
        assert ledger(url, "p-tiny-gpt2-default") == {"complete": 4, "files": 8,
                                                      "status": "complete"}
        # `flow run` over the team database (no longer refused)
        other = pipeline_config(tmp_path, "f", "tiny-gpt2", 4, 2, analyze=False, db="unused")
        r = run(["flow", "run", "--config", other, "--db", url], env, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append((r.stdout, r.stderr))
        assert ledger(url, "f-tiny-gpt2-default") == {"complete": 2, "files": 4,
                                                      "status": "complete"}
        v = run(["verify", "--db", url], env)
        assert v.stdout.startswith("ok: 2 run(s)"), v.stdout + v.stderr
        outs.append((v.stdout, v.stderr))
    heads = run(["sql", "--db", url, "--format", "csv",
                 "SELECT count(*) AS n FROM head_metrics WHERE run_id = 'p-tiny-gpt2-default'"],
                env)
    assert int(heads.stdout.split()[-1]) > 0  # analysed in a worker
    texts = [o + e for o, e in outs] + [logs(tmp_path)]
    assert not any(pg.password in t for t in texts)  # the password in no output or log
