"""A large .txt corpus is read head first, not tokenized whole (issue 44 item 9)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from attnbase.extract import corpus_windows
from attnbase.extract import corpus as corpus_mod
from attnbase.extract.corpus import corpus_hash, default_corpus_text


def _text(n_chars: int, seed: int = 0) -> str:
    words = default_corpus_text().split()
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)  # one line


def _whole_windows(tok, text, n_seqs, seq_len, seed):
    """The rule for ordinary corpora: windows over the whole tokenized text, BOS prefixed."""
    stream = np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    width = seq_len - 1
    n_available = len(stream) // width
    picks = np.sort(np.random.default_rng(seed).choice(n_available, size=n_seqs, replace=False))
    content = stream[: n_available * width].reshape(n_available, width)[picks]
    return np.concatenate([np.full((n_seqs, 1), tok.bos_token_id), content], axis=1)


@pytest.mark.parametrize("which", ["default", "file"])
def test_ordinary_corpora_keep_their_windows(which, load_lm, tmp_path):
    lm = load_lm("tiny-gpt2")
    text = default_corpus_text() if which == "default" else _text(200_000)
    corpus = "default"
    if which == "file":
        corpus = str(tmp_path / "c.txt")
        (tmp_path / "c.txt").write_text(text)
    win = corpus_windows(lm, corpus, 12, 64, seed=5)
    assert win.read is None  # read whole, as before
    assert np.array_equal(win.tokens, _whole_windows(lm.tokenizer, text, 12, 64, 5))
    assert win.corpus_hash == corpus_hash([text])


def test_large_txt_windows_come_from_its_first_tokens(load_lm, tmp_path, monkeypatch):
    lm = load_lm("tiny-gpt2")
    text = _text(60_000, seed=1)
    path = tmp_path / "big.txt"
    path.write_text(text)
    # shrink the limits so a 60 KB file is "large" and is read in 41 steps of 1,499 characters
    monkeypatch.setattr(corpus_mod, "STREAM_BYTES", 10_000)
    monkeypatch.setattr(corpus_mod, "STREAM_CHARS", 1_499)
    monkeypatch.setattr(corpus_mod, "STREAM_TOKENS", 3_000)
    corpus_mod._STREAMS.clear()
    win = corpus_windows(lm, str(path), 8, 32, seed=2)
    whole = np.asarray(lm.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(whole) > 2 * 3_000  # the file holds far more than was read
    # steps cut at whitespace: the head is the whole file's first 3,000 tokens exactly
    ref = _whole_windows(_HeadTokenizer(lm.tokenizer, whole[:3_000]), text, 8, 32, 2)
    assert np.array_equal(win.tokens, ref)
    assert win.n_available == 3_000 // 31
    assert win.corpus_hash == corpus_hash([text])  # the hash still covers the whole file
    assert "first 3000 content tokens" in win.read["corpus_read"]
    # negative control: under the threshold the same file is read whole
    monkeypatch.setattr(corpus_mod, "STREAM_BYTES", 10**9)
    whole_win = corpus_windows(lm, str(path), 8, 32, seed=2)
    assert whole_win.read is None and whole_win.n_available == len(whole) // 31


class _HeadTokenizer:
    """A tokenizer stand-in returning fixed ids (the expected head) for the reference windows."""

    def __init__(self, tok, ids):
        self.bos_token_id, self._ids = tok.bos_token_id, ids

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": self._ids}


_RSS = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


@pytest.mark.slow  # ~11 s: one extract of a 20 MB file in a subprocess
def test_20mb_one_line_txt_extracts_in_bounded_memory(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text(_text(20_000_000))
    attnbase = os.path.join(os.path.dirname(sys.executable), "attnbase")
    out = subprocess.run(
        [sys.executable, "-c", _RSS, attnbase, "extract", "--model", "tiny-gpt2", "--corpus",
         str(path), "--db", str(tmp_path / "db"), "--run", "r", "--seqs", "2", "--seq-len", "32",
         "-q"], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    peak_mb = int(out.stdout.split()[-1]) / 1024
    # measured: 3,230 MB tokenizing the whole file, 728 MB streamed (676 MB for a 200 KB file)
    assert peak_mb < 1_400, peak_mb
