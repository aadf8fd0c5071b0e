"""A minimal HTTP/1.1 client for the load: prepared requests, kept-alive connections.

All the load client needs from HTTP is to send a prepared POST on a connection kept
alive between requests and to read the answer's body piece by piece as it arrives
(chunked, with a length, or up to the connection's end). Doing exactly that on
asyncio streams keeps the client's own time out of the TTFTs it measures: against a
server that does no work, aiohttp added 1 to 4 ms to each TTFT on a busy 2-core
host, where the load client on this module adds about 0.5 ms (`harness_benchmarks`).

Use: `Connections(Endpoint.from_url(url))`, `prepare_post(endpoint, body)` once per
body, then per request `response = await send(connections, request)`, iterate
`response.pieces` (the body as it arrives), and always `await
connections.release(response)`, which keeps the connection only when the answer was
read to its end and the server keeps it open.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

READ_LIMIT = 2**18  # the stream buffer's size; also the longest head accepted
STATUSES_WITHOUT_BODY = (204, 304)


class ProtocolError(RuntimeError):
    """The server's answer is not HTTP/1.1 as this client reads it."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    path: str

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(
                f"{url!r}: the load client speaks plain HTTP to a local server; "
                "give an http://host:port/... URL"
            )
        return cls(parts.hostname, parts.port or 80, parts.path or "/")


def prepare_post(endpoint: Endpoint, body: bytes, content_type: str) -> bytes:
    """The bytes of one POST of `body` to the endpoint, head and body together."""
    head = (
        f"POST {endpoint.path} HTTP/1.1\r\n"
        f"Host: {endpoint.host}:{endpoint.port}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return head.encode("latin-1") + body


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def open(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


@dataclass
class Connections:
    """The kept-alive connections to one endpoint: an idle one is reused, else opened.

    The closed loop never has more requests in flight than its concurrency, so
    there are never more connections than that either.
    """

    endpoint: Endpoint
    idle: list[Connection] = field(default_factory=list)

    async def open_new(self) -> Connection:
        reader, writer = await asyncio.open_connection(
            self.endpoint.host, self.endpoint.port, limit=READ_LIMIT
        )
        writer.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )
        return Connection(reader, writer)

    async def take(self) -> Connection:
        while self.idle:
            connection = self.idle.pop()
            if connection.open():
                connection.reused = True
                return connection
            connection.close()
        return await self.open_new()

    async def release(self, response: Response) -> None:
        """Keep the response's connection for another request if it can; else close."""
        if response.complete and response.keep_alive and response.connection.open():
            self.idle.append(response.connection)
            return
        response.connection.close()
        await response.pieces.aclose()

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()


async def send(connections: Connections, request: bytes) -> Response:
    """Send a prepared request and read the answer's head; the body follows.

    A kept-alive connection the server closed meanwhile fails before any answer
    arrives; the request then goes once more on a new connection.
    """
    connection = await connections.take()
    try:
        return await _exchange(connection, request)
    except (ConnectionError, asyncio.IncompleteReadError) as error:
        answered = isinstance(error, asyncio.IncompleteReadError) and error.partial
        if not connection.reused or answered:
            raise
    return await _exchange(await connections.open_new(), request)


async def _exchange(connection: Connection, request: bytes) -> Response:
    """Write the request and read the answer's head; close the connection on failure."""
    try:
        connection.writer.write(request)
        head = await connection.reader.readuntil(b"\r\n\r\n")
        return Response.from_head(head, connection)
    except BaseException:
        connection.close()
        raise


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    connection: Connection
    complete: bool = False
    pieces: AsyncIterator[bytes] = field(init=False)  # the body's; iterate it once

    def __post_init__(self) -> None:
        self.pieces = self._read_body()

    @classmethod
    def from_head(cls, head: bytes, connection: Connection) -> Response:
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise ProtocolError(f"not an HTTP/1.1 status line: {status_line[:100]!r}")
        headers = {}
        for line in header_lines:
            name, separator, value = line.partition(":")
            if separator:
                headers[name.strip().lower()] = value.strip()
        return cls(int(rest[:3]), headers, connection)

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"

    async def read_all(self) -> bytes:
        return b"".join([piece async for piece in self.pieces])

    async def finish(self, timeout_s: float) -> None:
        """Read what is left of the body, for at most `timeout_s`.

        A body read to its end leaves the connection reusable; one that is not
        done in time is given up (its connection is closed on release).
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                async for _ in self.pieces:
                    pass

    async def _read_body(self) -> AsyncIterator[bytes]:
        reader = self.connection.reader
        length = self.headers.get("content-length")
        if self.status in STATUSES_WITHOUT_BODY:
            pass
        elif "chunked" in self.headers.get("transfer-encoding", "").lower():
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                chunk = await reader.readexactly(size + 2)  # the data and its CRLF
                yield chunk[:-2]
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailer fields, up to the empty line
        elif length is not None:
            remaining = int(length)
            while remaining:
                piece = await reader.read(min(remaining, READ_LIMIT))
                if not piece:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(piece)
                yield piece
        else:  # the body ends with the connection
            self.headers["connection"] = "close"
            while piece := await reader.read(READ_LIMIT):
                yield piece
        self.complete = True
