"""`lattice explain` tries again when the API server sheds load (429) or is starting (503)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client

from scheduler.control import explain


async def test_429_and_503_are_retried_and_other_errors_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    answers: list[Any] = [client.ApiException(status=429), client.ApiException(status=503), "ok"]

    async def fake(args: argparse.Namespace) -> Any:
        calls.append(1)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def no_sleep(seconds: float) -> None:
        return None

    monkeypatch.setattr(explain, "_explain", fake)
    monkeypatch.setattr(asyncio, "sleep", no_sleep)
    got: Any = await explain._explain_retrying(argparse.Namespace())
    assert got == "ok"
    assert len(calls) == 3

    answers[:] = [client.ApiException(status=403), "never"]
    with pytest.raises(client.ApiException):
        await explain._explain_retrying(argparse.Namespace())
    assert len(calls) == 4  # a refusal is not retried

    answers[:] = [client.ApiException(status=429)] * explain.EXPLAIN_ATTEMPTS
    with pytest.raises(client.ApiException):
        await explain._explain_retrying(argparse.Namespace())
    assert len(calls) == 4 + explain.EXPLAIN_ATTEMPTS
