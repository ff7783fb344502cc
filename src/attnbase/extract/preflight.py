"""Checks of an extraction request that need no model weights, run before any model is loaded.

``preflight(cfg)`` raises the same one-line errors the extraction itself would raise later, but
in a fraction of a second and before anything is written: the model's ``config.json`` (or an
alias's configuration) is read for its family and its maximum number of positions, the corpus
is read and must hold text, and its length is checked against the request, exactly with the
model's tokenizer where that is cheap to load (the bundled tiny tokenizer, a ``tokenizer.json``
next to a local model), otherwise by a bound no tokenizer can beat (a token covers at least
one byte, plus one "word start" piece per byte at most for SentencePiece tokenizers).
Errors name the flags as the user types them (``--seqs``, ``--seq-len``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from attnbase.errors import CorpusError, ExtractError
from attnbase.extract.config import ExtractConfig

#: config.json keys that hold a model's maximum number of positions, by family convention.
MAX_POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")


def max_positions(config: dict) -> int | None:
    """The maximum sequence length a model config allows, or None when it names none."""
    for key in MAX_POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _model_dir(name: str) -> Path | None:
    from attnbase.extract import models

    if name == "minilm":
        return models.minilm_path()
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise models._unknown(name, "is a path without a config.json")
        return path
    if models._looks_like_path(name):
        raise models._unknown(name, "does not exist")
    models.check_alias_typo(name)
    # a hub id (maybe cached) or a packaged alias (assembled on load): the load checks those
    return None


def model_config(name: str) -> tuple[dict | None, object | None]:
    """(config as a dict, a cheap tokenizer or None) of model ``name``, without its weights.

    ``(None, None)`` for a hub id or an alias this module does not know how to read cheaply.
    """
    from attnbase.extract import models

    if name in models.TINY_ALIASES:
        tok = models.tiny_tokenizer()
        cfg = models._tiny_config(name, len(tok), tok.bos_token_id, tok.eos_token_id)
        return cfg.to_dict(), tok
    path = _model_dir(name)
    if path is None:
        return None, None
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ExtractError(f"model directory {name!r} has an unreadable config.json ({err})") from None
    tok = None
    if (path / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError):
            tok = None  # the load proper reports it
    return config, tok


def config_shape(name: str) -> dict | None:
    """The shape of model ``name`` from its config.json where one is on disk (tiny aliases,
    MiniLM, local directories), without weights or network: family, n_layers, n_heads,
    n_kv_heads, d_head, d_model, rotary, causal, max_positions. None otherwise."""
    from transformers import AutoConfig

    from attnbase.extract.families import adapter_for_config

    config, _ = model_config(name)
    if config is None:
        return None
    hf = AutoConfig.for_model(**config)
    a = adapter_for_config(hf)
    return {"family": a.name, "n_layers": a.n_layers(hf), "n_heads": a.n_heads(hf),
            "n_kv_heads": a.n_kv_heads(hf), "d_head": a.d_head(hf), "d_model": a.d_model(hf),
            "rotary": a.rotary, "causal": a.causal, "max_positions": max_positions(config)}


def logits_recipe_placeholder(family: str, n_layers: int):
    """A stand-in :class:`~attnbase.contract.LogitsRecipe` for planning (byte counts) where the
    family's adapter derives its logits, else None: the real recipe needs the loaded modules."""
    from attnbase.contract import LogitsRecipe
    from attnbase.extract.families import FAMILIES

    adapter = FAMILIES.get(family)
    if adapter is None:
        from attnbase.extract.families import served_by
        from attnbase.extract.families.generic import modeling_source_facts

        try:  # a generic family is named by its model type; its recipe needs the model
            if served_by(family) is None:
                return LogitsRecipe(keys="keys_rot" if modeling_source_facts(family)["rotary"]
                                    else "keys", scale=(1.0,) * n_layers, causal=True,
                                    window=(None,) * n_layers)
        except Exception:  # noqa: BLE001 - an unserved family plans with stored logits
            return None
        return None
    if not adapter.derivable_logits:
        return None
    return LogitsRecipe(keys="keys_rot" if adapter.rotary else "keys", scale=(1.0,) * n_layers,
                        causal=adapter.causal, window=(None,) * n_layers)


def preflight(cfg: ExtractConfig) -> None:
    """Raise the first problem of ``cfg`` that can be found without loading weights."""
    from attnbase.extract.corpus import is_streamed, read_documents
    from attnbase.extract.families import adapter_for_config
    from attnbase.extract import vision

    if vision.is_image_corpus(cfg.corpus):  # the images load now; the model checks them later
        vision.corpus_sources(cfg.corpus, cfg.n_seqs, cfg.seed)
        from attnbase.extract.models import resolve_device

        resolve_device(cfg.device)
        return
    from attnbase.extract import probes

    if probes.is_probe(cfg.corpus):
        probes.probe_name(cfg.corpus)  # an unknown probe fails here, naming the built-in ones
        docs = None
    elif is_streamed(cfg.corpus):  # a large .txt: read head first by corpus_windows, not whole
        docs = None
    else:
        docs = read_documents(cfg.corpus)  # first: reading a file costs no torch import
    if docs is not None and not any(d.strip() for d in docs):
        raise CorpusError(f"corpus {cfg.corpus!r} is empty (no text in {len(docs)} document(s)); "
                          "give it some text")
    from attnbase.extract.models import resolve_device

    resolve_device(cfg.device)
    config, tok = model_config(cfg.model)
    causal = True
    if config is not None:
        from transformers import AutoConfig

        from attnbase.extract.families import served_by

        served_by(str(config.get("model_type", "")))  # an unknown type: one line, not a list
        adapter = adapter_for_config(AutoConfig.for_model(**config))
        causal = adapter.causal
        if cfg.bos == "none" and not causal:
            raise ExtractError(f"--bos none applies to causal LMs only; {cfg.model!r} is an "
                               "encoder and keeps its [CLS] ... [SEP] (drop --bos none)")
        top = max_positions(config)
        if top is not None and cfg.seq_len > top:
            raise ExtractError(
                f"--seq-len {cfg.seq_len} exceeds the {top} positions of model {cfg.model!r} "
                f"(its config.json); use --seq-len {top} or less")
    if tok is not None:
        from attnbase.extract.corpus import corpus_windows

        lm = SimpleNamespace(tokenizer=tok, info=SimpleNamespace(causal=causal))
        corpus_windows(lm, corpus=cfg.corpus, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len, seed=cfg.seed,
                       bos=cfg.bos)
        return
    if docs is None:  # a probe's windows need the tokenizer: checked when the model loads
        return
    n_special = 2  # at most: [CLS] ... [SEP]
    width = cfg.seq_len - n_special
    most_tokens = 2 * sum(len(d.encode("utf-8")) for d in docs) + len(docs)
    if width >= 1 and most_tokens < cfg.n_seqs * width:
        raise CorpusError(
            f"corpus {cfg.corpus!r} is too short: {most_tokens} tokens at most, but --seqs "
            f"{cfg.n_seqs} x --seq-len {cfg.seq_len} needs about {cfg.n_seqs * width}; lower "
            "--seqs or --seq-len or use a larger corpus")


def missing_model(model: str) -> str | None:
    """``model`` when it is a hub id that the local HF cache lacks (a real run downloads it),
    else None."""
    from attnbase.extract.models import ALIASES, split_revision

    if model in ALIASES or Path(model).expanduser().exists() or model.count("/") != 1:
        return None
    repo, rev = split_revision(model)
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(repo, "config.json", revision=rev), str):
            return None
    except Exception:  # noqa: BLE001 - unreadable cache: treat as not cached
        pass
    return model
