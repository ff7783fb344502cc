"""Helpers of the team-database tests: the ``attnbase`` command in a process of its own."""

from __future__ import annotations

import subprocess
import sys


def attnbase(*args, env=None, timeout=300, check=True) -> subprocess.CompletedProcess:
    """The ``attnbase`` command in a process of its own."""
    proc = subprocess.run([sys.executable, "-m", "attnbase.cli", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"attnbase {' '.join(map(str, args))} -> {proc.returncode}\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def tiny_extract_args(db, run, seqs=8, batch=2, *extra):
    return ["extract", "--model", "tiny-gpt2", "--run", run, "--db", db, "--seqs", seqs,
            "--seq-len", 32, "--batch-size", batch, "--quiet", *extra]
