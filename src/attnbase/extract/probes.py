"""Built-in probe corpora: synthetic token windows of the induction and sink papers.

``attnbase extract --corpus probe:<name>`` for language models (text tokenizers); the windows
are drawn from the model's vocabulary *without* its special tokens, seeded by ``--seed``, and
wrapped in the model's sink convention (:func:`attnbase.extract.corpus.sink_convention`: BOS
where the tokenizer uses one, ``[CLS] ... [SEP]`` for encoders). The run records the probe's
name as its ``corpus`` and the sha256 of the windows' token ids as its ``corpus_hash``.

``probe:repeat-random``
    random ids, the first half repeated (``r r`` with ``r`` of width/2 distinct ids; an odd
    width repeats a prefix of ``r``): the second half's queries find their token's first
    occurrence, the setup of Olsson et al. 2022's induction heads (docs/metrics.md §3b).
``probe:random``
    i.i.d. uniform ids (Gu et al., ICLR 2025, "random tokens").
``probe:repeat-token``
    one random id repeated over the window (Gu et al., "one repeated token").
"""

from __future__ import annotations

import hashlib

import numpy as np

from attnbase.errors import CorpusError

PREFIX = "probe:"
#: The built-in probes, by name (``--corpus probe:<name>``).
PROBES = ("repeat-random", "random", "repeat-token")


def is_probe(corpus: str) -> bool:
    """``corpus`` names a probe (``probe:...``), known or not (:func:`probe_name` checks)."""
    return isinstance(corpus, str) and corpus.startswith(PREFIX)


def probe_name(corpus: str) -> str:
    """The probe's name (``repeat-random`` of ``probe:repeat-random``); CorpusError listing the
    built-in probes for an unknown one."""
    name = corpus[len(PREFIX):]
    if name not in PROBES:
        raise CorpusError(f"unknown probe corpus {corpus!r}; built in: "
                          f"{', '.join(PREFIX + p for p in PROBES)}")
    return name


def content_ids(tokenizer) -> np.ndarray:
    """The ids a probe draws from: the tokenizer's vocabulary (added tokens included) without
    its special tokens, sorted."""
    n = len(tokenizer)
    special = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or ())}
    ids = np.setdiff1d(np.arange(n, dtype=np.int64), np.fromiter(special, np.int64, len(special)))
    if ids.size < 2:
        raise CorpusError(f"the tokenizer has {ids.size} non-special token(s); a probe needs 2")
    return ids


def probe_content(name: str, ids: np.ndarray, n_seqs: int, width: int,
                  rng: np.random.Generator) -> np.ndarray:
    """``(n_seqs, width)`` int64 content of probe ``name`` drawn from ``ids``."""
    if name == "random":
        return ids[rng.integers(0, ids.size, size=(n_seqs, width))]
    if name == "repeat-token":
        return np.repeat(ids[rng.integers(0, ids.size, size=(n_seqs, 1))], width, axis=1)
    half = (width + 1) // 2
    if half > ids.size:
        raise CorpusError(f"probe:repeat-random needs {half} distinct ids for --seq-len "
                          f"{width}+specials but the vocabulary has {ids.size}; lower --seq-len")
    first = np.stack([ids[rng.choice(ids.size, size=half, replace=False)]
                      for _ in range(n_seqs)])
    return np.concatenate([first, first], axis=1)[:, :width]


def probe_tokens(tokenizer, corpus: str, prefix: tuple[int, ...], suffix: tuple[int, ...],
                 n_seqs: int, seq_len: int, seed: int) -> tuple[np.ndarray, str]:
    """The windows of probe ``corpus``: ``tokens`` int32 ``[seq, pos]`` (``prefix``, the probe's
    content drawn with ``numpy.random.default_rng(seed)``, ``suffix``: the model's sink
    convention) and their ``corpus_hash`` (sha256 of the ids, 16 hex digits)."""
    name = probe_name(corpus)
    if tokenizer is None:
        raise CorpusError(f"probe corpus {corpus!r} needs a text tokenizer; the model has none")
    width = seq_len - len(prefix) - len(suffix)
    if width < 2:
        raise CorpusError(f"--seq-len {seq_len} leaves {width} content token(s) after "
                          f"{len(prefix) + len(suffix)} special tokens; a probe needs 2")
    content = probe_content(name, content_ids(tokenizer), n_seqs, width,
                            np.random.default_rng(seed))
    pre = np.broadcast_to(np.asarray(prefix, dtype=np.int64), (n_seqs, len(prefix)))
    suf = np.broadcast_to(np.asarray(suffix, dtype=np.int64), (n_seqs, len(suffix)))
    tokens = np.concatenate([pre, content, suf], axis=1).astype(np.int32)
    return tokens, hashlib.sha256(tokens.tobytes()).hexdigest()[:16]
