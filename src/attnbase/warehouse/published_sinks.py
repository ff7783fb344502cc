"""Gu et al.'s published Sink_1^eps rows as reference data, and which runs they pair with.

The twelve rows ship with the package (``attnbase/data/published_sinks.csv``: Gu et al., "When
Attention Sink Emerges in Language Models", ICLR 2025, Table 1, the values as printed, the source
in every row): four models x three inputs (natural text, random tokens, one repeated token) on
64-token windows with eps = 0.3. ``attnbase sinks --published`` prints them and pairs each run
of the database with the row of its model and setup (:func:`pair_run`), or says why none.

Our ``sink_rate`` (docs/metrics.md §3b) is their Sink_1^eps: the fraction of (layer, head) whose
attention on position 0, averaged over windows and every query, exceeds eps. A run's setup is
read from what it records: ``runs.model``, ``runs.corpus`` (``probe:random`` and
``probe:repeat-token`` are the paper's random and repeated-token inputs, any text corpus is
natural text), ``runs.seq_len`` (window length, special tokens included) and
``run_metrics.sink_rate_eps``.
"""

from __future__ import annotations

import csv
import io
from functools import lru_cache
from importlib import resources

#: The CSV's columns, in order.
COLUMNS = ("model", "hub_id", "input", "seq_len", "eps", "sink_rate_percent", "source")
#: The paper's inputs, in its order, and the corpus that gives each here (None: any text corpus).
INPUTS = {"natural": None, "random": "probe:random", "repeat-token": "probe:repeat-token"}
#: Corpora that are no input of the paper: the other probes and the image corpora.
OTHER_CORPUS_PREFIXES = ("probe:", "images:")
SOURCE = ("Gu et al., \"When Attention Sink Emerges in Language Models\", ICLR 2025 "
          "(arXiv:2410.10781), Table 1")
#: Tolerance of an eps comparison (the run's eps is stored as a DOUBLE).
EPS_TOL = 1e-9


@lru_cache(maxsize=1)
def _rows() -> tuple[dict, ...]:
    text = resources.files("attnbase").joinpath("data/published_sinks.csv").read_text("utf-8")
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ValueError(f"published_sinks.csv has columns {reader.fieldnames}; "
                         f"expected {list(COLUMNS)}")
    rows = []
    for rec in reader:
        if rec["input"] not in INPUTS:
            raise ValueError(f"published_sinks.csv: input {rec['input']!r} is not one of "
                             f"{', '.join(INPUTS)}")
        rows.append({**rec, "seq_len": int(rec["seq_len"]), "eps": float(rec["eps"]),
                     "sink_rate_percent": float(rec["sink_rate_percent"])})
    return tuple(rows)


def percent(value) -> str:
    """A fraction printed as the paper prints Sink_1^eps (percent, 2 decimals); "-" if missing."""
    return "-" if value is None or value != value else f"{100 * float(value):.2f}"


def published_sink_rows() -> list[dict]:
    """The published rows, in the file's order (model, then input), as dicts of :data:`COLUMNS`."""
    return [dict(r) for r in _rows()]


def published_models() -> list[str]:
    """The paper's model names, in its order."""
    return list(dict.fromkeys(r["model"] for r in _rows()))


def _hub_key(model: str) -> str:
    return model.split("@", 1)[0].strip().rstrip("/").lower()


def model_rows(model: str | None) -> list[dict]:
    """The published rows of ``model`` (a hub id, optionally ``@revision``; the unprefixed
    ``gpt2-xl`` counts), [] for any other model."""
    if not model:
        return []
    key = _hub_key(model)
    out = []
    for row in _rows():
        hub = row["hub_id"].lower()
        if key == hub or ("/" not in key and hub.startswith("openai-community/")
                          and key == hub.split("/", 1)[1]):
            out.append(dict(row))
    return out


def run_input(corpus: str | None) -> str | None:
    """The paper's input a run's ``corpus`` is: ``random``, ``repeat-token``, ``natural`` (a
    text corpus), or None (another probe, an image corpus, no corpus)."""
    if not corpus:
        return None
    for name, probe in INPUTS.items():
        if probe is not None and corpus == probe:
            return name
    if corpus.startswith(OTHER_CORPUS_PREFIXES):
        return None
    return "natural"


def pair_run(model: str | None, corpus: str | None, seq_len: int | None,
             eps: float | None) -> tuple[dict | None, list[str]]:
    """The published row a run of this model and setup reproduces, or None with every reason it
    does not: a different model, probe, window length or eps (each named with the paper's)."""
    reasons = []
    rows = model_rows(model)
    if not rows:
        reasons.append(f"different model: {model or '-'} is none of the paper's "
                       f"({', '.join(published_models())})")
    kind = run_input(corpus)
    if kind is None:
        reasons.append(f"different probe: {corpus or '-'} is none of the paper's inputs "
                       "(a text corpus, probe:random, probe:repeat-token)")
    want = rows[0] if rows else _rows()[0]
    if seq_len != want["seq_len"]:
        reasons.append(f"different length: {seq_len} tokens, the paper's are {want['seq_len']}")
    if eps is None:
        reasons.append("no sink_rate: run `attnbase analyze` first")
    elif abs(eps - want["eps"]) > EPS_TOL:
        reasons.append(f"different eps: {eps:g}, the paper's is {want['eps']:g}")
    if reasons:
        return None, reasons
    return next(r for r in rows if r["input"] == kind), []
