"""Benchmark of the service's statistics-file check (not a test): its cost cold and warm.

    python benchmarks/filecheck.py --db DIR [--rounds 3] [--warm 40]

DIR is a database ``benchmarks/serve.py`` built (its runs ``minilm-bench`` and ``big``). Each
round starts ``attnbase serve`` twice, with ``--setting stat_checksums=true`` and ``=false``
(their order alternating round by round), and times, one client, nothing else asked:

- cold: the first run-scoped question after the server answered ``/healthz`` (the snapshot's
  list of statistics files read and, with the check, every listed file checksummed: this
  process has seen none of them), then the first head page;
- warm: the median of ``--warm`` more of each (the check: one ``stat`` per listed file).

The files are in the page cache after the first start (cold is a new process, not a cold
disk). Prints the listed files' count and bytes, the check alone in this process (cold and
warm), and per setting the medians over rounds.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from serve import ATTNBASE, ENV, SQL, L, H  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_server(db: Path, check: bool, warm: int) -> dict[str, float]:
    import httpx

    port = free_port()
    proc = subprocess.Popen(
        [str(ATTNBASE), "serve", "--db", str(db), "--port", str(port),
         "--setting", f"stat_checksums={'true' if check else 'false'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        rnd = random.Random(5)
        out = {}
        with httpx.Client(base_url=url, timeout=60) as c:
            def sql():
                return c.post("/api/sql", json={"sql": SQL.format(
                    layer=rnd.randrange(L), head=rnd.randrange(H))})

            def page():
                return c.get(f"/runs/minilm-bench/heads/{rnd.randrange(6)}/{rnd.randrange(12)}",
                             params={"seq": rnd.randrange(16)})

            for name, ask in (("sql", sql), ("head page", page)):
                t0 = time.perf_counter()
                ask().raise_for_status()
                out[f"{name} cold"] = (time.perf_counter() - t0) * 1000
            for name, ask in (("sql", sql), ("head page", page)):
                walls = []
                for _ in range(warm):
                    t0 = time.perf_counter()
                    ask().raise_for_status()
                    walls.append((time.perf_counter() - t0) * 1000)
                out[f"{name} warm"] = statistics.median(walls)
        return out
    finally:
        proc.send_signal(2)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def in_process(db: Path) -> str:
    """:meth:`FileCheck.damaged` alone, in this process: every listed file read and
    checksummed (the files in the page cache), then the warm check (a ``stat`` each)."""
    import duckdb

    from attnbase.serve.filecheck import LISTED_SQL, FileCheck

    con = duckdb.connect(str(db / "catalog.duckdb"), read_only=True)
    files = [tuple(r) for r in con.execute(LISTED_SQL).fetchall()]
    con.close()
    FileCheck(db).damaged(files)  # the page cache filled
    check = FileCheck(db)
    t0, c0 = time.perf_counter(), time.process_time()
    assert check.damaged(files) == {}
    cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
    warm = []
    for _ in range(200):
        t0 = time.perf_counter()
        check.damaged(files)
        warm.append(time.perf_counter() - t0)
    return (f"in-process: cold (every file read and checksummed) {cold * 1000:.0f} ms wall, "
            f"{cold_cpu * 1000:.0f} ms CPU; warm (a stat per file) "
            f"{statistics.median(warm) * 1e6:.0f} us median of 200")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=int, default=40)
    args = ap.parse_args(argv)
    import duckdb

    con = duckdb.connect(str(args.db / "catalog.duckdb"), read_only=True)
    n, size = con.execute("SELECT count(*), sum(size) FROM stat_files").fetchone()
    con.close()
    print(f"{n} listed statistics files, {size / 2**20:.1f} MiB")
    print(in_process(args.db), flush=True)
    results: dict[bool, list[dict]] = {True: [], False: []}
    for k in range(args.rounds):
        for check in ((True, False) if k % 2 == 0 else (False, True)):
            r = one_server(args.db, check, args.warm)
            results[check].append(r)
            print(f"round {k} check={'on ' if check else 'off'} "
                  + "  ".join(f"{key} {v:7.1f} ms" for key, v in r.items()), flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print("medians over rounds (ms):")
    for key in results[True][0]:
        on = statistics.median(r[key] for r in results[True])
        off = statistics.median(r[key] for r in results[False])
        print(f"  {key:15s} check on {on:8.1f}   off {off:8.1f}   on/off {on / off:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
