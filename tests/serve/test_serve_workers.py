"""``attnbase serve --workers 2``: two real worker processes on one port, each answering;
Ctrl-C stops all of them; a worker killed while serving is started again."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import psutil
import pytest
from serve_fixtures import RUN, Server


def _workers(srv: Server) -> list[psutil.Process]:
    """The worker processes (not multiprocessing's resource tracker, not one not yet reaped)."""
    out = []
    for p in psutil.Process(srv.proc.pid).children():
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.append(p)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass
    return out


def _established(proc: psutil.Process, port: int) -> int:
    return sum(1 for c in proc.net_connections(kind="tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port)


def test_two_workers_share_the_port_and_stop_together(serve_db):
    srv = Server(serve_db, "--workers", "2")
    try:
        assert "2 workers" in srv.first_line
        workers = _workers(srv)
        assert len(workers) == 2
        # connections opened at once land on both workers (the kernel hands each accept to one)
        clients = [httpx.Client(base_url=srv.url, timeout=30) for _ in range(24)]
        codes, lock = [], threading.Lock()

        def hit(c):
            r = c.get(f"/runs/{RUN}/heads/0/1")
            with lock:
                codes.append(r.status_code)

        threads = [threading.Thread(target=hit, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert codes == [200] * len(clients)
        per_worker = [_established(w, srv.port) for w in workers]
        assert sum(per_worker) == len(clients) and min(per_worker) >= 1, per_worker
        for c in clients:
            c.close()
        took = srv.stop(signal.SIGINT)
        assert took < 2.0 and srv.proc.returncode == 130
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    finally:
        srv.stop()


@pytest.mark.slow  # 6-17 s: run by `make test-slow`
def test_a_killed_worker_is_started_again(serve_db):
    srv = Server(serve_db, "--workers", "2")
    try:
        victim = _workers(srv)[0]
        victim.kill()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = _workers(srv)
            if len(now) == 2 and victim.pid not in {p.pid for p in now}:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("no worker replaced the killed one")
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for _ in range(10):  # whichever worker answers
                assert c.get("/healthz").json() == {"status": "ok"}
                assert c.get(f"/api/runs/{RUN}").status_code == 200
    finally:
        srv.stop()
    assert "starting another" in srv.proc.stderr.read()


def test_the_shared_socket_gets_nodelay_connections():
    """asyncio sets TCP_NODELAY only on connections of a socket whose proto is IPPROTO_TCP;
    uvicorn's ``bind_socket`` (proto 0) left Nagle on: 52 ms a keep-alive JSON response."""
    import asyncio
    import socket

    from serve_fixtures import free_port

    from attnbase.serve.server import _listening_socket
    from attnbase.serve.settings import Settings

    def nodelay_of_accepted(sock) -> int:
        async def main():
            got = asyncio.get_running_loop().create_future()

            class P(asyncio.Protocol):
                def connection_made(self, transport):
                    s = transport.get_extra_info("socket")
                    got.set_result(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                    transport.close()

            server = await asyncio.get_running_loop().create_server(P, sock=sock)
            _, w = await asyncio.open_connection(*sock.getsockname()[:2])
            value = await asyncio.wait_for(got, 5)
            w.close()
            server.close()
            return value

        return asyncio.run(main())

    ours = _listening_socket(Settings(db=None, port=free_port()))
    assert nodelay_of_accepted(ours) == 1
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # negative control: proto 0
    plain.bind(("127.0.0.1", 0))
    assert nodelay_of_accepted(plain) == 0
