"""The service's mixes, this tree against an older one, interleaved in one run (not a test).

    python benchmarks/serve_ab.py --db D --base <base>/src [--rounds 8] [--seconds 10]
                                  [--clients 16] [--runaways] [--writer]

``<base>`` is an older tree unpacked with ``git archive <commit> src | tar -x -C <base>``.
Builds ``D`` as ``benchmarks/serve.py`` does (the same runs and questions), then starts
``--copies`` ``attnbase serve --workers 1`` of each tree over it at once (``base-1``, ``this-1``,
``base-2``, ...: identical code in two processes differs by several per cent, so each tree's
figure pools its servers, and their spread is printed as the A/A control). Each round sends the
mix of ``benchmarks/serve.py`` (``--clients`` closed-loop clients, no think time; with
``--runaways`` two more clients sending its runaway queries) to each server in turn for
``--seconds``, the order rotating from round to round; the idle servers use no CPU meanwhile.
``--writer``: an ``attnbase extract`` writes a run into ``D`` through every round.

Prints per server and round the requests per second and the server's CPU per request (the
server and its query processes, user + system), then this tree against the base: the
geometric mean over rounds of the ratio of the trees' mean requests/s, and the ratio of the
median CPU per request; ``--solo N`` first gives each kind alone.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve as bench  # noqa: E402  (benchmarks/serve.py: build, request, cpu_s, the mixes)

ROOT = Path(__file__).resolve().parent.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(db: Path, src: Path) -> tuple[subprocess.Popen, str]:
    """``attnbase serve`` over ``db`` with the code under ``src``; returns it and its URL once
    it answers."""
    import httpx

    port = _port()
    env = {**bench.ENV, "PYTHONPATH": str(src)}
    proc = subprocess.Popen([sys.executable, "-m", "attnbase.cli", "serve", "--db", str(db),
                             "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/api/runs", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"attnbase serve from {src} exited {proc.returncode}")
        time.sleep(0.3)
    raise SystemExit(f"attnbase serve from {src} did not answer in 120 s")


def mix(url: str, pid: int, clients: int, seconds: float, runaways: bool, seed: int) -> dict:
    """One round of the mix on one server: requests, errors, server CPU seconds, latencies."""
    import httpx

    lat: dict[str, list[float]] = {k: [] for k in bench.KINDS}
    errors: list[str] = []
    stopped: list[int] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client(i: int) -> None:
        bench.mix_client(url, end, seed * 1000 + i, lat, errors, lock)

    def runaway(sql: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while time.monotonic() < end:
                try:
                    code = c.post("/api/sql", json={"sql": sql}).status_code
                except httpx.HTTPError:
                    code = 0
                with lock:
                    stopped.append(code)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    if runaways:
        threads += [threading.Thread(target=runaway, args=(q,)) for q in bench.RUNAWAYS]
    cpu0, t0 = bench.cpu_s(pid), time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 90)
    wall = time.monotonic() - t0
    n = sum(map(len, lat.values()))
    return {"n": n, "rps": n / wall, "cpu_ms": (bench.cpu_s(pid) - cpu0) / max(n, 1) * 1000,
            "errors": errors, "runaway_codes": stopped, "lat": lat}


def gmean(xs) -> float:
    return float(np.exp(np.mean(np.log(xs))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path)
    ap.add_argument("--base", type=Path, required=True, help="an older tree's src/ directory")
    ap.add_argument("--this", type=Path, default=ROOT / "src",
                    help="the src/ directory measured against --base (default: this tree's)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0, help="a round's length (0: --solo only)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--big-seqs", type=int, default=544)
    ap.add_argument("--runaways", action="store_true", help="serve.py's two runaway clients too")
    ap.add_argument("--writer", action="store_true", help="an extraction writes meanwhile")
    ap.add_argument("--copies", type=int, default=2,
                    help="servers per tree (their spread is the A/A control)")
    ap.add_argument("--solo", type=int, default=0, metavar="N",
                    help="first, each kind alone: N requests in a row from one client to each "
                         "server in turn, --rounds times; the server's CPU per request by kind")
    args = ap.parse_args(argv)
    if not (args.base / "attnbase" / "cli.py").is_file():
        raise SystemExit(f"--base {args.base} holds no attnbase/cli.py; give an older tree's src/")
    import httpx

    db = args.db or Path(tempfile.mkdtemp(prefix="attnbase-ab-")) / "db"
    bench.build(db, args.big_seqs)
    trees = {"base": args.base.resolve(), "this": args.this.resolve()}
    names = tuple(f"{t}-{i + 1}" for i in range(args.copies) for t in trees)
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    writer = None
    try:
        for name in names:
            servers[name] = start(db, trees[name.split("-")[0]])
        for proc, url in servers.values():  # every head's page and patterns once, each server
            with httpx.Client(base_url=url, timeout=60) as c:
                rnd = random.Random(5)
                for kind in bench.KINDS:
                    for _ in range(20):
                        bench.request(c, kind, rnd)
        if args.writer:
            writer = subprocess.Popen(
                [sys.executable, "-m", "attnbase.cli", "extract", "--db", str(db), "--model",
                 "tiny-gpt2", "--corpus", "default", "--seqs", "100000", "--seq-len", "32",
                 "--batch-size", "8", "--run", f"writer-{int(time.time())}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**bench.ENV, "PYTHONPATH": str(ROOT / "src")})
            time.sleep(5)
        def pooled(by, tree, kind):
            return [x for n in names if n.startswith(tree) for x in by[n][kind]]

        if args.solo:
            alone: dict[str, dict[str, list[float]]] = {n: {k: [] for k in bench.KINDS}
                                                        for n in names}
            for r in range(args.rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    proc, url = servers[name]
                    for kind, (cpu_ms, _) in bench.solo(url, proc.pid, args.solo).items():
                        alone[name][kind].append(cpu_ms)
            print(f"each kind alone, one client, {args.solo} requests x {args.rounds} rounds: "
                  "server CPU ms per request (median), and against base")
            for tree in trees:
                print(f"  {tree:4s} " + "  ".join(
                    f"{k} {np.median(pooled(alone, tree, k)):.2f} "
                    f"({np.median(pooled(alone, tree, k)) / np.median(pooled(alone, 'base', k)):.3f}x)"
                    for k in bench.KINDS), flush=True)
        got: dict[str, list[dict]] = {n: [] for n in names}
        if args.seconds <= 0:  # the kinds alone only
            return 0
        print(f"{args.clients} clients{' + 2 runaways' if args.runaways else ''}, "
              f"{'an extraction writing, ' if writer else ''}{args.rounds} rounds of "
              f"{args.seconds:.0f} s per server; load at start "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            if r % 2:
                order = order[::-1]
            for name in order:
                proc, url = servers[name]
                res = mix(url, proc.pid, args.clients, args.seconds, args.runaways, r)
                got[name].append(res)
                print(f"  round {r} {name:6s} {res['rps']:7.1f} req/s  "
                      f"{res['cpu_ms']:5.2f} ms CPU/request  {len(res['errors'])} errors"
                      f"{'  runaway answers ' + str(sorted(set(res['runaway_codes']))) if args.runaways else ''}"
                      f"  load {os.getloadavg()[0]:.1f}", flush=True)
        print("server  req/s median  CPU ms/request median  head page p95 ms  errors")
        for name in names:
            rs = got[name]
            heads = [x for res in rs for x in res["lat"]["head page"]]
            print(f"{name:6s} {np.median([x['rps'] for x in rs]):12.1f} "
                  f"{np.median([x['cpu_ms'] for x in rs]):22.2f} "
                  f"{np.quantile(heads, 0.95) * 1000:17.1f} "
                  f"{sum(len(x['errors']) for x in rs):7d}")
        def rps(tree: str, r: int) -> float:  # a tree's mean over its servers in round r
            return float(np.mean([got[n][r]["rps"] for n in names if n.startswith(tree)]))

        def cpu(tree: str) -> float:
            return float(np.median([x["cpu_ms"] for n in names if n.startswith(tree)
                                    for x in got[n]]))

        pairs = [rps("this", r) / rps("base", r) for r in range(args.rounds)]
        print(f"this/base over {args.copies} server(s) each: requests/s {gmean(pairs):.3f}x "
              f"(geometric mean of {len(pairs)} rounds, {min(pairs):.2f}-{max(pairs):.2f}); "
              f"CPU per request {cpu('this') / cpu('base'):.3f}x (medians of every round)")
        for tree in trees:  # the A/A spread: servers of one tree against each other
            own = [n for n in names if n.startswith(tree)]
            for n in own[1:]:
                aa = [got[n][r]["rps"] / got[own[0]][r]["rps"] for r in range(args.rounds)]
                c = (np.median([x["cpu_ms"] for x in got[n]])
                     / np.median([x["cpu_ms"] for x in got[own[0]]]))
                print(f"A/A {n}/{own[0]}: requests/s {gmean(aa):.3f}x, CPU per request "
                      f"{c:.3f}x")
        bad = sum(len(x["errors"]) for rs in got.values() for x in rs)
        for e in sorted({e for rs in got.values() for x in rs for e in x["errors"]})[:5]:
            print("  error:", e)
        return 0 if not bad else 1
    finally:
        bench.stop(writer, *(p for p, _ in servers.values()))


if __name__ == "__main__":
    sys.exit(main())
