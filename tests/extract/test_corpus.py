"""Corpus formats, the sink convention and the corpus errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnbase.errors import CorpusError
from attnbase.extract import corpus_windows
from attnbase.extract.corpus import corpus_hash, default_corpus_text

DOCS = [
    "The quick brown fox jumps over the lazy dog. " * 6,
    "Attention sinks collect probability mass on the first token. " * 5,
    "A third document, about keys and queries and values. " * 5,
]


def _write_all(tmp_path, docs):
    txt_dir = tmp_path / "dir"
    txt_dir.mkdir()
    for i, d in enumerate(docs):
        (txt_dir / f"{i:02d}.txt").write_text(d)
    (txt_dir / "ignored.md").write_text("not a txt file")
    jl = tmp_path / "c.jsonl"
    jl.write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)) + "\n")
    pqf = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": docs}), pqf)
    return [str(txt_dir), str(jl), str(pqf)]


def test_formats_round_trip(tmp_path, load_lm):
    lm = load_lm("tiny-gpt2")
    tok = lm.tokenizer
    results = [corpus_windows(lm, c, n_seqs=4, seq_len=16, seed=0) for c in _write_all(tmp_path, DOCS)]
    first = results[0]
    for r in results[1:]:
        np.testing.assert_array_equal(r.tokens, first.tokens)
        assert r.corpus_hash == first.corpus_hash == corpus_hash(DOCS)
        assert r.n_available == first.n_available
    # take every window: decoding the content reproduces the documents joined by EOS
    every = corpus_windows(lm, results[1].corpus, n_seqs=first.n_available, seq_len=16, seed=0)
    assert (every.tokens[:, 0] == tok.bos_token_id).all()
    text = tok.decode(every.tokens[:, 1:].reshape(-1).tolist())
    assert (tok.eos_token.join(DOCS)).startswith(text) and len(text) > 0.8 * len("".join(DOCS))


def test_single_txt_equals_one_doc_jsonl(tmp_path, load_lm):
    lm = load_lm("tiny-llama")
    (tmp_path / "a.txt").write_text(DOCS[0])
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": DOCS[0]}) + "\n")
    a = corpus_windows(lm, str(tmp_path / "a.txt"), 2, 8, 0)
    b = corpus_windows(lm, str(tmp_path / "a.jsonl"), 2, 8, 0)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.tokens.dtype == np.int32 and a.tokens.shape == (2, 8)


def test_bert_windows_cls_first_sep_last(load_lm):
    lm = load_lm("minilm")
    w = corpus_windows(lm, "default", n_seqs=3, seq_len=16, seed=0)
    tok = lm.tokenizer
    assert (w.tokens[:, 0] == tok.cls_token_id).all() and (w.tokens[:, -1] == tok.sep_token_id).all()
    assert not np.isin(w.tokens[:, 1:-1], [tok.cls_token_id]).any()
    assert lm.info.sink_token == "[CLS]"


def test_default_corpus_and_seed_determinism(load_lm):
    lm = load_lm("tiny-neox")
    a = corpus_windows(lm, "default", n_seqs=4, seq_len=32, seed=3)
    b = corpus_windows(lm, "default", n_seqs=4, seq_len=32, seed=3)
    c = corpus_windows(lm, "default", n_seqs=4, seq_len=32, seed=4)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)
    assert a.corpus_hash == corpus_hash([default_corpus_text()]) and len(a.corpus_hash) == 16
    assert a.n_available > 1000 and lm.info.sink_token == "<|bos|>"
    assert (a.tokens[:, 0] == lm.tokenizer.bos_token_id).all()
    # windows come back in corpus order
    every = corpus_windows(lm, "default", n_seqs=a.n_available, seq_len=32, seed=0).tokens
    idx = [int(np.flatnonzero((every == row).all(1))[0]) for row in a.tokens]
    assert idx == sorted(idx) and len(set(idx)) == 4


def test_too_short_corpus(tmp_path, load_lm):
    lm = load_lm("tiny-gpt2")
    p = tmp_path / "short.txt"
    p.write_text("only a few words here")
    with pytest.raises(CorpusError, match=r"yields only 0 windows of 64 tokens") as e:
        corpus_windows(lm, str(p), n_seqs=2, seq_len=64, seed=0)
    assert "short.txt" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(CorpusError, match=r"yields only \d+ windows"):
        corpus_windows(lm, str(p), n_seqs=5, seq_len=4, seed=0)


@pytest.mark.parametrize("content", ["", "\n"])
def test_empty_corpus(tmp_path, load_lm, content):
    p = tmp_path / "empty.jsonl"
    p.write_text(content)
    with pytest.raises(CorpusError, match="empty"):
        corpus_windows(load_lm("tiny-gpt2"), str(p), n_seqs=1, seq_len=8, seed=0)


def test_missing_and_bad_corpus(tmp_path, load_lm):
    lm = load_lm("tiny-gpt2")
    with pytest.raises(CorpusError, match="does not exist"):
        corpus_windows(lm, str(tmp_path / "nope.txt"), 1, 8, 0)
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(CorpusError, match="unsupported suffix"):
        corpus_windows(lm, str(tmp_path / "x.csv"), 1, 8, 0)
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "x.parquet")
    with pytest.raises(CorpusError, match="no 'text' column"):
        corpus_windows(lm, str(tmp_path / "x.parquet"), 1, 8, 0)
    (tmp_path / "x.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(CorpusError, match="line 1"):
        corpus_windows(lm, str(tmp_path / "x.jsonl"), 1, 8, 0)


def test_stream_cache_is_shared_by_tokenizers_of_the_same_files(load_lm, monkeypatch):
    """Preflight and the model load each build a tokenizer from the same files: the corpus is
    tokenized once for both, and a tokenizer of other files gets its own stream."""
    import copy
    from types import SimpleNamespace

    from attnbase.extract import corpus as corpus_mod

    calls = []
    real = corpus_mod._content_stream
    monkeypatch.setattr(corpus_mod, "_content_stream",
                        lambda tok, docs, sep: calls.append(type(tok).__name__) or real(tok, docs, sep))
    monkeypatch.setattr(corpus_mod, "_STREAMS", {})
    lm = load_lm("tiny-gpt2")
    twin = SimpleNamespace(tokenizer=copy.deepcopy(lm.tokenizer), info=lm.info)
    assert twin.tokenizer is not lm.tokenizer
    a = corpus_windows(lm, "default", n_seqs=4, seq_len=32, seed=1)
    b = corpus_windows(twin, "default", n_seqs=4, seq_len=32, seed=1)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert len(calls) == 1
    bert = load_lm("minilm")
    c = corpus_windows(bert, "default", n_seqs=4, seq_len=32, seed=1)
    assert len(calls) == 2 and not np.array_equal(a.tokens, c.tokens)
