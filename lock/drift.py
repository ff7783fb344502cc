"""Which packages of a venv differ from requirements.lock: ``pip freeze | python lock/drift.py
requirements.lock`` prints one line per package (``name lock -> installed``), then a count.
``make test-latest`` prints it before its tests, so an upgrade is named before it is tested."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def entries(lines) -> dict[str, tuple[str, list[str]]]:
    """``{normalised name: (version, [sha256, ...])}`` of every ``name==version`` line and the
    ``--hash`` lines under it."""
    out, name = {}, None
    for line in lines:
        m = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line)
        if m:
            name = re.sub(r"[-_.]+", "-", m[1]).lower()
            out[name] = (m[2], [])
        elif name and (h := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            out[name][1].append(h[1])
    return out


def pins(lines) -> dict[str, str]:
    """``{normalised name: version}`` of every ``name==version`` line."""
    return {name: version for name, (version, _) in entries(lines).items()}


def main(lock: str) -> None:
    locked, installed = pins(Path(lock).read_text().splitlines()), pins(sys.stdin)
    changed = sorted(n for n in locked.keys() & installed.keys() if locked[n] != installed[n])
    for n in changed:
        print(f"{n} {locked[n]} -> {installed[n]}")
    for n in sorted(installed.keys() - locked.keys()):
        print(f"{n} (not in the lock) {installed[n]}")
    print(f"{len(changed)} of {len(locked)} locked packages differ from the lock")


if __name__ == "__main__":
    main(sys.argv[1])
