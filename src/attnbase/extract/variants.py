"""Ablation variants (model surgery) and random re-initialisation, for rank collapse across depth.

Dong, Cordonnier & Loukas (2021), "Attention is not all you need", Fig. 1 / Sec. 4: the same
pretrained network with its skip connections and/or MLPs removed, and its randomly initialised
twin. Variants, applied to every block:

``full``            the model as is.
``no-mlp``          the MLP sub-block is dropped: its branch contributes nothing.
``no-skip``         both residual connections are removed: each sub-block's output replaces
                    the stream instead of being added to it.
``attention-only``  neither skip nor MLP: the block is its attention sub-block (with its norms).

LayerNorm/RMSNorm stay everywhere (the paper: they do not prevent collapse). Surgery is done
with forward hooks on the family's real module paths, so the model's own forward runs:

- pre-LN blocks (``gpt2``: ``ln_1, attn, ln_2, mlp``; ``llama``: ``input_layernorm, self_attn,
  post_attention_layernorm, mlp``) compute ``h + f(norm(h))``; removing the skip makes the
  branch return ``f(norm(h)) - h`` (``h`` read by a pre-hook on the norm), so the block's own
  addition yields ``f(norm(h))``; dropping the MLP makes its branch return zeros.
- post-LN BERT (``attention.output`` = ``LayerNorm(dense(a) + h)``, ``output`` =
  ``LayerNorm(dense(m) + a)``): removing the skip replaces the ``input_tensor`` argument by zeros;
  dropping the MLP makes ``output`` return its ``input_tensor`` (the attention sub-block's output).

``init="random"``: the same architecture (config) re-initialised with HF's own ``_init_weights``
under ``torch.manual_seed(seed)``; ``model_revision`` says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from attnbase.errors import ExtractError, UnsupportedArchitectureError
from attnbase.extract.config import INITS, VARIANTS
from attnbase.extract.families.base import _resolve
from attnbase.private_api import read


def check_variant(variant: str, init: str = "pretrained") -> None:
    if variant not in VARIANTS:
        raise ExtractError(f"unknown variant {variant!r}; use one of {', '.join(VARIANTS)}")
    if init not in INITS:
        raise ExtractError(f"unknown init {init!r}; use one of {', '.join(INITS)}")


def _first(args: tuple, kwargs: dict, name: str) -> torch.Tensor:
    return args[0] if args else kwargs[name]


def _replace_out(out: Any, new: torch.Tensor) -> Any:
    return (new, *out[1:]) if isinstance(out, tuple) else new


def _branch_out(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _prenorm(norm1: str, attn: str, norm2: str, mlp: str) -> Callable:
    def surgery(block: torch.nn.Module, variant: str) -> list:
        no_skip = variant in ("no-skip", "attention-only")
        no_mlp = variant in ("no-mlp", "attention-only")
        handles, seen = [], {}

        def remember(key):
            def pre(_m, args, kwargs):
                seen[key] = _first(args, kwargs, "hidden_states")
            return pre

        def minus(key):
            def post(_m, _args, out):
                return _replace_out(out, _branch_out(out) - seen.pop(key))
            return post

        def zero(_m, _args, out):
            return _replace_out(out, torch.zeros_like(_branch_out(out)))

        if no_skip:
            handles.append(_resolve(block, norm1, "norm").register_forward_pre_hook(
                remember("attn"), with_kwargs=True))
            handles.append(_resolve(block, attn, "attention").register_forward_hook(minus("attn")))
        if no_mlp:
            handles.append(_resolve(block, mlp, "mlp").register_forward_hook(zero))
        elif no_skip:
            handles.append(_resolve(block, norm2, "norm").register_forward_pre_hook(
                remember("mlp"), with_kwargs=True))
            handles.append(_resolve(block, mlp, "mlp").register_forward_hook(minus("mlp")))
        return handles

    return surgery


def _bert(block: torch.nn.Module, variant: str) -> list:
    no_skip = variant in ("no-skip", "attention-only")
    no_mlp = variant in ("no-mlp", "attention-only")
    handles = []

    def zero_skip(_m, args, kwargs):
        if len(args) >= 2:
            return (args[0], torch.zeros_like(args[1]), *args[2:]), kwargs
        return args, {**kwargs, "input_tensor": torch.zeros_like(kwargs["input_tensor"])}

    def attention_output(_m, args, kwargs, _out):
        return args[1] if len(args) >= 2 else kwargs["input_tensor"]

    if no_skip:
        handles.append(_resolve(block, "attention.output", "attention output").register_forward_pre_hook(
            zero_skip, with_kwargs=True))
    if no_mlp:
        handles.append(_resolve(block, "output", "MLP output").register_forward_hook(
            attention_output, with_kwargs=True))
    elif no_skip:
        handles.append(_resolve(block, "output", "MLP output").register_forward_pre_hook(
            zero_skip, with_kwargs=True))
    return handles


#: family -> surgery(block, variant) -> hook handles.
SURGERY: dict[str, Callable] = {
    "bert": _bert,
    "gpt2": _prenorm("ln_1", "attn", "ln_2", "mlp"),
    "llama": _prenorm("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"),
}


def apply_variant(lm, variant: str) -> list:
    """Install ``variant`` on every block of ``lm`` (in place); returns the hook handles."""
    check_variant(variant)
    if variant == "full":
        return []
    surgery = SURGERY.get(lm.adapter.name)
    if surgery is None:
        raise UnsupportedArchitectureError(
            f"variant {variant!r} is not implemented for family {lm.adapter.name!r}; "
            f"families with ablation variants: {', '.join(SURGERY)}")
    handles = []
    for block in lm.adapter.blocks(lm.model):
        handles += surgery(block, variant)
    return handles


def reinit(lm, seed: int):
    """The same architecture with fresh HF initialisation (``torch.manual_seed(seed)``)."""
    from transformers import AutoModel

    old = lm.model
    dtype = next(old.parameters()).dtype
    torch.manual_seed(seed)
    impl = read(old.config, "transformers.PretrainedConfig._attn_implementation")
    model = AutoModel.from_config(old.config, attn_implementation=impl)
    model = model.to(dtype).eval().to(lm.device)
    info = replace(lm.info, model_revision=f"{lm.info.model_revision}+random-init:seed={seed}")
    return replace(lm, model=model, info=info)


def load_variant(name: str, variant: str = "full", init: str = "pretrained", seed: int = 0,
                 dtype: str = "float32", device: str = "auto"):
    """:func:`~attnbase.extract.load_model`, then ``init`` and ``variant`` applied."""
    from attnbase.extract.models import load_model

    check_variant(variant, init)
    lm = load_model(name, dtype=dtype, device=device)
    if init == "random":
        lm = reinit(lm, seed)
    apply_variant(lm, variant)
    return lm


def load_for_config(cfg):
    """The model an :class:`~attnbase.extract.config.ExtractConfig` asks for (variant, init)."""
    return load_variant(cfg.model, variant=cfg.variant, init=cfg.init, seed=cfg.init_seed,
                        dtype=cfg.dtype, device=cfg.device)
