"""A connection pool for the async client whose cost does not grow with the number of connections.

httpcore's pool walks every connection on each request and on each response
close (once quadratically, in its surplus-idle check), and probes the socket
of every idle connection each time. With many requests in flight, which is
the SDK's normal case (one request per sandbox of a parallel run), that costs
more than the request: 1.9 ms of CPU per request at 16 in flight, 8.7 ms at
64, against 0.9 ms for one (``GET /v1/health`` on loopback).

This pool keeps, per origin, a stack of idle HTTP/1.1 connections: a request
takes the most recently used one (probing only that socket) or opens a new
one, and closing its response puts the connection back if it can be reused.
Connections are not capped, like the SDK's httpcore pool was configured.
It plugs into :class:`httpx.AsyncHTTPTransport` in place of httpcore's pool,
so that httpx still maps errors and wraps responses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType

import httpcore
import httpx

__all__ = ["async_transport"]


class _AsyncPool:
    """What :class:`httpx.AsyncHTTPTransport` needs of its pool: ``handle_async_request`` and ``aclose``."""

    def __init__(self, *, ssl_context: object, max_idle: int, keepalive_expiry: float) -> None:
        self._ssl_context = ssl_context
        self._max_idle = max_idle
        self._keepalive_expiry = keepalive_expiry
        # By origin, as (scheme, host, port): httpcore.Origin is not hashable.
        self._idle: dict[tuple[bytes, bytes, int], list[httpcore.AsyncHTTPConnection]] = {}
        self._busy: set[httpcore.AsyncHTTPConnection] = set()

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        origin = request.url.origin
        key = (origin.scheme, origin.host, origin.port)
        conn: httpcore.AsyncHTTPConnection | None = None
        stack = self._idle.get(key)
        while stack:
            c = stack.pop()
            if c.is_idle() and not c.has_expired():
                conn = c
                break
            await c.aclose()  # expired, or closed by the server while idle
        if conn is None:
            conn = httpcore.AsyncHTTPConnection(
                origin=origin,
                ssl_context=self._ssl_context,  # type: ignore[arg-type]
                keepalive_expiry=self._keepalive_expiry,
            )
        self._busy.add(conn)
        try:
            resp = await conn.handle_async_request(request)
        except BaseException:
            self._busy.discard(conn)
            await conn.aclose()
            raise
        return httpcore.Response(
            status=resp.status,
            headers=resp.headers,
            content=_Body(self, key, conn, resp.stream),
            extensions=resp.extensions,
        )

    async def _release(self, key: tuple[bytes, bytes, int], conn: httpcore.AsyncHTTPConnection) -> None:
        self._busy.discard(conn)
        stack = self._idle.setdefault(key, [])
        if conn.is_idle() and len(stack) < self._max_idle:
            stack.append(conn)
        else:
            await conn.aclose()

    async def aclose(self) -> None:
        conns = [c for stack in self._idle.values() for c in stack] + list(self._busy)
        self._idle.clear()
        self._busy.clear()
        for c in conns:
            await c.aclose()

    async def __aenter__(self) -> _AsyncPool:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class _Body:
    """A response body that hands its connection back to the pool when it is closed."""

    def __init__(
        self, pool: _AsyncPool, key: tuple[bytes, bytes, int], conn: httpcore.AsyncHTTPConnection, stream: object
    ) -> None:
        self._pool = pool
        self._key = key
        self._conn = conn
        self._stream = stream
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:  # type: ignore[attr-defined]
            yield part

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._stream, "aclose", None)
            if close is not None:
                await close()  # marks the connection idle if the response was read to its end
        finally:
            await self._pool._release(self._key, self._conn)


def async_transport(*, max_idle: int, keepalive_expiry: float) -> httpx.AsyncHTTPTransport:
    """An :class:`httpx.AsyncHTTPTransport` on the O(1) pool (TLS verified as httpx does by default)."""
    transport = httpx.AsyncHTTPTransport()
    transport._pool = _AsyncPool(  # type: ignore[assignment]
        ssl_context=httpx.create_ssl_context(), max_idle=max_idle, keepalive_expiry=keepalive_expiry
    )
    return transport
