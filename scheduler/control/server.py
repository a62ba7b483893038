"""/metrics, /livez, /healthz and /readyz on one small aiohttp server.

/livez: the event loop runs (an answer at all proves it).
/healthz: the process does its job: ``health()`` names no problem (the app's checks: the
scheduling loop has not stalled, the lease was not lost); 503 with the problem otherwise.
/readyz: the cache has synced with the API at least once, so this replica
could take over as leader with a warm cache.

A port already taken (a second replica on the same host) is :class:`PortInUse`, raised
before anything else starts by :func:`check_port_free`, and again by :func:`start_server`
should another process take the port in between.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class PortInUse(OSError):
    """The metrics port is taken; the message names the flag that moves it."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(
            errno.EADDRINUSE,
            f"{host}:{port} is already in use (another replica on this host?); "
            "choose a free port with --metrics-port",
        )

    def __str__(self) -> str:
        return str(self.strerror)


def check_port_free(host: str, port: int) -> None:
    """Fail fast, before touching the API, if ``host:port`` cannot be bound (0: any port)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(errno.EADDRNOTAVAIL, f"--metrics-host {host}: {exc}") from exc
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as probe:
            # As the server will: SO_REUSEADDR, so only a live listener makes this fail.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUse(host, port) from exc
                raise OSError(exc.errno, f"cannot bind {host}:{port}: {exc.strerror}") from exc


def _healthy() -> str | None:
    return None


async def start_server(
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    host: str,
    port: int,
    *,
    health: Callable[[], str | None] = _healthy,
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (for cleanup) and the bound port. ``health``
    returns None when healthy, else what is wrong."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def livez(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def healthz(_: web.Request) -> web.Response:
        problem = health()
        if problem is None:
            return web.Response(text="ok")
        return web.Response(status=503, text=problem)

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="cache not synced yet")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/livez", livez)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(host, port) from exc
        raise
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)
