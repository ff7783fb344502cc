"""Tokens as text (attnbase.tokentext): a byte-level BPE, a WordPiece and two SentencePiece-style
tokenizers (Metaspace + Unigram; BPE with byte fallback as Gemma's) each show a sentence's tokens
with visible whitespace, and the tokens' texts, marks undone, rebuild the sentence."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from attnbase.tokentext import token_labels, token_texts, tokenizer_for, visible

TEXT = "def f(x):\n    return x\nThe cat sat."
CORPUS = [TEXT, "the cat and the dog return home", "a café — naïve", "x = 1\n\ty = 2"] * 20


def _unmark(s: str) -> str:
    return s.replace("␣", " ").replace("⏎", "\n").replace("⇥", "\t")


def test_visible_marks_edges_and_control_characters():
    assert visible(" return") == "␣return"
    assert visible("\n   ") == "⏎␣␣␣"  # the spaces after the newline lead nothing: all shown
    assert visible("   ") == "␣␣␣"
    assert visible("a b") == "a b"  # a space inside a token is left as it is
    assert visible("\tx ") == "⇥x␣"


def test_byte_level_bpe_bundled_tokenizer():
    tok = tokenizer_for("tiny-gpt2")
    ids = tok.encode(TEXT).ids
    texts = token_texts(tok, ids)
    assert "␣return" in texts and "Ġreturn" not in texts
    assert any(t.startswith("⏎") for t in texts)
    assert not any("Ġ" in t or "Ċ" in t for t in texts)
    assert _unmark("".join(texts)) == TEXT  # the texts, marks undone, are the sentence
    # a character split over tokens shows its bytes, never a replacement character
    split = token_texts(tok, tok.encode("café—").ids)
    assert "\ufffd" not in "".join(split) and any("\\x" in t for t in split)


def test_wordpiece_minilm_keeps_pieces_and_specials():
    tok = tokenizer_for("minilm")
    enc = tok.encode("The catsitting returned")
    kept = [k for k, m in enumerate(enc.attention_mask) if m]  # the packaged file pads to 128
    texts = token_texts(tok, [enc.ids[k] for k in kept])
    assert texts[0] == "[CLS]" and texts[-1] == "[SEP]" and any(t.startswith("##") for t in texts)
    assert texts == [enc.tokens[k] for k in kept]  # WordPiece stores no spaces: its pieces


def _metaspace_unigram() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=80, special_tokens=["<s>"],
                                                            unk_token="<s>"))
    return tok


def _gemma_like_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<bos>"],
                                                        initial_alphabet=[], limit_alphabet=40))
    return tok


@pytest.mark.parametrize("make", [_metaspace_unigram, _gemma_like_bpe])
def test_sentencepiece_style_word_starts_read_as_spaces(make):
    tok = make()
    ids = tok.encode("the cat return").ids
    texts = token_texts(tok, ids)
    assert not any("▁" in t for t in texts)
    assert sum(t.startswith("␣") for t in texts) == 3  # each word's start, once
    assert _unmark("".join(texts)).strip() == "the cat return"


def test_labels_name_their_source_and_fall_back_to_ids(tmp_path: Path):
    labels, source = token_labels("tiny-llama", [0, 1])
    assert len(labels) == 2 and "decoded" in source
    labels, source = token_labels(str(tmp_path / "no-model"), [5, 7])
    assert labels == ["#5", "#7"] and "no tokenizer" in source
