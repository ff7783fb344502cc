"""Regenerate the tiny models' byte-level BPE tokenizer shipped as package data.

Run ``python -m attnbase.extract.make_tokenizer`` to rewrite ``attnbase/data/tiny_tokenizer.json``.
Trained on the bundled English corpus (the stdlib's ``pydoc_data.topics``, see
:func:`attnbase.extract.corpus.default_corpus_text`); deterministic for a given ``tokenizers``
version, a few hundred milliseconds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

BOS, EOS = "<|bos|>", "<|eos|>"
VOCAB_SIZE = 3072
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
TOKENIZER_FILE = DATA_DIR / "tiny_tokenizer.json"


def train(vocab_size: int = VOCAB_SIZE):
    """Train and return a ``tokenizers.Tokenizer`` (byte-level BPE, special tokens BOS/EOS)."""
    from tokenizers import ByteLevelBPETokenizer

    from attnbase.extract.corpus import default_corpus_text

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        [default_corpus_text()],
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        show_progress=False,
    )
    return tok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=TOKENIZER_FILE)
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args(argv)
    tok = train(args.vocab_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, vocab {tok.get_vocab_size()})")


if __name__ == "__main__":
    main()
