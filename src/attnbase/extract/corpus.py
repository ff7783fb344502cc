"""Corpus -> fixed-length token windows with the sink convention.

A window is ``[sink] + content`` (causal models with a BOS token) or ``[CLS] + content + [SEP]``
(BERT-style encoders); with ``bos="none"`` (``attnbase extract --bos none``) a causal model's window
is content only and position 0 is a text token (``runs.sink_token`` = :data:`NO_SINK_TOKEN`). Content windows are non-overlapping slices of the concatenated, tokenized
documents (documents separated by the tokenizer's EOS / SEP where it has one). A .txt file over
:data:`STREAM_BYTES` is read in steps and only its first ``max(STREAM_TOKENS, n_seqs * width)``
content tokens are kept; the windows are drawn from those and the run's ``config`` says so
(``corpus_read``).
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnbase.errors import CorpusError
from attnbase.extract import probes

DEFAULT_CORPUS = "default"
CORPUS_SUFFIXES = (".txt", ".jsonl", ".parquet")
#: ``runs.sink_token`` of a window that starts with a text token (no BOS prepended).
NO_SINK_TOKEN = "(text)"


@dataclass(frozen=True)
class CorpusWindows:
    """``tokens``: int32 ``[seq, pos]``; ``n_available``: how many windows the corpus yields."""

    tokens: np.ndarray
    corpus: str
    corpus_hash: str
    n_available: int
    #: image corpora (extract/vision.py): pixels ``(seq, channel, height, width)`` float32 as the
    #: model's processor prepared them, and each window's source (file and crop box)
    pixels: np.ndarray | None = None
    sources: tuple | None = None
    #: how much of the corpus was read, where not all of it (large .txt files: :data:`STREAM_BYTES`);
    #: enters the run's provenance (``config`` column), e.g. ``{"corpus_read": "..."}``
    read: dict | None = None


@dataclass(frozen=True)
class SinkConvention:
    """Special token ids wrapped around each window's content."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    separator: int | None  # between documents in the content stream

    @property
    def n_special(self) -> int:
        return len(self.prefix) + len(self.suffix)


def default_corpus_text() -> str:
    """The bundled English corpus: the stdlib's pydoc topic texts, joined in sorted key order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


#: A .txt corpus larger than this is streamed, not tokenized whole (memory bounded by the windows
#: asked for, benchmarks/RESULTS.md). Files up to it give exactly the windows they always did.
STREAM_BYTES = 8 * 2**20
#: A streamed .txt corpus: windows are drawn (seeded, as for any corpus) from its first
#: ``max(STREAM_TOKENS, n_seqs * content width)`` content tokens.
STREAM_TOKENS = 2**20
#: Characters read per step of a streamed file; each step is cut at its last whitespace so words
#: are not split between two tokenizer calls.
STREAM_CHARS = 2**20


def is_streamed(corpus: str) -> bool:
    """Whether ``corpus`` is a .txt file over :data:`STREAM_BYTES` (read head first, not whole)."""
    path = Path(corpus).expanduser()
    try:
        return path.suffix == ".txt" and path.is_file() and path.stat().st_size > STREAM_BYTES
    except OSError:
        return False


def _stream_head(tokenizer, corpus: str, n_tokens: int) -> tuple[np.ndarray, str, int]:
    """The first ``n_tokens`` content tokens of the .txt ``corpus`` (or all, if fewer), the
    sha256 (16 hex digits) of its whole text as :func:`corpus_hash` computes it, and the
    characters tokenized. Memory is bounded by :data:`STREAM_CHARS` and ``n_tokens``."""
    h = hashlib.sha256()
    parts: list[np.ndarray] = []
    have, n_chars, carry = 0, 0, ""
    try:
        with Path(corpus).expanduser().open(encoding="utf-8") as fh:
            while True:
                block = fh.read(STREAM_CHARS)
                h.update(block.encode("utf-8"))  # the whole file is hashed, in bounded steps
                if have >= n_tokens:
                    if not block:
                        break
                    continue
                text = carry + block
                if block:
                    cut = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t"))
                    cut = cut if cut > 0 else len(text)
                    text, carry = text[:cut], text[cut:]
                else:
                    carry = ""
                if text:
                    ids = _content_stream(tokenizer, [text], None)
                    parts.append(ids[: n_tokens - have])
                    have += len(parts[-1])
                    n_chars += len(text)
                if not block:
                    break
    except (OSError, UnicodeDecodeError) as err:
        detail = " ".join(str(err).split()) or type(err).__name__
        raise CorpusError(f"corpus {corpus!r} could not be read: {detail}") from None
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return stream, h.hexdigest()[:16], n_chars


def read_documents(corpus: str) -> list[str]:
    """The documents of ``corpus`` (``default``, .txt, .jsonl ``text``, .parquet ``text``, dir;
    a probe, ``probe:...``, has none: :func:`corpus_windows` draws its windows)."""
    if corpus == DEFAULT_CORPUS:
        return [default_corpus_text()]
    path = Path(corpus).expanduser()
    if not path.exists():
        raise CorpusError(
            f"corpus {corpus!r} does not exist; pass 'default', a .txt/.jsonl/.parquet file "
            "or a directory of .txt files"
        )
    try:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix == ".txt" and p.is_file())
            if not files:  # an image model's folder of images never comes here (vision.py)
                from attnbase.extract.vision import IMAGE_SUFFIXES

                raise CorpusError(f"corpus directory {corpus!r} holds no .txt files (text) "
                                  f"and no {'/'.join(IMAGE_SUFFIXES)} images; add some")
            return [p.read_text(encoding="utf-8") for p in files]
        if path.suffix == ".txt":
            return [path.read_text(encoding="utf-8")]
        if path.suffix == ".jsonl":
            docs = []
            with path.open(encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    rec = json.loads(line)
                    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                        raise CorpusError(
                            f"corpus {corpus!r} line {n} has no string 'text' field; "
                            'each line must be a JSON object like {"text": "..."}'
                        )
                    docs.append(rec["text"])
            return docs
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            if "text" not in table.column_names:
                raise CorpusError(
                    f"corpus {corpus!r} has no 'text' column (columns: "
                    f"{', '.join(table.column_names)}); rename the text column to 'text'"
                )
            return [t for t in table.column("text").to_pylist() if t is not None]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        if isinstance(err, CorpusError):
            raise
        # RecursionError: JSON nested deeper than the parser's recursion limit (fuzzing found it)
        detail = " ".join(str(err).split()) or type(err).__name__
        raise CorpusError(f"corpus {corpus!r} could not be read: {detail}") from None
    raise CorpusError(
        f"corpus {corpus!r} has unsupported suffix {path.suffix!r}; use one of "
        f"{', '.join(CORPUS_SUFFIXES)} or a directory of .txt files"
    )


def corpus_hash(docs: list[str]) -> str:
    """Short sha256 of the raw text (documents joined by a record separator)."""
    h = hashlib.sha256()
    for i, d in enumerate(docs):
        if i:
            h.update(b"\x1e")
        h.update(d.encode("utf-8"))
    return h.hexdigest()[:16]


def sink_convention(tokenizer, causal: bool, bos: str = "auto") -> SinkConvention:
    """BERT-style ``[CLS] ... [SEP]`` for encoders with both; else BOS prefix where one exists.

    ``bos="none"`` (causal models only): no prefix, position 0 is the first content token."""
    if bos not in ("auto", "none"):
        raise CorpusError(f"unknown --bos {bos!r}; use auto or none")
    if bos == "none" and not causal:
        raise CorpusError("--bos none applies to causal LMs only; an encoder keeps its "
                          "[CLS] ... [SEP] (drop --bos none)")
    cls_id = getattr(tokenizer, "cls_token_id", None)
    sep_id = getattr(tokenizer, "sep_token_id", None)
    bos_id = getattr(tokenizer, "bos_token_id", None)
    eos_id = getattr(tokenizer, "eos_token_id", None)
    if not causal and cls_id is not None and sep_id is not None:
        return SinkConvention(prefix=(cls_id,), suffix=(sep_id,), separator=sep_id)
    if bos_id is not None and bos == "auto":
        return SinkConvention(prefix=(bos_id,), suffix=(), separator=eos_id)
    # no sink token at all: position 0 is ordinary content
    return SinkConvention(prefix=(), suffix=(), separator=eos_id if eos_id is not None else sep_id)


def sink_token(tokenizer, causal: bool, bos: str = "auto") -> str:
    """The token string at position 0 of every window (:data:`NO_SINK_TOKEN` when it is text)."""
    conv = sink_convention(tokenizer, causal, bos)
    return tokenizer.convert_ids_to_tokens(conv.prefix[0]) if conv.prefix else NO_SINK_TOKEN


#: (tokenizer fingerprint, corpus hash, separator) -> content stream; re-tokenizing the default
#: corpus (~465k characters) costs ~0.3 s, and preflight, the load, tests, resumes and flows ask
#: for it repeatedly, each with its own tokenizer object of the same files.
_STREAMS: dict[tuple, object] = {}  # also (stream, hash, chars) of a streamed head
#: tokenizer object -> its fingerprint (computed once per object)
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fingerprint(tokenizer) -> tuple | None:
    """What decides a fast tokenizer's ids: its class and the sha256 of its serialized backend
    (vocabulary, merges, normalizer, pre-tokenizer, added tokens, truncation). Two
    tokenizers loaded from the same files share it. None (no cache) for tokenizers without a
    ``tokenizers`` backend or that cannot be weak-referenced."""
    try:
        fp = _FINGERPRINTS.get(tokenizer)
    except TypeError:
        return None
    if fp is None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        try:
            text = backend.to_str()
        except Exception:  # noqa: BLE001 - a backend that cannot serialize: no cache
            return None
        fp = (type(tokenizer).__qualname__, hashlib.sha256(text.encode("utf-8")).hexdigest())
        _FINGERPRINTS[tokenizer] = fp
    return fp


def _cached_stream(tokenizer, docs: list[str], digest: str, separator: int | None) -> np.ndarray:
    fp = _fingerprint(tokenizer)
    if fp is None:
        return _content_stream(tokenizer, docs, separator)
    key = (fp, digest, separator)
    stream = _STREAMS.get(key)
    if stream is None:
        if len(_STREAMS) >= 8:
            _STREAMS.clear()
        stream = _content_stream(tokenizer, docs, separator)
        stream.flags.writeable = False
        _STREAMS[key] = stream
    return stream


def _content_stream(tokenizer, docs: list[str], separator: int | None) -> np.ndarray:
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # silence "sequence longer than model max length"
    try:
        ids = tokenizer(docs, add_special_tokens=False)["input_ids"] if docs else []
    finally:
        hf_logging.set_verbosity(verbosity)
    parts: list[list[int]] = []
    for i, doc_ids in enumerate(ids):
        if i and separator is not None:
            parts.append([separator])
        parts.append(doc_ids)
    flat = [t for p in parts for t in p]
    return np.asarray(flat, dtype=np.int64)


def corpus_windows(lm, corpus: str, n_seqs: int, seq_len: int, seed: int,
                   bos: str = "auto") -> CorpusWindows:
    """Pick ``n_seqs`` windows of ``seq_len`` tokens from ``corpus`` for the loaded model ``lm``
    (``bos``: :func:`sink_convention`).

    Returns :class:`CorpusWindows` with ``tokens`` int32 ``[seq, pos]``; windows are chosen with
    ``numpy.random.default_rng(seed)`` without replacement and kept in corpus order.
    """
    from attnbase.extract import vision

    if vision.is_image_corpus(corpus):
        return CorpusWindows(**vision.image_windows(lm, corpus, n_seqs, seed))
    if getattr(lm, "processor", None) is not None:
        raise CorpusError(f"model {lm.info.model!r} reads images but corpus {corpus!r} is text; "
                          f"use --corpus {vision.SAMPLE} or a directory of PNG/JPEG files")
    conv = sink_convention(lm.tokenizer, lm.info.causal, bos)
    if probes.is_probe(corpus):  # built-in synthetic windows (extract/probes.py)
        tokens, digest = probes.probe_tokens(lm.tokenizer, corpus, conv.prefix, conv.suffix,
                                             n_seqs, seq_len, seed)
        return CorpusWindows(tokens=tokens, corpus=corpus, corpus_hash=digest,
                             n_available=n_seqs)
    width = seq_len - conv.n_special
    if width < 1:
        raise CorpusError(f"--seq-len {seq_len} leaves no room for content after {conv.n_special} special tokens")
    read = None
    if is_streamed(corpus):
        limit = max(STREAM_TOKENS, n_seqs * width)
        st = Path(corpus).expanduser().stat()
        size = st.st_size
        fp = _fingerprint(lm.tokenizer)
        key = (fp, ("head", str(Path(corpus).expanduser().resolve()), size, st.st_mtime_ns, limit))
        hit = _STREAMS.get(key) if fp is not None else None
        if hit is None:
            hit = _stream_head(lm.tokenizer, corpus, limit)
            hit[0].flags.writeable = False
            if fp is not None:
                if len(_STREAMS) >= 8:
                    _STREAMS.clear()
                _STREAMS[key] = hit
        stream, digest, n_chars = hit
        read = {"corpus_read": f"windows drawn from the first {len(stream)} content tokens "
                               f"({n_chars} characters) of {size} bytes (files over "
                               f"{STREAM_BYTES} bytes are read head first)"}
    else:
        docs = read_documents(corpus)
        digest = corpus_hash(docs)
        stream = _cached_stream(lm.tokenizer, docs, digest, conv.separator)
    n_available = len(stream) // width
    if len(stream) == 0:
        raise CorpusError(f"corpus {corpus!r} is empty (0 tokens); give it some text")
    if n_available < n_seqs:
        raise CorpusError(
            f"corpus {corpus!r} yields only {n_available} windows of {seq_len} tokens "
            f"({len(stream)} content tokens) but {n_seqs} were asked; lower --seqs or --seq-len "
            "or use a larger corpus"
        )
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(n_available, size=n_seqs, replace=False))
    content = stream[: n_available * width].reshape(n_available, width)[picks]
    pre = np.broadcast_to(np.asarray(conv.prefix, dtype=np.int64), (n_seqs, len(conv.prefix)))
    suf = np.broadcast_to(np.asarray(conv.suffix, dtype=np.int64), (n_seqs, len(conv.suffix)))
    tokens = np.concatenate([pre, content, suf], axis=1).astype(np.int32)
    return CorpusWindows(tokens=tokens, corpus=corpus, corpus_hash=digest, n_available=n_available,
                         read=read)
