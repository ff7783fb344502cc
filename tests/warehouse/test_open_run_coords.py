"""``open_run`` gives coordinates, not bare dimensions: an integer index on every dim (layer,
head, seq, pos, query, key, ...) and the token strings (``token (seq, pos)``, ``query_token``,
``key_token``) decoded by the run's tokenizer."""

from __future__ import annotations

import dataclasses

import numpy as np
from fakes import fake_batches, fake_config, fake_info

from attnbase.runner import ingest_batches
from attnbase.tokentext import token_labels
from attnbase.warehouse import Database, open_run


def _run(tmp_path, model: str):
    info = dataclasses.replace(fake_info(n_layers=2, n_heads=3), model=model)
    cfg = fake_config(model=model)
    db = Database(tmp_path / "db")
    ingest_batches(db, "r", cfg, info=info, corpus="default", corpus_hash="c",
                   batches=fake_batches(info, cfg, seed=1), progress=False)
    return open_run(db.path, "r")


def test_every_dim_has_an_integer_coordinate(tmp_path):
    ds = _run(tmp_path, "fake")
    for dim in ("layer", "head", "seq", "pos", "query", "key", "hidden_layer"):
        assert dim in ds.coords and ds[dim].values.tolist() == list(range(ds.sizes[dim])), dim
    one = ds["attn_logits"].sel(layer=1, head=2, seq=3)
    np.testing.assert_array_equal(one.values, ds["attn_logits"].values[1, 2, 3])
    assert not ds["attn_logits"].variable._in_memory  # the arrays stay lazy


def test_token_strings_are_coordinates_decoded_by_the_runs_tokenizer(tmp_path):
    """tiny-* models ship their tokenizer: the coordinate is token_labels' text of each id."""
    ds = _run(tmp_path, "tiny-gpt2")
    ids = ds["tokens"].values
    want, source = token_labels("tiny-gpt2", ids.ravel().tolist())
    assert ds["token"].dims == ("seq", "pos")
    assert ds["token"].values.ravel().tolist() == want
    assert not any(t.startswith("#") for t in want)  # real text, not ids
    assert ds.attrs["token_source"] == source
    pattern = ds["attn_logits"].isel(layer=0, head=0, seq=2)
    assert pattern["query_token"].values.tolist() == want[2 * ids.shape[1]:3 * ids.shape[1]]
    assert pattern["key_token"].values.tolist() == pattern["query_token"].values.tolist()


def test_without_a_tokenizer_the_tokens_are_labelled_by_id(tmp_path):
    """Negative control: a model with no tokenizer file gets "#<id>" labels, and says so."""
    ds = _run(tmp_path, "fake")
    ids = ds["tokens"].values
    assert ds["token"].values.ravel().tolist() == [f"#{i}" for i in ids.ravel()]
    assert "no tokenizer" in ds.attrs["token_source"]
