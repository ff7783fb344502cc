"""``attnbase weights``: a weights-only run with S-D metrics, idempotent, conflicts refused."""

from __future__ import annotations

import numpy as np


def rows(db_path, sql):
    from attnbase.warehouse import read_sql

    return read_sql(db_path, sql)


def test_weights_run_tiny_llama(cli, tmp_path):
    db = tmp_path / "db"
    code, out, err = cli("weights", "--db", db, "--model", "tiny-llama", "--run", "w")
    assert code == 0, err
    assert "routing_fraction" in out
    run = rows(db, "SELECT status, n_seqs, corpus, family, n_kv_heads FROM runs WHERE run_id='w'")
    assert run.row(0) == ("complete", 0, "(weights)", "llama", 2)
    hm = rows(db, "SELECT layer, head, metric, value FROM head_metrics WHERE run_id='w'")
    from attnbase.stats.spectral import SD_HEAD_METRICS

    assert hm.height == 4 * 4 * len(SD_HEAD_METRICS)
    rf = hm.filter(hm["metric"] == "routing_fraction")["value"].to_numpy()
    assert np.all((rf >= 0) & (rf <= 1))
    # the cascade: one routing_erank per layer, the mean of its heads
    casc = rows(db, "SELECT l.layer, l.value, avg(h.value) AS m FROM layer_metrics l JOIN "
                    "head_metrics h ON h.run_id = l.run_id AND h.layer = l.layer AND "
                    "h.metric = l.metric WHERE l.run_id='w' AND l.metric='routing_erank' "
                    "GROUP BY 1, 2 ORDER BY 1")
    assert casc.height == 4
    np.testing.assert_allclose(casc["value"].to_numpy(), casc["m"].to_numpy())

    # same config again: metrics replaced, not duplicated
    code, _, err = cli("weights", "--db", db, "--model", "tiny-llama", "--run", "w")
    assert code == 0, err
    assert rows(db, "SELECT count(*) AS n FROM head_metrics WHERE run_id='w'")["n"][0] == hm.height
    # another model under the same name: one-line conflict error, exit 2
    code, _, err = cli("weights", "--db", db, "--model", "tiny-gpt2", "--run", "w")
    assert code == 2 and "already exists with a different configuration" in err
    assert err.count("\n") == 1


def test_extract_variant_recorded_and_applied(cli, tmp_path):
    import json

    db = tmp_path / "db"
    args = ["extract", "--db", db, "--model", "tiny-gpt2", "--seqs", "2", "--seq-len", "8",
            "--capture", "hidden", "-q"]
    assert cli(*args, "--run", "full")[0] == 0
    code, _, err = cli(*args, "--run", "ao", "--variant", "attention-only", "--init", "random",
                       "--init-seed", "5")
    assert code == 0, err
    runs = rows(db, "SELECT run_id, config, config_hash, model_revision FROM runs ORDER BY run_id")
    cfg = {r: json.loads(c) for r, c in zip(runs["run_id"], runs["config"])}
    assert cfg["ao"]["variant"] == "attention-only" and cfg["ao"]["init"] == "random"
    assert cfg["ao"]["init_seed"] == 5 and "variant" not in cfg["full"]
    assert runs["model_revision"][0].endswith("+random-init:seed=5")
    assert runs["config_hash"][0] != runs["config_hash"][1]
    code, _, err = cli(*args, "--run", "bad", "--variant", "no-attn")
    assert code == 2 and "unknown --variant 'no-attn'" in err


def test_weights_random_init_is_another_config(cli, tmp_path):
    db = tmp_path / "db"
    code, _, err = cli("weights", "--db", db, "--model", "tiny-gpt2", "--run", "r", "--init", "random",
                       "--seed", "4")
    assert code == 0, err
    run = rows(db, "SELECT model_revision, config FROM runs WHERE run_id='r'")
    assert run["model_revision"][0].endswith("+random-init:seed=4")
    assert '"init": "random"' in run["config"][0]
    code, _, err = cli("weights", "--db", db, "--model", "tiny-gpt2", "--run", "r", "--init", "zeros")
    assert code == 2 and "unknown init 'zeros'" in err
