"""Helpers the benchmarks share: a binding watcher, paced pod creation, CRD installation."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio import client

from scheduler.devcluster.cluster import ClusterState, DevCluster

REPO = Path(__file__).resolve().parents[2]

BoundCallback = Callable[[str, str, float], None]
"""Called as (pod name, node name, monotonic time) when a pod is first seen bound."""


class Watcher:
    """Records when, and where, each pod of a namespace is first seen bound (raw watch)."""

    def __init__(
        self, api: client.ApiClient, ns: str, on_bound: BoundCallback | None = None
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.bound: dict[str, float] = {}
        """Pod name -> time.monotonic() when first seen bound."""
        self.nodes: dict[str, str] = {}
        """Pod name -> node it was bound to."""
        self.on_bound = on_bound
        self._task: asyncio.Task[None] | None = None
        self.started = asyncio.Event()

    async def _run(self) -> None:
        rv = "0"
        while True:
            resp: Any = await self.core.list_namespaced_pod(
                self.ns,
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=600,
                _preload_content=False,
            )
            self.started.set()
            async for line in resp.content:
                ev = json.loads(line)
                obj = ev["object"]
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                name = obj.get("metadata", {}).get("name")
                node = obj.get("spec", {}).get("nodeName")
                if node and name not in self.bound:
                    now = time.monotonic()
                    self.bound[name] = now
                    self.nodes[name] = node
                    if self.on_bound is not None:
                        self.on_bound(name, node, now)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def create_pods(
    core: client.CoreV1Api, ns: str, bodies: list[dict[str, Any]], rate: float | None = None
) -> dict[str, float]:
    """Create pods (at ``rate``/s, or as fast as 32 parallel calls go); return send times."""
    sent: dict[str, float] = {}
    sem = asyncio.Semaphore(32)

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            sent[body["metadata"]["name"]] = time.monotonic()
            await core.create_namespaced_pod(ns, cast(client.V1Pod, body))

    if rate is None:
        await asyncio.gather(*(one(b) for b in bodies))
        return sent
    tasks = []
    start = time.monotonic()
    for i, body in enumerate(bodies):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(body)))
    await asyncio.gather(*tasks)
    return sent


async def wait_all(watcher: Watcher, names: set[str], within: float) -> int:
    """Wait until every pod in ``names`` is bound or ``within`` s passed; the number unbound."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        missing = len(names - watcher.bound.keys())
        if not missing:
            return 0
        await asyncio.sleep(0.2)
    return len(names - watcher.bound.keys())


def apply_crds(cluster: DevCluster, state: ClusterState) -> None:
    """Apply the repository's CRDs (server-side) and wait until they are established."""
    kubectl = [str(Path(state.binaries) / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
    subprocess.run(
        [*kubectl, "apply", "--server-side", "-f", str(REPO / "crds")],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"],
        check=True,
        capture_output=True,
    )


def start_lattice(cluster: DevCluster) -> int:
    """`lattice run` on the cluster as the only replica, quiet, metrics on a free port; its pid."""
    return cluster.start_process(
        "lattice",
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "run",
            f"--kubeconfig={cluster.kubeconfig}",
            "--no-leader-elect",
            "--metrics-host=127.0.0.1",
            "--metrics-port=0",
            "--log-level=warning",
        ],
        marker="scheduler.cli",
    )
