"""``attnbase flow run --dry-run`` on examples/paper-table1.toml: validates and prints the plan
(models, shapes, stored bytes from the shapes) offline, loading no model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "paper-table1.toml"
ATTNBASE = str(Path(sys.executable).with_name("attnbase"))
CHECK = ("import sys; from attnbase.cli import main; sys.argv = ['attnbase'] + sys.argv[1:]\n"
         "try:\n    main()\nexcept SystemExit as e:\n    code = e.code or 0\n"
         "loaded = [m for m in sys.modules if m.startswith('transformers.models.') and "
         "'.modeling_' in m]\nprint('MODELING', loaded)\nsys.exit(code)")


def _run(config: Path, cwd: Path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_ENDPOINT="http://127.0.0.1:9")  # any hub request would fail at once
    return subprocess.run([sys.executable, "-c", CHECK, "flow", "run", "--config", str(config),
                           "--dry-run"], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=env)


def _raw_bytes(L, H, KV, dh, rotary, S=150, T=128):
    # the attention logits are derived from queries and keys: nothing of them is stored
    queries = L * H * S * T * dh * 4
    keys = L * KV * S * T * dh * 4 * (2 if rotary else 1)  # keys_rot beside keys on RoPE models
    return queries + keys + S * T * 4  # + tokens


def test_paper_example_plan_offline(tmp_path):
    corpus = tmp_path / "data" / "wikitext-103-validation.txt"
    corpus.parent.mkdir()
    corpus.write_text("\n".join(f"Paragraph {i} of a local corpus, words and more words."
                                for i in range(600)))
    r = _run(EXAMPLE, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "MODELING []" in r.stdout  # no model code imported, let alone weights
    for run_id in ("gpt2-wikitext-103-validation", "pythia-1.4b-wikitext-103-validation"):
        assert run_id in r.stdout
    assert "150 x 128, float32, bos none, capture keys,queries" in r.stdout
    gpt2 = _raw_bytes(12, 12, 12, 64, False) / 2**30
    pythia_1b = _raw_bytes(16, 8, 8, 256, True) / 2**30
    assert f"{gpt2:.1f} GiB" in r.stdout and f"{pythia_1b:.1f} GiB" in r.stdout
    shapes = [(12, 12, 64, False), (24, 16, 64, False), (36, 20, 64, False), (48, 25, 64, False),
              (12, 12, 64, True), (24, 16, 64, True), (16, 8, 256, True), (24, 16, 128, True),
              (32, 32, 80, True)]
    total = sum(_raw_bytes(L, H, H, d, rot) for L, H, d, rot in shapes) / 2**30
    assert f"{total:.1f} GiB for 9 of 9 run(s)" in r.stdout
    assert not (tmp_path / "attnbase-paper-db").exists()  # a dry run writes nothing


def test_paper_example_without_its_corpus_says_what_to_do(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the example's relative corpus path does not exist here
    code, out, err = cli("flow", "run", "--config", EXAMPLE, "--dry-run")
    assert code == 0, err  # the offline plan: what is missing is listed, not an error
    assert "openai-community/gpt2-xl" in out  # the plan is printed
    missing = out[out.index("missing:"):]
    assert "corpus data/wikitext-103-validation.txt (not found)" in missing
    assert "load_dataset('Salesforce/wikitext', 'wikitext-103-raw-v1'" in missing
    # the page it cites for the full reproduction holds it
    doc = re.search(r"\(([\w/]+\.md), the full reproduction\)", missing).group(1)
    assert "The full reproduction needs network" in (EXAMPLE.parents[1] / doc).read_text(), doc
    assert "[needed by 9 run(s)]" in missing
    assert "9 hub model(s) not in the local HF cache" in missing
    # --strict: the same plan, and a missing input is an error (one line, exit 2)
    code, out, err = cli("flow", "run", "--config", EXAMPLE, "--dry-run", "--strict")
    assert code == 2 and "missing:" in out
    assert err.strip().count("\n") == 0 and "input(s) missing (--strict)" in err
    assert not (tmp_path / "attnbase-paper-db").exists()


@pytest.mark.slow
def test_compositional_paper_example_plan_offline(tmp_path):
    """examples/paper-compositional.toml: nine language models on the text corpus and ViT-B/16
    on images:sample, planned offline without model code."""
    corpus = tmp_path / "data" / "wikitext-103-validation.txt"
    corpus.parent.mkdir()
    corpus.write_text("\n".join(f"Paragraph {i} of a local corpus, words and more words."
                                for i in range(600)))
    r = _run(EXAMPLE.with_name("paper-compositional.toml"), tmp_path)
    assert r.returncode == 0, r.stderr
    assert "MODELING []" in r.stdout
    for run_id in ("gpt2-wikitext-103-validation", "Llama-3.2-1B-wikitext-103-validation",
                   "Qwen2.5-0.5B-wikitext-103-validation", "vit-base-patch16-224-images_sample"):
        assert run_id in r.stdout
    assert "150 x image" in r.stdout  # the image run's token count is the model's
    # ViT-B/16: 197 tokens, no rotary, keys and queries only
    vit = (12 * 12 * 150 * 197 * 64 * 4) * 2 + 150 * 197 * 4
    assert f"{vit / 2**30:.1f} GiB" in r.stdout
    assert "for 10 of 10 run(s)" in r.stdout
    assert not (tmp_path / "attnbase-compositional-db").exists()


def test_a_real_problem_still_fails_the_dry_run(cli, tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text('models = ["tiny-gpt2"]\nseq_len = 4096\n')
    code, out, err = cli("flow", "run", "--config", cfg, "--dry-run")
    assert code == 2 and "1 of 1 run(s) would fail" in err and "4096" in err


def test_the_dry_run_plans_a_report_over_a_team_database_as_the_run_runs_it(cli, tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text('models = ["tiny-gpt2"]\nstudies = ["distances"]\n')
    url = "postgresql://team@db.example.org:5432/attnbase"
    code, out, err = cli("flow", "run", "--config", cfg, "--db", url, "--dry-run")
    assert code == 0 and "report: yes" in out and "database directory" not in out + err
