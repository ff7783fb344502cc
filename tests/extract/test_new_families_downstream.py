"""Downstream stages on families served by the new paths, through the CLI: a tiny seeded
Gemma-2 (generic capture: soft-cap, alternating windows), BLOOM (its adapter: ALiBi) and
ModernBERT (generic encoder: rotary, bidirectional windows), saved as local HF directories with
the bundled tokenizer. extract (logits stored) -> compact (derived logits checked against the
stored ones, then dropped) -> verify (row statistics recomputed from the derived logits) ->
analyze (the Table-1 row) -> report (HTML and PDF)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

from attnbase.extract.proven import PROVEN

pytestmark = pytest.mark.slow


def _cli(*args) -> str:
    proc = subprocess.run([sys.executable, "-m", "attnbase.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _save(model_type: str, out) -> None:
    from transformers import AutoConfig, AutoModel

    from attnbase.extract.models import tiny_tokenizer

    tok = tiny_tokenizer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = AutoConfig.for_model(model_type, vocab_size=len(tok), pad_token_id=0,
                                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                   **PROVEN[model_type][0])
        torch.manual_seed(0)
        AutoModel.from_config(cfg).save_pretrained(out)
    tok.save_pretrained(out)


@pytest.mark.parametrize("model_type", ["gemma2", "bloom", "modernbert"])
def test_extract_compact_verify_analyze_report(tmp_path, model_type):
    model, db = tmp_path / model_type, tmp_path / "db"
    _save(model_type, model)
    _cli("extract", "--db", db, "--model", model, "--seqs", 8, "--seq-len", 32, "--run", "r",
         "--device", "cpu", "--capture", "keys,queries,logits", "-q")
    assert "freed" in _cli("compact", "--db", db, "--run", "r")
    assert _cli("verify", "--db", db, "--run", "r").startswith("ok: 1 run(s)")
    table1 = _cli("analyze", "--db", db, "--run", "r", "--draws", 5, "--gauss-draws", 10, "-q")
    assert re.search(r"key-norm CV\s+\d\.\d{4}", table1)  # the registry's label
    html, pdf = _cli("report", "--db", db, "--run", "r").split()
    text = open(html).read()
    present = set(re.findall(r'class="present" data-section="(\w+)"', text))
    assert {"table1", "norm_cv", "max_share", "head_maps", "methods"} <= present
    assert os.path.getsize(pdf) > 10_000
