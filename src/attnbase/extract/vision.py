"""Vision transformers: image corpora, token layouts, sink sets and the tiny seeded configs.

ViT, DeiT and DINOv2 with registers route attention through transformers' attention interface,
so the generic capture (:mod:`attnbase.extract.families.generic`) reads them; this module holds
what is particular to images:

- **token layout** (:func:`token_names`): ``[CLS]``, then DeiT's distillation token ``[DIST]`` or
  DINOv2's registers ``reg0 .. reg{R-1}``, then the patches ``p(row,col)`` in raster order. The
  run's ``tokens`` array holds the position index ``0 .. T-1`` of every window (images have no
  token ids); the names follow from the layout.
- **sink sets** (:func:`sink_positions`; docs/metrics.md "Sink sets"): every token before the
  patches: ``[0]`` for ViT, ``[0, 1]`` for DeiT, ``[0 .. R]`` for DINOv2 with R registers.
- **image corpora** (:func:`image_windows`): ``images:sample`` (scikit-learn's
  ``load_sample_images()``, two 427 x 640 photographs, cut into seeded square crops so that
  ``--seqs N`` gives N distinct windows) or a directory of PNG/JPEG files (name order, one whole
  image per window; one over :data:`MAX_IMAGE_PIXELS`, read from its header, is refused before
  decoding). Pixels are prepared by the model's own image processor; each window records
  its source (file and crop box ``x0, y0, x1, y1``), stored in the catalog's ``seq_sources``.
- **tiny seeded configs** (``tiny-vit``, ``tiny-deit``, ``tiny-dinov2-reg``): 3 layers x 4 heads,
  d_model 64, 64 x 64 pixels in 16 x 16 patches (17, 18 and 21 tokens), as image classifiers
  with 10 labels (so ``study prune`` can judge top-1 agreement), their processor built offline.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnbase.errors import CorpusError

#: The model types whose images this module lays out (their token layout is known).
VISION_TYPES = ("vit", "deit", "dinov2_with_registers")
#: Corpus names of the bundled photographs.
SAMPLE = "images:sample"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
TINY_VISION = {"tiny-vit": "vit", "tiny-deit": "deit", "tiny-dinov2-reg": "dinov2_with_registers"}
TINY_SHAPE = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=128, image_size=64, patch_size=16, num_labels=10)
TINY_REGISTERS = 4
#: The most pixels (width x height, read from the file's header before decoding) of one corpus
#: image: 50 MP, 150 MB as RGB. A small PNG can declare far more pixels than its size suggests
#: (benchmarks/RESULTS.md); larger images are refused with one line, not decoded.
MAX_IMAGE_PIXELS = 50_000_000
#: Crops of ``images:sample`` are squares of at least this share of the photograph's short side.
MIN_CROP = 0.5


def is_vision(config) -> bool:
    return getattr(config, "model_type", None) in VISION_TYPES


def is_image_corpus(corpus: str) -> bool:
    """``images:...``, or a directory holding PNG/JPEG files and no .txt files."""
    if str(corpus).startswith("images:"):
        return True
    p = Path(corpus).expanduser()
    if not p.is_dir():
        return False
    names = [f.suffix.lower() for f in p.iterdir() if f.is_file()]
    return any(s in IMAGE_SUFFIXES for s in names) and ".txt" not in names


def extra_tokens(config) -> tuple[str, ...]:
    """The tokens before the patches: ``[CLS]`` (+ ``[DIST]`` for DeiT, + ``reg<i>`` for
    DINOv2 with registers)."""
    kind = config.model_type
    if kind == "deit":
        return ("[CLS]", "[DIST]")
    if kind == "dinov2_with_registers":
        return ("[CLS]", *(f"reg{i}" for i in range(int(config.num_register_tokens))))
    return ("[CLS]",)


def grid(config) -> int:
    """Patches per side (the processor resizes every image to ``image_size``)."""
    return int(config.image_size) // int(config.patch_size)


def n_tokens(config, pixels_hw: tuple[int, int] | None = None) -> int:
    """Tokens per image: the extra tokens and one per patch of the processed image (its height
    and width ``pixels_hw``; by default ``image_size`` square). DINOv2 checkpoints declare
    ``image_size`` 518 but their processor crops 224: the pixels decide."""
    h, w = pixels_hw or (int(config.image_size), int(config.image_size))
    p = int(config.patch_size)
    return len(extra_tokens(config)) + (h // p) * (w // p)


def sink_positions(config) -> tuple[int, ...]:
    """Every position before the patches (docs/metrics.md "Sink sets").

    >>> from types import SimpleNamespace as C
    >>> sink_positions(C(model_type="dinov2_with_registers", num_register_tokens=4))
    (0, 1, 2, 3, 4)
    """
    return tuple(range(len(extra_tokens(config))))


def token_names(config) -> list[str]:
    """``[CLS]``, ``[DIST]`` / ``reg<i>``, then ``p(row,col)`` in raster order.

    >>> from types import SimpleNamespace as C
    >>> token_names(C(model_type="deit", image_size=32, patch_size=16))
    ['[CLS]', '[DIST]', 'p(0,0)', 'p(0,1)', 'p(1,0)', 'p(1,1)']
    """
    from attnbase.contract import image_token_names

    return image_token_names(config.model_type, len(extra_tokens(config)), n_tokens(config))


def classifier_class(model_type: str):
    """The ``...ForImageClassification`` class of a vision model type."""
    import transformers

    from attnbase.private_api import resolve

    names = resolve(
        "transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES")

    cls = names[model_type]
    return getattr(transformers, cls[0] if isinstance(cls, tuple) else cls)


def tiny_config(alias: str):
    """The seeded tiny classifier config of ``alias`` (:data:`TINY_VISION`)."""
    from transformers import AutoConfig

    kind = TINY_VISION[alias]
    extra = {"num_register_tokens": TINY_REGISTERS} if kind == "dinov2_with_registers" else {}
    return AutoConfig.for_model(kind, **TINY_SHAPE, **extra)


def tiny_processor(config):
    """An image processor for a tiny config, built offline: resize to ``image_size`` square,
    rescale to [0, 1], normalise with ImageNet's mean and sd (as the pretrained ViTs do)."""
    from transformers import ViTImageProcessorPil  # the PIL backend: no torchvision needed

    s = int(config.image_size)
    return ViTImageProcessorPil(size={"height": s, "width": s}, image_mean=[0.485, 0.456, 0.406],
                             image_std=[0.229, 0.224, 0.225])


# --- image corpora ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """Where one window's pixels came from: a file and the crop box ``(x0, y0, x1, y1)``."""

    file: str
    box: tuple[int, int, int, int]


def _load_corpus(corpus: str) -> list[tuple[str, np.ndarray]]:
    """``(name, uint8 HxWx3 array)`` per image of ``corpus``, in name order."""
    if corpus == SAMPLE:
        from sklearn.datasets import load_sample_images

        d = load_sample_images()
        return sorted(zip((Path(f).name for f in d.filenames), d.images), key=lambda t: t[0])
    if corpus.startswith("images:"):
        raise CorpusError(f"unknown image corpus {corpus!r}; use {SAMPLE} or a directory of "
                          "PNG/JPEG files")
    from PIL import Image

    root = Path(corpus).expanduser()
    files = sorted(f for f in root.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
    out = []
    for f in files:
        try:
            with warnings.catch_warnings():  # PIL's bomb warning: our own limit below decides
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                im = Image.open(f)  # reads the header only
            with im:
                w, h = im.size
                if w * h > MAX_IMAGE_PIXELS:
                    raise _too_large(f, f"{w} x {h} pixels ({w * h:,})", root)
                out.append((f.name, np.asarray(im.convert("RGB"))))
        except Image.DecompressionBombError:  # PIL's own (higher) limit, met at open
            raise _too_large(f, "over PIL's decompression-bomb limit", root) from None
        except OSError as err:
            raise CorpusError(f"image {f} could not be read ({err}); remove it from {root}") from err
    return out


def _too_large(f: Path, size: str, root: Path) -> CorpusError:
    return CorpusError(f"image {f} is {size}, over the limit of {MAX_IMAGE_PIXELS:,} pixels "
                       f"(attnbase.extract.vision.MAX_IMAGE_PIXELS); downscale it or remove it "
                       f"from {root}")


def _sample_boxes(images, n: int, seed: int) -> list[Source]:
    """``n`` distinct seeded square crops over the images (drawn image by image in turn)."""
    rng = np.random.default_rng(seed)
    seen: set[Source] = set()
    out: list[Source] = []
    tries = 0
    while len(out) < n:
        name, img = images[len(out) % len(images)]
        h, w = img.shape[:2]
        side = int(rng.integers(int(MIN_CROP * min(h, w)), min(h, w) + 1))
        x0, y0 = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
        src = Source(name, (x0, y0, x0 + side, y0 + side))
        tries += 1
        if src in seen:
            if tries > 100 * n:
                raise CorpusError(f"could not draw {n} distinct crops of {SAMPLE}")
            continue
        seen.add(src)
        out.append(src)
    return out


def corpus_sources(corpus: str, n: int, seed: int) -> tuple[list[Source], dict[str, np.ndarray]]:
    """The ``n`` windows of an image corpus (sources) and the images by name."""
    images = _load_corpus(corpus)
    if not images:
        raise CorpusError(f"corpus {corpus!r} holds no PNG/JPEG image")
    by_name = dict(images)
    if corpus == SAMPLE:
        return _sample_boxes(images, n, seed), by_name
    if len(images) < n:
        raise CorpusError(f"corpus {corpus!r} holds {len(images)} images but {n} were asked; "
                          "lower --seqs or add images")
    return [Source(name, (0, 0, img.shape[1], img.shape[0])) for name, img in images[:n]], by_name


def prepare(processor, images: dict[str, np.ndarray], sources: list[Source]) -> np.ndarray:
    """Pixels ``(seq, channel, height, width)`` float32 of the crops, by the model's processor."""
    crops = [images[s.file][s.box[1]:s.box[3], s.box[0]:s.box[2]] for s in sources]
    px = processor(images=crops, return_tensors="np")["pixel_values"]
    return np.ascontiguousarray(px, dtype=np.float32)


def corpus_digest(corpus: str, images: dict[str, np.ndarray], processor) -> str:
    """sha256 of the images' bytes and names and the processor's settings."""
    h = hashlib.sha256(corpus.encode())
    for name in sorted(images):
        h.update(name.encode())
        h.update(np.ascontiguousarray(images[name]).tobytes())
    h.update(json.dumps(processor.to_dict(), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def held_out(lm, corpus: str, used: list[Source], n: int, seed: int = 0):
    """``(pixels, sources)`` of ``n`` windows of ``corpus`` that are not among ``used`` (the
    run's windows, which ranked the heads): for ``images:sample`` seeded crops (drawn from the
    stream of seed ``seed + 1``) whose boxes differ from every used box; for a directory the
    images the run did not read."""
    used_set = set(used)
    if corpus == SAMPLE:
        images = _load_corpus(corpus)
        draw = _sample_boxes(images, len(used) + n, seed + 1)
        free = [s for s in draw if s not in used_set][:n]
        by_name = dict(images)
    else:
        srcs, by_name = corpus_sources(corpus, 0, seed)
        names = sorted(by_name)
        free = [Source(k, (0, 0, by_name[k].shape[1], by_name[k].shape[0])) for k in names
                if k not in {u.file for u in used}][:n]
    if len(free) < n:
        raise CorpusError(f"only {len(free)} images of corpus {corpus!r} are not in the run; "
                          "lower --eval-seqs or add images")
    return prepare(lm.processor, by_name, free), free


def image_windows(lm, corpus: str, n_seqs: int, seed: int) -> dict:
    """The fields of :class:`~attnbase.extract.corpus.CorpusWindows` for an image corpus
    (:func:`~attnbase.extract.corpus.corpus_windows` builds it): ``tokens`` the position indices
    ``(seq, T)``, ``pixels`` ``(seq, channel, height, width)``, ``sources``."""
    config = lm.model.config
    if not is_vision(config):
        raise CorpusError(f"corpus {corpus!r} is images but model {lm.info.model!r} "
                          f"({config.model_type}) reads text; use a vision model "
                          f"({', '.join(TINY_VISION)}, a ViT/DeiT/DINOv2 directory)")
    if lm.processor is None:
        raise CorpusError(f"model {lm.info.model!r} has no image processor; give a model "
                          "directory with preprocessor_config.json")
    sources, images = corpus_sources(corpus, n_seqs, seed)
    pixels = prepare(lm.processor, images, sources)
    T = n_tokens(config, pixels.shape[2:4])
    tokens = np.broadcast_to(np.arange(T, dtype=np.int32), (n_seqs, T)).copy()
    return dict(tokens=tokens, corpus=corpus,
                corpus_hash=corpus_digest(corpus, images, lm.processor),
                n_available=n_seqs, pixels=pixels, sources=tuple(sources))
