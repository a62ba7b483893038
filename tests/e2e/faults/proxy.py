"""A TCP proxy on loopback that breaks connections to the API server on purpose.

It sits between `lattice run` and kube-apiserver and relays bytes; TLS passes through
untouched (the proxy never reads a request), so each chunk the client sends is, to the
proxy, "a request or part of one". While faulting, each such chunk draws its fate from
the seeded generator:

* **reset before**: the connection is reset (RST) and the chunk never reaches the server;
* **reset after**: the chunk is forwarded, the server's answer withheld, then both sides
  are reset: the write landed but its client never learns so (the lost-reply case);
* **reset mid-flight**: half the chunk is forwarded, then both sides reset;
* **stall**: the chunk is held for a few seconds before it is forwarded;

and every answer chunk (watch streams included) may be cut with a small probability.
Between these, the listening socket is closed for short windows: a connect then meets
``ECONNREFUSED``, as during an API server's rolling restart. :meth:`FaultProxy.heal` ends
all of it; connections opened since relay faithfully.

Why at the TCP level: a client sees exactly what a network or a restarting API server
gives it (resets, refusals, timeouts), and the proxy need not hold any credential.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import socket
import struct
from dataclasses import dataclass
from typing import Final

CHUNK: Final = 65536


@dataclass(frozen=True)
class FaultMix:
    """Probabilities per client chunk (they add up to the share of requests faulted),
    per answer chunk (``cut``), and the refused windows' timing, in seconds."""

    reset_before: float = 0.03
    reset_after: float = 0.03
    reset_mid: float = 0.02
    stall: float = 0.03
    stall_for: tuple[float, float] = (1.0, 6.0)
    cut: float = 0.002
    refuse_every: tuple[float, float] = (4.0, 10.0)
    refuse_for: tuple[float, float] = (0.3, 2.0)


class _Reset(Exception):
    """Raised inside a pump: reset both sides of the connection now."""


class _Conn:
    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.withheld = False
        """Set after a "reset after": the server's answer must not reach the client."""


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), not FIN: the peer sees ``connection reset``."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """``127.0.0.1:port`` -> ``upstream``; faults from ``seed`` while :attr:`faulting`."""

    def __init__(self, upstream: tuple[str, int], seed: int, mix: FaultMix = FaultMix()) -> None:
        self.upstream = upstream
        self.mix = mix
        self.rng = random.Random(seed)
        self.faulting = False
        self.port = 0
        self.counts: collections.Counter[str] = collections.Counter()
        """Faults injected by kind, and ``connections``/``chunks`` relayed."""
        self._server: asyncio.base_events.Server | None = None
        self._refuser: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        await self._listen()
        return self.port

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def fault(self) -> None:
        """Start injecting faults (and refused windows)."""
        self.faulting = True
        self._refuser = asyncio.create_task(self._refuse_windows())

    async def heal(self) -> None:
        """Stop injecting: listening again if a refused window was open, every new chunk
        relayed as it is. Connections already reset stay reset; clients reconnect."""
        self.faulting = False
        if self._refuser is not None:
            self._refuser.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refuser
            self._refuser = None
        if self._server is None:
            await self._listen()

    async def close(self) -> None:
        await self.heal()
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    async def _refuse_windows(self) -> None:
        while True:
            await asyncio.sleep(self.rng.uniform(*self.mix.refuse_every))
            if self._server is None:
                continue
            self._server.close()  # the listening socket only; open connections go on
            self._server = None
            self.counts["refused_windows"] += 1
            try:
                await asyncio.sleep(self.rng.uniform(*self.mix.refuse_for))
            finally:
                await self._listen()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._relay(reader, writer)
        finally:
            self._conns.discard(task)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counts["connections"] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:  # the API server itself is away (e.g. restarting): refuse too
            _reset(writer)
            return
        conn = _Conn(writer, up_writer)
        pumps = [
            asyncio.create_task(self._client_to_server(reader, conn)),
            asyncio.create_task(self._server_to_client(up_reader, conn)),
        ]
        reset = True  # also when the proxy closes (cancelled here)
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            reset = any(not t.cancelled() and isinstance(t.exception(), _Reset) for t in done)
        finally:
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                if reset:
                    _reset(w)
                else:
                    w.close()

    def _draw(self) -> str | None:
        if not self.faulting:
            return None
        m = self.mix
        x = self.rng.random()
        for kind, p in (
            ("reset_before", m.reset_before),
            ("reset_after", m.reset_after),
            ("reset_mid", m.reset_mid),
            ("stall", m.stall),
        ):
            if x < p:
                return kind
            x -= p
        return None

    async def _client_to_server(self, reader: asyncio.StreamReader, conn: _Conn) -> None:
        while data := await reader.read(CHUNK):
            self.counts["chunks"] += 1
            kind = self._draw()
            if kind is not None:
                self.counts[kind] += 1
            if kind == "reset_before":
                raise _Reset
            if kind == "reset_mid":
                conn.server.write(data[: max(1, len(data) // 2)])
                await conn.server.drain()
                raise _Reset
            if kind == "stall":
                await asyncio.sleep(self.rng.uniform(*self.mix.stall_for))
            conn.server.write(data)
            await conn.server.drain()
            if kind == "reset_after":
                conn.withheld = True
                await asyncio.sleep(self.rng.uniform(0.2, 1.0))  # the server acts on it
                raise _Reset

    async def _server_to_client(self, reader: asyncio.StreamReader, conn: _Conn) -> None:
        while data := await reader.read(CHUNK):
            if conn.withheld:
                continue
            if self.faulting and self.rng.random() < self.mix.cut:
                self.counts["cut"] += 1
                raise _Reset
            conn.client.write(data)
            await conn.client.drain()
