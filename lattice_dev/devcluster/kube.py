"""Small async helpers over kubernetes-asyncio for the devcluster and tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from kubernetes_asyncio import client, config

from scheduler.control.kubeconfig import skip_environment_lookups

T = TypeVar("T")


@asynccontextmanager
async def api_client(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    """An ApiClient for ``kubeconfig``, closed on exit."""
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    api = client.ApiClient(configuration=cfg)
    skip_environment_lookups(api)  # the harness pays the same per-request cost otherwise
    try:
        yield api
    finally:
        await api.close()


async def create_nodes(
    api: client.ApiClient, bodies: list[dict[str, Any]], parallel: int = 32
) -> None:
    """Create nodes with bounded concurrency; an existing node is left as it is."""
    core = client.CoreV1Api(api)
    sem = asyncio.Semaphore(parallel)

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            try:
                await core.create_node(cast(client.V1Node, body))  # dict bodies are accepted as-is
            except client.ApiException as exc:
                if exc.status != 409:
                    raise

    await asyncio.gather(*(one(b) for b in bodies))


def node_is_ready(node: Any) -> bool:
    """Ready=True and no not-ready/unreachable taint left by the node lifecycle controller."""
    conditions = (node.status.conditions or []) if node.status else []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    taints = node.spec.taints or [] if node.spec else []
    blocked = any(
        t.key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable") for t in taints
    )
    return ready and not blocked


async def poll(probe: Callable[[], Awaitable[T | None]], within: float, interval: float = 0.1) -> T:
    """Call ``probe`` until it returns something other than None/False; fail after ``within``."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {within:.1f}s")
        await asyncio.sleep(interval)
