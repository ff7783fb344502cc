"""The plain install (no extras) as a notebook user meets it: the client reads a served
database, a run store opens, and a command whose extra is missing exits 2 with one line naming
the extra. Run in a subprocess that cannot import anything outside the plain install's
dependency closure (light_client.py); the real ``pip install .`` is tests/serve/
test_light_install.py::test_pip_install_plain (slow)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serve_fixtures import RUN

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
HEAVY = {"torch", "transformers", "prefect", "dask", "numba", "weasyprint", "scipy", "sklearn",
         "matplotlib", "fastapi", "uvicorn", "statsmodels"}


@pytest.fixture(scope="module")
def light_env(tmp_path_factory) -> dict:
    import light_client

    site = light_client.light_site(tmp_path_factory.mktemp("light"))
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(site),
            "ATTNBASE_LIGHT": json.dumps(sorted(light_client.blocked_modules()))}


@pytest.fixture
def light(light_env):
    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", str(HERE / "light_client.py"), *args],
                              capture_output=True, text=True, timeout=timeout, env=light_env)
    return run


def test_the_heavy_libraries_are_outside_the_plain_install(light):
    p = light("blocked")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert HEAVY <= set(got["blocked"]) and got["importable"] == []


@pytest.mark.parametrize("command, extra", [
    (["extract", "--model", "tiny-gpt2", "--run", "x"], "extract"),
    (["analyze", "--run", RUN], "analysis"),
    (["report", "--run", RUN], "reports"),
    (["serve"], "serve"),
    (["flow", "run", "--config", str(ROOT / "examples" / "pipeline.toml")], "flows"),
    (["worker", "--pool", "gpu"], "flows"),
])
def test_a_command_without_its_extra_exits_2_naming_it(command, extra, serve_db, light):
    p = light("cli", *command, "--db", str(serve_db))
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert f"needs the [{extra}] extra" in p.stderr
    assert f"pip install 'attnbase[{extra}]'" in p.stderr


def test_reading_commands_work_without_extras(serve_db, light):
    p = light("cli", "sql", "--db", str(serve_db), "-f", "csv",
              f"select count(*) as n from row_stats where run_id = '{RUN}'")
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.splitlines()[-1]) > 0
    p = light("cli", "runs", "--db", str(serve_db))
    assert p.returncode == 0 and RUN in p.stdout, p.stderr


def test_the_client_reads_a_served_database(server, light):
    p = light("client", server.url, RUN)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["runs_is_polars"] and RUN in got["runs"]
    t = got["shape"][0]
    assert got["shape"] == [t, t] and t == 16
    assert all(abs(s - 1.0) < 1e-9 for s in got["row_sums"]) and got["min"] >= 0.0
    assert got["html_cells"] == t * t


def test_a_run_store_opens_and_derived_logits_name_their_extra(serve_db, light):
    p = light("store", str(serve_db), RUN)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["dims"] == ["layer", "kv_head", "seq", "pos", "d_head"]
    assert math.isfinite(got["keys_sum"]) and got["keys_sum"] != 0.0
    assert "pip install 'attnbase[" in got["attn_logits"]


def test_the_light_site_is_a_real_negative_control(light):
    """Without the light site the same interpreter imports torch: the tests above prove the
    plain install's closure, not a venv that happens to lack the libraries."""
    import importlib.util

    assert all(importlib.util.find_spec(m) is not None for m in HEAVY)
    p = light("cli", "extract", "--model", "tiny-gpt2", "--run", "x")
    assert p.returncode == 2


@pytest.mark.slow
def test_pip_install_plain(tmp_path):
    """A real venv with ``pip install .`` (no extras): no heavy library, under 800 MB."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", str(ROOT)], check=True, timeout=900)
    listed = subprocess.run([*pip, "list", "--format", "json"], capture_output=True, text=True,
                            check=True).stdout
    names = {d["name"].lower() for d in json.loads(listed)}
    assert not names & {"torch", "transformers", "prefect", "dask", "numba", "weasyprint"}
    site = next((venv / "lib").glob("python3*/site-packages"))
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    assert size < 800 * 2**20, f"{size / 2**20:.0f} MB"
    p = subprocess.run([str(venv / "bin" / "attnbase"), "extract", "--model", "tiny-gpt2",
                        "--run", "x", "--db", str(tmp_path / "db")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "attnbase[extract]" in p.stderr
