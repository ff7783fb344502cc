"""A model directory without a real tokenizer is refused before any work (issue 44 item 2)."""

from __future__ import annotations

import pytest

from attnbase.errors import ExtractError
from attnbase.warehouse import open_run


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """The tiny-gpt2 alias saved twice: weights only, and weights with their tokenizer."""
    from attnbase.extract import load_model

    lm = load_model("tiny-gpt2", dtype="float32", device="cpu")
    bare = tmp_path_factory.mktemp("bare")
    full = tmp_path_factory.mktemp("full")
    for d in (bare, full):
        lm.model.save_pretrained(d)
    lm.tokenizer.save_pretrained(full)
    return bare, full


def _extract(cli, model, db):
    return cli("extract", "--db", db, "--model", model, "--seqs", 2, "--seq-len", 16,
               "--run", "t", "-q")


def test_directory_without_tokenizer_files_refused(cli, tiny_dirs, tmp_path):
    bare, _ = tiny_dirs
    db = tmp_path / "db"
    code, out, err = _extract(cli, bare, db)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert str(bare) in err and "tokenizer.json" in err and "save_pretrained" in err
    assert not db.exists()  # refused before any work: no database created


def test_directory_with_tokenizer_extracts(cli, tiny_dirs, tmp_path, load_lm):
    _, full = tiny_dirs
    db = tmp_path / "db"
    code, _, err = _extract(cli, full, db)
    assert code == 0, err
    tokens = open_run(db, "t")["tokens"].values
    assert tokens.shape == (2, 16)
    assert len(set(tokens.ravel().tolist())) > 8  # real words, not one unk id repeated


def test_unk_only_tokenizer_is_degenerate():
    from attnbase.extract.models import check_tokenizer
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]")
    assert tok("a normal sentence here")["input_ids"] == [1, 1, 1, 1]  # the issue's [.., 1, 1, 1]
    with pytest.raises(ExtractError, match="degenerate.*tokenizer.json"):
        check_tokenizer(tok, "m")


def test_real_tokenizer_passes(load_lm):
    from attnbase.extract.models import check_tokenizer

    check_tokenizer(load_lm("tiny-gpt2").tokenizer, "tiny-gpt2")  # no error
    check_tokenizer(load_lm("minilm").tokenizer, "minilm")
