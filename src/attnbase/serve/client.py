"""``attnbase.connect(url, token=None)``: the service from a notebook (httpx; Arrow for SQL)."""

from __future__ import annotations

from attnbase.errors import AttnbaseError


class ServiceError(AttnbaseError):
    """The service answered a 4xx/5xx; the message is its one-line ``detail``."""


class Client:
    """A client of one ``attnbase serve``; use as a context manager or call :meth:`close`."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _check(self, r):
        if r.status_code >= 400:
            try:
                detail = r.json()["detail"]
            except Exception:
                detail = r.text[:200]
            raise ServiceError(f"{r.request.method} {r.request.url.path}: {r.status_code} {detail}")
        return r

    def runs(self) -> list[dict]:
        """``GET /api/runs``."""
        return self._check(self._http.get("/api/runs")).json()

    def head(self, run: str, layer: int, head: int) -> dict:
        """``GET /api/runs/{run}/heads/{layer}/{head}``."""
        return self._check(self._http.get(f"/api/runs/{run}/heads/{layer}/{head}")).json()

    def sql(self, query: str, timeout_ms: int | None = None):
        """``POST /api/sql`` as Arrow, returned as a ``polars.DataFrame``."""
        import polars as pl
        import pyarrow as pa

        body = {"sql": query, "format": "arrow"}
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        r = self._check(self._http.post("/api/sql", json=body))
        return pl.from_arrow(pa.ipc.open_stream(r.content).read_all())


def connect(url: str, token: str | None = None, timeout: float = 60.0) -> Client:
    """A :class:`Client` of the service at ``url`` (``token``: an ``attnbase token``)."""
    return Client(url, token, timeout)
