"""The benchmarks' binding watcher against the real API server: a watch the server
closes resumes from the last resourceVersion without losing a pod; a 410 Gone
re-lists, and the pods bound while the watch was down are recorded and flagged."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, cast

from kubernetes_asyncio import client

from lattice_dev.benchmarks.common import Event, Watcher
from lattice_dev.devcluster.kube import poll
from lattice_dev.devcluster.profiles import node_name
from tests.conftest import SUITE_NODES

NOBODY = "nobody"
"""A schedulerName no scheduler serves: the test binds the pods itself."""


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"schedulerName": NOBODY, "containers": [{"name": "c", "image": "busybox"}]},
    }


async def _create(core: client.CoreV1Api, ns: str, names: list[str]) -> None:
    for name in names:
        await core.create_namespaced_pod(ns, cast(client.V1Pod, _pod(name)))


async def _bind(core: client.CoreV1Api, ns: str, names: list[str]) -> dict[str, str]:
    """Bind each pod through the binding subresource, as a scheduler does; pod -> node."""
    where = {}
    for i, name in enumerate(names):
        node = node_name(i % SUITE_NODES)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await core.create_namespaced_pod_binding(
            name, ns, cast(client.V1Binding, body), _preload_content=False
        )
        where[name] = node
    return where


async def _all_seen(watcher: Watcher, names: list[str]) -> None:
    async def probe() -> bool:
        return set(names) <= watcher.bound.keys()

    await poll(probe, within=60)


async def test_watch_closed_by_server_resumes_without_losing_a_pod(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    watcher = Watcher(kube, namespace, timeout_seconds=1)
    watcher.start()
    try:
        await watcher.started.wait()
        names = [f"p-{i}" for i in range(30)]
        await _create(core, namespace, names)
        where: dict[str, str] = {}
        for k in range(3):
            batch = names[k * 10 : (k + 1) * 10]
            where |= await _bind(core, namespace, batch)
            await _all_seen(watcher, batch)
            resumes = watcher.reconnects

            async def resumed(before: int = resumes) -> bool:
                return watcher.reconnects > before

            await poll(resumed, within=30)  # the server closes each watch after 1 s
        assert watcher.nodes == where
        assert watcher.reconnects >= 3
        assert watcher.relists == 0
        assert not watcher.relisted
        assert watcher.summary(set(names)).startswith("bound 30/30 (")
    finally:
        await watcher.stop()


class FailsOnce(Watcher):
    """The next watch, once armed, first runs ``while_down`` (the watch is not open
    meanwhile) and then ends in the ERROR event an API server sends: 410 Expired
    for a resourceVersion compacted away, or another error."""

    while_down: Callable[[], Awaitable[None]] | None = None
    code, reason = 410, "Expired"

    async def _events(self, rv: str) -> AsyncGenerator[Event, None]:
        if self.while_down is not None:
            hook, self.while_down = self.while_down, None
            await hook()
            status = {"kind": "Status", "status": "Failure", "reason": self.reason}
            yield {"type": "ERROR", "object": status | {"code": self.code}}
            return
        async for ev in super()._events(rv):
            yield ev


async def _fail_once_while_binding(
    watcher: FailsOnce, core: client.CoreV1Api, ns: str, names: list[str]
) -> dict[str, str]:
    """Bind a third of ``names`` with the watch up, a third while it is down (then
    the injected error), a third after it is back; pod -> node."""
    before, down, after = names[:10], names[10:20], names[20:]
    await _create(core, ns, names)
    watcher.start()
    await watcher.started.wait()
    where = await _bind(core, ns, before)
    await _all_seen(watcher, before)

    async def bind_while_down() -> None:
        where.update(await _bind(core, ns, down))

    def failures() -> int:
        return watcher.relists + sum(watcher.cuts.values())

    counted = failures()
    watcher.while_down = bind_while_down

    async def back() -> bool:
        # After a 410 once the re-list is in; after another error once it is counted
        # (the resumed watch replays from the last version whenever it opens).
        return failures() > counted

    await poll(back, within=30)
    where |= await _bind(core, ns, after)
    await _all_seen(watcher, names)
    return where


async def test_410_gone_relists_and_records_every_bound_pod(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    watcher = FailsOnce(kube, namespace, timeout_seconds=1)
    names = [f"p-{i}" for i in range(30)]
    try:
        where = await _fail_once_while_binding(watcher, core, namespace, names)
        assert watcher.nodes == where
        assert watcher.relists == 1
        # Bound while the watch was down: seen by the re-list, and said so.
        assert watcher.relisted == set(names[10:20])
        summary = watcher.summary(set(names))
        assert summary.startswith("bound 30/30 (")
        assert "WARNING: 1 re-lists after 410 Gone, 10 pods timed at the re-list" in summary
    finally:
        await watcher.stop()


async def test_other_watch_error_resumes_from_the_last_version(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    watcher = FailsOnce(kube, namespace, timeout_seconds=1)
    watcher.code, watcher.reason = 500, "InternalError"
    names = [f"p-{i}" for i in range(30)]
    try:
        where = await _fail_once_while_binding(watcher, core, namespace, names)
        assert watcher.nodes == where
        # The resumed watch replays what happened while it was down: nothing timed late.
        assert watcher.relists == 0
        assert not watcher.relisted
        assert watcher.cuts == {"HTTP 500 InternalError": 1}
        summary = watcher.summary(set(names))
        assert summary.startswith("bound 30/30 (")
        assert "watch resumes, 1 HTTP 500 InternalError)" in summary
    finally:
        await watcher.stop()


async def test_stop_then_start_resumes_from_the_last_version(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    watcher = Watcher(kube, namespace)
    names = [f"p-{i}" for i in range(6)]
    await _create(core, namespace, names)
    watcher.start()
    await watcher.started.wait()
    await watcher.stop()
    where = await _bind(core, namespace, names)
    watcher.start()  # replays what happened while stopped: no re-list, no pod timed late
    try:
        await _all_seen(watcher, names)
        assert watcher.nodes == where
        assert watcher.relists == 0
        assert not watcher.relisted
    finally:
        await watcher.stop()
