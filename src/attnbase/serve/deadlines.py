"""Deadlines for slow clients, around uvicorn's HTTP protocol (httptools).

uvicorn has no deadline for receiving a request: ``timeout_keep_alive`` covers only the time
between requests and is re-armed by every byte, and a connection that sends nothing after
connecting is never closed (uvicorn issue #157). :func:`protocol_class` adds, per connection:

- the request head (request line and headers) must arrive within ``head_timeout_s`` of the
  connection or of the first byte of a keep-alive request;
- the body within ``body_timeout_s`` of the head;
- past either, a ``408`` (when no response has started) and the connection closed;
- a head over ``max_head_bytes`` gets ``431`` and the connection closed;
- beyond ``max_connections`` open connections, a new one gets ``503`` and is closed at once.

Idle keep-alive connections are closed by uvicorn's ``timeout_keep_alive`` (set from
``keep_alive_s``). The deadlines are event-loop timers (``loop.call_later``): nothing per byte.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

def _plain(status: bytes, text: bytes, *extra: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            + b"content-length: " + str(len(text)).encode() + b"\r\n" + b"".join(extra)
            + b"connection: close\r\n\r\n" + text)


_408 = _plain(b"408 Request Timeout", b"request not received in time\n")
_431 = _plain(b"431 Request Header Fields Too Large", b"request head too large\n")
_503 = _plain(b"503 Service Unavailable", b"too many open connections; retry\n",
              b"retry-after: 1\r\n")


def protocol_class(settings) -> type:
    """uvicorn's httptools protocol with the deadlines and the connection cap of ``settings``
    (``head_timeout_s``, ``body_timeout_s``, ``max_connections``)."""
    head_s, body_s = settings.head_timeout_s, settings.body_timeout_s
    cap = settings.max_connections
    # bytes received while a head is incomplete: a chunk may carry the body too
    head_cap = settings.max_head_bytes + settings.max_body_bytes

    class DeadlineProtocol(HttpToolsProtocol):
        _timer = None
        _head_bytes = 0  # None while a head is complete (its body or the app's turn)

        def data_received(self, data: bytes) -> None:
            if self._head_bytes is not None:
                self._head_bytes += len(data)
                if self._head_bytes > head_cap:
                    self._disarm()
                    self.transport.write(_431)
                    self.transport.close()
                    return
            super().data_received(data)

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > cap:
                transport.write(_503)
                transport.close()
                return
            self._arm(head_s)

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._late)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _late(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(_408)
            self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._timer is None:  # a keep-alive request's first byte (else: since connect)
                self._arm(head_s)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._head_bytes = None
            self._arm(body_s)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_bytes = 0
            self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return DeadlineProtocol
