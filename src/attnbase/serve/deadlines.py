"""Deadlines for slow clients, as an asyncio protocol wrapped around uvicorn's HTTP protocol.

uvicorn has no deadline for receiving a request: ``timeout_keep_alive`` covers only the time
between requests and is re-armed by every byte, and a connection that sends nothing after
connecting is never closed (uvicorn issue #157). ``limit_concurrency`` answers 503 only once a
request has arrived, and its count includes running tasks; ``h11_max_incomplete_event_size``
applies to the h11 protocol only and answers 400. :func:`protocol_class` adds, per connection:

- the request head (request line and headers) must arrive within ``head_timeout_s`` of the
  connection or of the first byte of a keep-alive request;
- the body within ``body_timeout_s`` of the head;
- past either, a ``408`` (when no response has started) and the connection closed;
- a head over ``max_head_bytes`` gets ``431`` and the connection closed;
- beyond ``max_connections`` open connections, a new one gets ``503`` and is closed at once;
- a client that takes none of its answer's bytes for ``send_timeout_s`` while the server has
  more to send (the transport's write buffer full, so writing paused) is disconnected: the
  answer's chunks stop being made and what they held is freed.

Idle keep-alive connections are closed by uvicorn's ``timeout_keep_alive`` (set from
``keep_alive_s``). The deadlines are event-loop timers (``loop.call_later``): nothing per byte.

How: the class uvicorn is given (``uvicorn.Config(http=...)`` takes any ``asyncio.Protocol``
class) is a plain ``asyncio.Protocol`` that owns the connection and hands every byte on to
uvicorn's own httptools protocol. It sees where requests begin and end through a second
``httptools.HttpRequestParser`` (httptools' public parser, fed the same bytes: ~1 us a
request) and whether a response has started through the writes of the transport it hands
on. Nothing of uvicorn's protocol is overridden or read: the one private name left is the
class it wraps (``attnbase.private_api``, docs/toolchain.md), used only through the asyncio
protocol interface.
"""

from __future__ import annotations

import asyncio

import httptools


def _plain(status: bytes, text: bytes, *extra: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            + b"content-length: " + str(len(text)).encode() + b"\r\n" + b"".join(extra)
            + b"connection: close\r\n\r\n" + text)


_408 = _plain(b"408 Request Timeout", b"request not received in time\n")
_431 = _plain(b"431 Request Header Fields Too Large", b"request head too large\n")
_503 = _plain(b"503 Service Unavailable", b"too many open connections; retry\n",
              b"retry-after: 1\r\n")

#: uvicorn's httptools protocol, the one wrapped (a private name: attnbase.private_api)
INNER = "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol"


class _Transport:
    """The transport handed to the inner protocol: the real one, noting that a response has
    started when the inner protocol writes."""

    def __init__(self, real, owner: "_Guard") -> None:
        self._real, self._owner = real, owner

    def write(self, data) -> None:
        self._owner.answered = True
        self._real.write(data)

    def writelines(self, lines) -> None:
        self._owner.answered = True
        self._real.writelines(lines)

    def __getattr__(self, name):
        return getattr(self._real, name)


class _Guard(asyncio.Protocol):
    """One connection: the cap, the deadlines and the head size around the inner protocol."""

    inner_class: type
    head_s: float
    body_s: float
    send_s: float
    max_head: int
    cap: int
    open: set  # the class's admitted connections (one class per server process)

    def __init__(self, *args, **kwargs) -> None:
        self._args, self._kwargs = args, kwargs
        self.inner = None
        self.transport = None
        self.timer = None
        self.send_timer = None
        self.unsent = 0  # the write buffer's size when its progress was last checked
        self.answered = False
        self.head_bytes: int | None = 0  # None while a head is complete (its body, the app)
        self.completed = False  # a message ended in the chunk being read
        self.parser = httptools.HttpRequestParser(self)

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        if len(self.open) >= self.cap:
            transport.write(_503)
            transport.close()
            return
        self.open.add(self)
        self.loop = asyncio.get_running_loop()
        self.inner = self.inner_class(*self._args, **self._kwargs)
        self.inner.connection_made(_Transport(transport, self))
        self._arm(self.head_s)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.parser is not None:
            self.completed = False
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self.parser = None  # not HTTP/1.1 requests any more: uvicorn's to handle
            except httptools.HttpParserError:
                self.parser = None  # uvicorn's parser fails on it too: it answers 400
            # a chunk that ended a message may carry its body: only the next one counts
            if self.head_bytes is not None and not self.completed:
                self.head_bytes += len(data)
                if self.head_bytes > self.max_head:
                    self._disarm()
                    self.transport.write(_431)
                    self.transport.close()
                    return
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.unsent = self.transport.get_write_buffer_size()
            self._arm_send()
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        self._disarm_send()
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc) -> None:
        self._disarm()
        self._disarm_send()
        if self.inner is not None:
            self.open.discard(self)
            self.inner.connection_lost(exc)

    # --- httptools.HttpRequestParser callbacks ----------------------------------------------
    def on_message_begin(self) -> None:
        self.answered = False
        self.head_bytes = 0
        if self.timer is None:  # a keep-alive request's first byte (else: since connect)
            self._arm(self.head_s)

    def on_headers_complete(self) -> None:
        self.head_bytes = None
        self._arm(self.body_s)

    def on_message_complete(self) -> None:
        self.head_bytes = 0
        self.completed = True
        self._disarm()

    # --- timers ----------------------------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        self._disarm()
        self.timer = self.loop.call_later(seconds, self._late)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _arm_send(self) -> None:
        self._disarm_send()
        self.send_timer = self.loop.call_later(self.send_s, self._stalled)

    def _disarm_send(self) -> None:
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def _stalled(self) -> None:
        """Writing has been paused ``send_s``: if the client took bytes meanwhile, wait again;
        else drop the connection (``abort``: what is buffered is not sent)."""
        self.send_timer = None
        unsent = self.transport.get_write_buffer_size()
        if unsent < self.unsent:
            self.unsent = unsent
            self._arm_send()
        else:
            self.transport.abort()

    def _late(self) -> None:
        self.timer = None
        if self.transport.is_closing():
            return
        if not self.answered:
            self.transport.write(_408)
        self.transport.close()


def protocol_class(settings) -> type:
    """An ``asyncio.Protocol`` class for ``uvicorn.Config(http=...)``: uvicorn's httptools
    protocol behind the deadlines and the connection cap of ``settings``
    (``head_timeout_s``, ``body_timeout_s``, ``max_head_bytes``, ``max_connections``)."""
    from attnbase.private_api import resolve

    return type("DeadlineProtocol", (_Guard,), {
        "inner_class": resolve(INNER), "head_s": settings.head_timeout_s,
        "body_s": settings.body_timeout_s, "send_s": settings.send_timeout_s, "max_head": settings.max_head_bytes,
        "cap": settings.max_connections, "open": set()})
