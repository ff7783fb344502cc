"""Fuzzing (hypothesis) the corpus readers, the pre-load checks and run names: every input
either works or fails with one ``AttnbaseError`` line, and nothing is written (issue 10)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbase.errors import AttnbaseError, CorpusError, WarehouseError
from attnbase.extract.config import ExtractConfig
from attnbase.extract.corpus import read_documents
from attnbase.extract.preflight import preflight
from attnbase.warehouse.runs.writer import check_run_id

FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["text", "t", ""]),
                                                                 inner, max_size=3),
    max_leaves=8)
jsonl_lines = st.one_of(
    json_values.map(json.dumps),
    st.text(max_size=40),  # not JSON at all
    st.just(json.dumps({"text": ""})),  # empty field
    st.just("[" * 5000),  # nesting deep enough to exhaust the parser's recursion
    st.integers(10_000, 300_000).map(lambda n: json.dumps({"text": "x" * n})),  # a huge line
)


def _files(tmp_path):
    return sorted(p.name for p in tmp_path.rglob("*"))


def _read_works_or_fails_in_one_line(d, p) -> None:
    """Reading corpus ``p`` gives documents (str) or one CorpusError line; ``d`` gains no file."""
    try:
        docs = read_documents(str(p))
    except CorpusError as err:
        _one_line(err)
    else:
        assert all(isinstance(t, str) for t in docs)
    assert _files(d) == [p.name]


def _one_line(err: Exception) -> None:
    assert isinstance(err, AttnbaseError), repr(err)
    assert "\n" not in str(err) and str(err)


@FUZZ
@given(data=st.binary(max_size=2000), suffix=st.sampled_from([".txt", ".jsonl", ".parquet"]))
def test_arbitrary_bytes(tmp_path_factory, data, suffix):
    d = tmp_path_factory.mktemp("c")
    p = d / f"corpus{suffix}"
    p.write_bytes(data)
    _read_works_or_fails_in_one_line(d, p)


@FUZZ
@given(lines=st.lists(jsonl_lines, max_size=6),
       encoding=st.sampled_from(["utf-8", "utf-16", "latin-1"]))
def test_jsonl_lines_and_encodings(tmp_path_factory, lines, encoding):
    d = tmp_path_factory.mktemp("j")
    p = d / "c.jsonl"
    p.write_bytes("\n".join(lines).encode(encoding, errors="replace"))
    _read_works_or_fails_in_one_line(d, p)


@FUZZ
@given(text=st.text(max_size=300), seqs=st.integers(-2, 50), seq_len=st.integers(-2, 700))
def test_preflight_works_or_fails_in_one_line(tmp_path_factory, text, seqs, seq_len):
    d = tmp_path_factory.mktemp("p")
    model = d / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 512}))
    corpus = d / "c.txt"
    corpus.write_text(text, encoding="utf-8")
    before = _files(d)
    try:
        preflight(ExtractConfig(model=str(model), corpus=str(corpus), n_seqs=seqs, seq_len=seq_len))
    except AttnbaseError as err:
        _one_line(err)
    assert _files(d) == before


@FUZZ
@given(name=st.text(max_size=140))
def test_run_names(name):
    try:
        check_run_id(name)
    except WarehouseError as err:
        _one_line(err)
        assert "invalid run name" in str(err)
    else:
        assert name and name[0].isascii() and name[0].isalnum() and len(name) <= 128


def test_deep_json_nesting_is_one_line(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("[" * 100_000)
    with pytest.raises(CorpusError) as exc:
        read_documents(str(p))
    _one_line(exc.value)
