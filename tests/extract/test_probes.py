"""Built-in probe corpora (extract/probes.py): windows' shapes, repetition, no special ids, BOS
where the model uses one, determinism under the seed; and an extract + analyze of tiny-gpt2
on ``probe:repeat-random`` whose analysis scores every head's induction."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnbase.errors import CorpusError
from attnbase.extract.corpus import corpus_windows, sink_convention
from attnbase.extract.probes import PROBES, content_ids


@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-llama", "minilm"])
@pytest.mark.parametrize("probe", PROBES)
def test_probe_windows(load_lm, model, probe):
    lm = load_lm(model)
    tok = lm.tokenizer
    w = corpus_windows(lm, f"probe:{probe}", n_seqs=5, seq_len=20, seed=7)
    conv = sink_convention(tok, lm.info.causal)
    assert w.tokens.shape == (5, 20) and w.tokens.dtype == np.int32
    assert w.corpus == f"probe:{probe}" and len(w.corpus_hash) == 16 and w.n_available == 5
    p, s = len(conv.prefix), len(conv.suffix)
    content = w.tokens[:, p:20 - s]
    # the sink convention: BOS (or [CLS] ... [SEP]) where the tokenizer uses one
    assert (w.tokens[:, :p] == np.array(conv.prefix)).all()
    assert (w.tokens[:, 20 - s:] == np.array(conv.suffix, dtype=int)).all()
    if model == "tiny-llama":
        assert p == 1 and (w.tokens[:, 0] == tok.bos_token_id).all()
    # no special token inside the content; every id is in the vocabulary
    assert not np.isin(content, tok.all_special_ids).any()
    assert np.isin(content, content_ids(tok)).all()
    width = content.shape[1]
    if probe == "repeat-random":
        half = (width + 1) // 2
        np.testing.assert_array_equal(content[:, half:], content[:, :width - half])
        assert all(len(set(row[:half])) == half for row in content)  # distinct first half
    elif probe == "repeat-token":
        assert (content == content[:, :1]).all()
    else:
        assert len(np.unique(content)) > width  # i.i.d. draws over 5 windows
    # determinism under the seed; another seed, other windows
    again = corpus_windows(lm, f"probe:{probe}", n_seqs=5, seq_len=20, seed=7)
    np.testing.assert_array_equal(again.tokens, w.tokens)
    assert again.corpus_hash == w.corpus_hash
    other = corpus_windows(lm, f"probe:{probe}", n_seqs=5, seq_len=20, seed=8)
    assert not np.array_equal(other.tokens, w.tokens)


def test_unknown_probe_names_the_built_in_ones(load_lm):
    with pytest.raises(CorpusError, match="unknown probe corpus 'probe:induction'.*"
                                          "probe:repeat-random, probe:random, probe:repeat-token"):
        corpus_windows(load_lm("tiny-gpt2"), "probe:induction", n_seqs=1, seq_len=8, seed=0)


def test_unknown_probe_fails_before_the_model_loads(cli, tmp_path):
    code, _, err = cli("extract", "--db", tmp_path / "db", "--model", "tiny-gpt2", "--run", "p",
                       "--seqs", 2, "--seq-len", 8, "--corpus", "probe:nope", "-q")
    assert code == 2 and "unknown probe corpus 'probe:nope'" in err and "Traceback" not in err


@pytest.mark.slow  # ~10 s: a tiny-gpt2 extraction and its analysis through the commands
def test_extract_and_analyze_a_repeat_random_probe(cli, tmp_path):
    """The probe is the run's corpus (provenance) and the analysis writes the three taxonomy
    rows for every head. A random-init tiny model has no induction head: its induction score
    is only what its attention happens to put on those keys, so nothing is claimed of its
    size here beyond being a probability."""
    from attnbase.metrics import HEAD_TYPES
    from attnbase.warehouse import Database

    db = tmp_path / "db"
    code, out, err = cli("extract", "--db", db, "--model", "tiny-gpt2", "--run", "p",
                         "--seqs", 4, "--seq-len", 16, "--corpus", "probe:repeat-random", "-q")
    assert code == 0, err
    info = Database(db).run_info("p")
    assert info["corpus"] == "probe:repeat-random" and info["corpus_hash"]
    code, out, err = cli("analyze", "--db", db, "--run", "p", "--draws", 5, "--gauss-draws", 20)
    assert code == 0, err
    from attnbase.metrics import label

    assert all(f"{label(m)}, mean over heads" in out for m in HEAD_TYPES), out
    with Database(db).connect(read_only=True) as con:
        L, H = con.execute("SELECT n_layers, n_heads FROM runs WHERE run_id = 'p'").fetchone()
        rows = con.execute("SELECT metric, count(*), count(value), min(value), max(value) "
                           "FROM head_metrics WHERE run_id = 'p' AND list_contains(?, metric) "
                           "GROUP BY metric", [list(HEAD_TYPES)]).fetchall()
        run = dict(con.execute("SELECT metric, value FROM run_metrics WHERE run_id = 'p'"
                               ).fetchall())
    assert {r[0] for r in rows} == set(HEAD_TYPES)
    for metric, n, n_values, lo, hi in rows:
        assert n == n_values == L * H and 0.0 <= lo <= hi <= 1.0, metric
    assert 0.0 <= run["induction"] <= 1.0
