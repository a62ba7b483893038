"""One rule for API errors on the write path (issue #36).

A request to the API server ends in one of three ways: an answer (2xx), a refusal
(:class:`ApiException` with its status) or no answer at all: the connection was refused,
reset or dropped mid-request (``aiohttp.ServerDisconnectedError``,
``ClientConnectorError``, an ``OSError``) or the request timed out. The last kind is
:data:`TRANSPORT_ERRORS`; with 429 and 5xx answers it is what kube's client treats as
transient (:func:`is_transient`).

Every write site of the scheduler (bindings, claim allocate/reserve/unreserve/deallocate,
extended-resource claims, volume patches, pod and PodGroup status, events, preemption's
deletions) turns :data:`WRITE_ERRORS` into the failed outcome it already has for a refusal
(an error string, ``BindResult.ERROR``, a logged best-effort failure): the pod goes back to
the queue with backoff and a SchedulerError, and what was assumed for it is given back. No
such exception escapes a spawned task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Final, TypeVar

import aiohttp
from kubernetes_asyncio import client

T = TypeVar("T")

TRANSPORT_ERRORS: Final = (OSError, TimeoutError, asyncio.TimeoutError, aiohttp.ClientError)
"""A request whose answer never came. ``aiohttp.ClientError`` covers
``ServerDisconnectedError`` (no ``OSError``) as well as ``ClientConnectorError``; TLS
failures are ``ClientSSLError``, a ``ClientError`` too."""

WRITE_ERRORS: Final = (*TRANSPORT_ERRORS, client.ApiException)
"""What a write may raise that is the API's or the network's doing, not ours: each write
site turns it into its failed outcome."""


def is_transient(exc: BaseException) -> bool:
    """kube's transient errors: no answer, too many requests (429), a server error (5xx).
    A retry (with backoff) may succeed where the same request just failed."""
    if isinstance(exc, client.ApiException):
        status = exc.status or 0
        return status == 429 or status >= 500
    return isinstance(exc, TRANSPORT_ERRORS)


def describe(exc: BaseException) -> str:
    """One line for a failed write: ``connection: <type>: <text>`` for a lost request,
    ``<status> <reason>`` for an answer."""
    if isinstance(exc, client.ApiException):
        return f"{exc.status} {exc.reason or ''}".rstrip()
    if isinstance(exc, TRANSPORT_ERRORS):
        return f"connection: {type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"


async def failure_of(call: Awaitable[str | None], doing: str) -> str | None:
    """Await a write whose outcome is None or why it failed; a :data:`WRITE_ERRORS`
    raised instead is such a failure too (``doing``: what the write was)."""
    try:
        return await call
    except WRITE_ERRORS as exc:
        return f"{doing}: {describe(exc)}"


async def written_or_failure(
    call: Awaitable[tuple[T | None, str | None]], doing: str
) -> tuple[T | None, str | None]:
    """Await a write whose outcome is (what was written, None) or (None, why it failed);
    a :data:`WRITE_ERRORS` raised instead is such a failure too."""
    try:
        return await call
    except WRITE_ERRORS as exc:
        return None, f"{doing}: {describe(exc)}"
