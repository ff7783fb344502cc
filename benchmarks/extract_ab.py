"""Before/after extraction ratios side by side: ``benchmarks/extract.py`` in alternating
processes, one round each, for every setup in turn (round 1 of A, of B, ...; round 2 ...), so
the machine's load hits every setup alike; then per setup the median over rounds of each
variant's ratio to that process's own bare eager forward of the same model (one table row per
setup and model when ``--models`` names several).

A setup is ``LABEL=SRC`` (a ``src`` directory put first on ``PYTHONPATH``), with ``+ahead``
after SRC for the GPU box's writer loop forced on the CPU (``extract.py --stage-ahead``)::

    git -C /work/main archive main src | tar -x -C /tmp/base
    python benchmarks/extract_ab.py --rounds 2 before=/tmp/base/src after=src "pool=src+ahead"

``--extract-args "..."`` are every extract.py's arguments (default: the GPT-2-small shape,
150 x 128, batch 8, the three attnbase variants, no TransformerLens, no process variants).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = ["--models", "gpt2-small", "--seqs", "150", "--seq-len", "128", "--batch-size", "8",
           "--no-process", "--no-tl",
           "--variants", "attnbase default,attnbase stored logits,attnbase keys+logits"]
ROW = re.compile(r"^\| (?P<variant>[^|]+?) \| (?P<med>[\d.]+) \|")
MODEL = re.compile(r"^### (?P<model>\S+) \(")


def parse(stdout: str) -> dict[str, dict[str, float]]:
    """``{model: {variant: median seconds}}`` from extract.py's tables."""
    secs: dict[str, dict[str, float]] = {}
    model = None
    for line in stdout.splitlines():
        if m := MODEL.match(line):
            model = m["model"]
        elif (m := ROW.match(line)) and model is not None:
            secs.setdefault(model, {})[m["variant"]] = float(m["med"])
    return secs


def one_round(src: str, ahead: bool, extra: list[str]) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(HERE / "extract.py"), "--repeat", "1", *extra]
    if ahead:
        cmd.append("--stage-ahead")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    secs = parse(p.stdout)
    if not secs or any("bare eager" not in v for v in secs.values()):
        raise SystemExit(f"no bare eager row in extract.py's output:\n{p.stdout[-2000:]}")
    return secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--extract-args", default="", help="benchmarks/extract.py's arguments")
    ap.add_argument("setups", nargs="+", help="LABEL=SRC or LABEL=SRC+ahead")
    args = ap.parse_args()
    extra = shlex.split(args.extract_args) or DEFAULT
    setups = []
    for s in args.setups:
        label, _, src = s.partition("=")
        ahead = src.endswith("+ahead")
        setups.append((label, src.removesuffix("+ahead"), ahead))
    runs: dict[str, list[dict[str, dict[str, float]]]] = {label: [] for label, _, _ in setups}
    for r in range(args.rounds):
        for label, src, ahead in setups:
            secs = one_round(src, ahead, extra)
            runs[label].append(secs)
            print(f"round {r + 1} {label}: " + "; ".join(
                f"{model}: " + ", ".join(f"{k} {v:.2f} s" for k, v in vs.items())
                for model, vs in secs.items()), file=sys.stderr, flush=True)
    first = runs[setups[0][0]][0]
    models = list(first)
    variants = list(dict.fromkeys(v for m in models for v in first[m] if v != "bare eager"))
    load = os.getloadavg()[0]
    print(f"\n{args.rounds} interleaved rounds per setup, {os.cpu_count()} CPUs, 1-min load "
          f"{load:.1f} at the end; x its own bare eager forward, median of per-round ratios "
          f"(medians of the seconds in brackets)\n")
    print("| setup | model | bare eager s | " + " | ".join(variants) + " |")
    print("|---|---|---|" + "---|" * len(variants))
    for model in models:
        for label, _, _ in setups:
            rs = [run[model] for run in runs[label]]
            base = [x["bare eager"] for x in rs]
            cells = []
            for v in variants:
                if not all(v in x for x in rs):
                    cells.append("-")
                    continue
                ratio = statistics.median(x[v] / x["bare eager"] for x in rs)
                cells.append(f"**{ratio:.2f}x** ({statistics.median(x[v] for x in rs):.2f} s)")
            print(f"| {label} | {model} | {statistics.median(base):.2f} | " + " | ".join(cells)
                  + " |")


if __name__ == "__main__":
    main()
