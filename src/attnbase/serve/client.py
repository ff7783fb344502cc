"""``attnbase.connect(url, token=None)``: the service from a notebook; ``attnbase.attach_lake(
address)``: a team database's catalog itself, read-only, in a DuckDB connection of one's own.

Tables come back as ``polars.DataFrame`` (SQL through Arrow), a head's attention pattern as a
:class:`Pattern` (the T x T probabilities with the token texts, drawn inline in Jupyter). Every
failure, a refused connection as much as a 4xx, is one :class:`ServiceError` naming the URL and
the service's message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnbase.contract import WEIGHTS_CORPUS
from attnbase.errors import AttnbaseError
from attnbase.formatting import fmt


class ServiceError(AttnbaseError):
    """The service could not be reached, or answered a 4xx/5xx; the message names the URL and
    the service's one-line ``detail``."""


@dataclass(frozen=True)
class Pattern:
    """One head's attention on one sequence: ``probs`` [query, key] (rows sum to 1; NaN where a
    row has no value under ``drop_sink``), ``tokens`` (decoded text, ``␣`` a space, ``⏎`` a
    newline) and ``token_ids`` per position."""

    run_id: str
    layer: int
    head: int
    seq: int
    convention: str
    tokens: list[str]
    token_ids: list[int]
    probs: np.ndarray

    def to_polars(self):
        """The pattern as a long table: ``query, key, query_token, key_token, prob``."""
        import polars as pl

        q, k = np.indices(self.probs.shape)
        tok = np.array(self.tokens, dtype=object)
        return pl.DataFrame({"query": q.ravel(), "key": k.ravel(),
                             "query_token": tok[q.ravel()].tolist(),
                             "key_token": tok[k.ravel()].tolist(), "prob": self.probs.ravel()})

    def _repr_html_(self) -> str:
        """A heatmap table with the tokens on both axes (inline styles only: no script, no CDN)."""
        from html import escape

        from attnbase.serve.colours import colours

        finite = self.probs[np.isfinite(self.probs)]
        hi = float(finite.max()) if finite.size else 1.0
        bg = colours(self.probs, 0.0, hi).tolist()
        labels = [escape(t) for t in self.tokens]
        cell = "width:12px;height:12px;padding:0;border:0"
        out = [f"<div><b>{escape(self.run_id)} L{self.layer} H{self.head}</b>, sequence "
               f"{self.seq}, {self.convention}: rows are queries, columns keys; colour 0 (dark) "
               f"to {fmt(hi, 3, style='plain')} (yellow)</div><div style=\"overflow:auto\">"
               "<table style=\"border-collapse:collapse;font-size:9px\"><tr><th></th>"]
        out += [f'<th style="writing-mode:vertical-rl;transform:rotate(180deg);'
                f'white-space:pre;padding:0">{t}</th>' for t in labels]
        out.append("</tr>")
        for q, row in enumerate(bg):
            out.append(f'<tr><th style="text-align:right;white-space:pre;font-weight:normal">'
                       f"{labels[q]}</th>")
            out += [f'<td style="{cell};background:{c}" title="{labels[q]} → {labels[k]}: '
                    f'{fmt(float(self.probs[q, k]), 3, style="plain")}"></td>'
                    for k, c in enumerate(row)]
            out.append("</tr>")
        out.append("</table></div>")
        return "".join(out)


class Client:
    """A client of one ``attnbase serve``; use as a context manager or call :meth:`close`."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0) -> None:
        import httpx

        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw):
        import httpx

        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError as err:
            raise ServiceError(f"{method} {self.url}{path}: cannot reach the service "
                               f"({type(err).__name__}: {err}); is `attnbase serve` running "
                               "there?") from None
        if r.status_code >= 400:
            try:
                detail = r.json()["detail"]
            except Exception:
                detail = r.text[:200]
            raise ServiceError(f"{method} {r.request.url}: {r.status_code} {detail}")
        return r

    def _frame(self, path: str, **params):
        import polars as pl

        return pl.DataFrame(self._call("GET", path, params=params or None).json(),
                            infer_schema_length=None)

    def runs(self):
        """``GET /api/runs``: one row per run (the ``runs`` columns and batch progress; the
        Table-1 numbers are in :meth:`table1`)."""
        import polars as pl

        rows = self._call("GET", "/api/runs").json()
        for r in rows:
            r.pop("table1", None)
        return pl.DataFrame(rows, infer_schema_length=None)

    def heads(self, run: str):
        """``GET /api/runs/{run}/heads``: the run's ``head_summary``, one row per head."""
        return self._frame(f"/api/runs/{run}/heads")

    def head(self, run: str, layer: int, head: int) -> dict:
        """``GET /api/runs/{run}/heads/{layer}/{head}``: metrics, ranks, null tests, nearest
        heads and clusters of one head."""
        return self._call("GET", f"/api/runs/{run}/heads/{layer}/{head}").json()

    def table1(self):
        """The ``table1`` view: one row per analysed run (weights-only runs, which have no
        Table-1 values, are left out as in ``attnbase table1``)."""
        return self.sql("select t.* from table1 t join runs r using (run_id) "
                        f"where r.corpus is distinct from '{WEIGHTS_CORPUS}' order by run_id")

    def pattern(self, run: str, layer: int, head: int, seq: int,
                convention: str = "with_sink") -> Pattern:
        """One head's attention pattern on sequence ``seq`` (``with_sink`` | ``drop_sink``)."""
        d = self._call("GET", f"/api/runs/{run}/heads/{layer}/{head}/pattern",
                       params={"seq": seq, "convention": convention}).json()
        probs = np.array([[np.nan if v is None else v for v in row] for row in d["probs"]],
                         dtype=np.float64)
        return Pattern(d["run_id"], d["layer"], d["head"], d["seq"], d["convention"],
                       d["tokens"], d["token_ids"], probs)

    def sql(self, query: str, timeout_ms: int | None = None):
        """``POST /api/sql`` as Arrow, returned as a ``polars.DataFrame``."""
        import polars as pl
        import pyarrow as pa

        body = {"sql": query, "format": "arrow"}
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        r = self._call("POST", "/api/sql", json=body)
        table = pa.ipc.open_stream(r.content).read_all()
        try:
            return pl.from_arrow(table)
        except Exception:  # noqa: BLE001 - polars refuses a type (a UNION): name the column
            for name, kind in zip(table.column_names, table.schema.types):
                try:
                    pl.from_arrow(table.select([name]))
                except Exception as err:  # noqa: BLE001
                    why = " ".join(str(err).split())[:120]
                    raise ServiceError(
                        f"column {name!r} ({kind}) of the answer cannot be a polars column "
                        f"({why}); cast it in the query, e.g. CAST({name} AS VARCHAR)") from None
            raise


def connect(url: str, token: str | None = None, timeout: float = 60.0) -> Client:
    """A :class:`Client` of the service at ``url`` (``token``: an ``attnbase token``)."""
    return Client(url, token, timeout)


def attach_lake(address: str):
    """A DuckDB connection of one's own to the team database at ``address``
    (``postgresql://USER@HOST:PORT/DBNAME``; the password the libpq way: ``PGPASSWORD`` or
    ``~/.pgpass``): its lake attached READ_ONLY and in use, with ``row_stats`` / ``col_stats``
    views over the statistics files its catalog lists (the data location mounted here). Each
    query reads the newest committed snapshot. Needs the ``team`` extra."""
    from attnbase.warehouse import Database
    from attnbase.warehouse.runs.statfiles import attach_remote_views

    db = Database(address).require()
    con = db.catalog.reader_instance()
    attach_remote_views(con, always=True)
    return con
