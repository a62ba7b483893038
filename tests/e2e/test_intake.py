"""The intake against the suite's real API server: paged lists, field selectors, a pod
moving between the pending and assigned streams, watch resume, 410 Gone and a missing CRD.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import aiohttp
import orjson
import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.kube import poll
from scheduler.control.intake import (
    ASSIGNED_PODS,
    PENDING_PODS,
    Batch,
    Event,
    EventType,
    Intake,
    IntakeSettings,
    PendingVerdict,
    PodTracker,
    Relisted,
    Resource,
    Stream,
    Unavailable,
    Update,
    assigned_pods,
    bound_fingerprint,
    custom,
    nodes,
    pending_pods,
    pod_fingerprint,
)
from tests.conftest import report_line

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("no_leaked_tasks")]

PAUSE = "registry.k8s.io/pause:3.10"


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """No intake task may outlive its test (as tests/control/conftest.py checks)."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    current = asyncio.current_task()
    leaked = {t for t in asyncio.all_tasks() - before if t is not current and not t.done()}
    for task in leaked:
        task.cancel()
    assert not leaked, f"leaked tasks: {leaked}"


def pod_body(name: str, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": PAUSE}]},
    }


def pod_spec(name: str, scheduler: str) -> client.V1Pod:
    return cast(client.V1Pod, pod_body(name, scheduler))  # dict bodies are sent as they are


def configmaps(namespace: str) -> Resource:
    """ConfigMaps of one test: a cheap object to write many of."""
    return Resource(
        key="configmaps",
        group="",
        version="v1",
        plural="configmaps",
        label_selector=f"intake-test={namespace}",
    )


async def make_configmap(core: client.CoreV1Api, namespace: str, name: str) -> None:
    body = {"metadata": {"name": name, "labels": {"intake-test": namespace}}, "data": {"k": "v"}}
    await core.create_namespaced_config_map(namespace, cast(client.V1ConfigMap, body))


async def collect(
    intake: Intake, done: Callable[[list[Update]], bool], within: float = 60
) -> list[Update]:
    got: list[Update] = []
    async with asyncio.timeout(within):
        while not done(got):
            got.extend(await intake.get())
    return got


def events(updates: list[Update], stream: str) -> list[Event]:
    return [e for u in updates if isinstance(u, Batch) and u.stream == stream for e in u.events]


def names(items: tuple[Any, ...] | list[Any], namespace: str) -> set[str]:
    return {o["metadata"]["name"] for o in items if o["metadata"].get("namespace", "") == namespace}


async def test_paged_initial_list_is_one_consistent_set_of_matching_pods(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    ours = f"intake-{namespace}"
    mine = {f"mine-{i}" for i in range(12)}
    for name in sorted(mine):
        await core.create_namespaced_pod(namespace, pod_spec(name, ours))
    for i in range(3):
        await core.create_namespaced_pod(namespace, pod_spec(f"other-{i}", f"other-{namespace}"))

    settings = IntakeSettings(page_size=5)
    async with Intake(kube, [pending_pods(ours)], settings=settings) as intake:
        await asyncio.wait_for(intake.wait_synced(), 60)
        got = intake.get_nowait()
        stream = intake.streams[PENDING_PODS]
    (listed,) = [u for u in got if isinstance(u, Relisted)]
    assert listed.initial
    assert names(listed.items, namespace) == mine  # the other scheduler's pods never arrive
    assert stream.stats.pages == 3  # 12 pods, 5 a page
    assert int(listed.resource_version) > 0


async def test_lists_are_read_uncompressed_as_kube_scheduler_reads_them(
    kube: client.ApiClient, namespace: str
) -> None:
    """The API server gzips a list over 128 KB for a client that accepts it (aiohttp does
    by default: the first request shows it); the intake's requests do not accept it."""
    core = client.CoreV1Api(kube)
    filler = "x" * 4096
    for i in range(40):  # 160 KB in one page
        body = {
            "metadata": {"name": f"big-{i}", "labels": {"intake-test": namespace}},
            "data": {"k": filler},
        }
        await core.create_namespaced_config_map(namespace, cast(client.V1ConfigMap, body))
    resource = configmaps(namespace)
    query = [("limit", "500"), ("labelSelector", resource.label_selector)]
    default: Any = await kube.call_api(
        resource.path,
        "GET",
        query_params=query,
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    try:
        assert default.headers.get("Content-Encoding") == "gzip"
    finally:
        default.release()

    stream = Stream(kube, resource, settings=IntakeSettings(), wake=asyncio.Event())
    resp: Any = await stream._get([("limit", "500")], aiohttp.ClientTimeout(total=30))
    try:
        assert resp.headers.get("Content-Encoding") is None
        data = await resp.read()
    finally:
        resp.release()
    assert len(orjson.loads(data)["items"]) == 40
    assert len(data) > 40 * 4096


async def test_binding_moves_a_pod_from_the_pending_to_the_assigned_stream(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    ours = f"intake-{namespace}"
    node = (await core.list_node()).items[0].metadata.name
    async with Intake(kube, [pending_pods(ours), assigned_pods()]) as intake:
        await asyncio.wait_for(intake.wait_synced(), 60)
        tracker = PodTracker()
        for u in intake.get_nowait():
            if isinstance(u, Relisted) and u.stream == ASSIGNED_PODS:
                tracker.relisted([o["metadata"]["uid"] for o in u.items], u.resource_version)
        created = await core.create_namespaced_pod(namespace, pod_spec("p", ours))
        uid = created.metadata.uid
        await collect(intake, lambda g: any(e.uid == uid for e in events(g, PENDING_PODS)))
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        resp: Any = await core.create_namespaced_binding(
            namespace, cast(client.V1Binding, binding), _preload_content=False
        )
        assert resp.status == 201
        resp.release()

        def moved(got: list[Update]) -> bool:
            left = any(
                e.uid == uid and e.type is EventType.DELETED for e in events(got, PENDING_PODS)
            )
            arrived = any(e.uid == uid for e in events(got, ASSIGNED_PODS))
            return left and arrived

        got = await collect(intake, moved)
    (left,) = [e for e in events(got, PENDING_PODS) if e.uid == uid]
    (arrived, *_) = [e for e in events(got, ASSIGNED_PODS) if e.uid == uid]
    # The pending stream's DELETED carries the last state it matched: still unbound.
    assert left.obj["spec"].get("nodeName", "") == ""
    assert arrived.type is EventType.ADDED
    assert arrived.obj["spec"]["nodeName"] == node
    # Our binding's confirmation is recognised without parsing: nothing else changed.
    assert pod_fingerprint(arrived.obj) == bound_fingerprint(left.obj, node=node)
    tracker.bound(uid)
    assert tracker.pending(left) is PendingVerdict.LEFT


async def test_watch_resumes_after_the_server_closes_it(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    settings = IntakeSettings(watch_timeout_s=1)
    async with Intake(kube, [configmaps(namespace)], settings=settings) as intake:
        await asyncio.wait_for(intake.wait_synced(), 60)
        stream = intake.streams["configmaps"]
        for i in range(3):
            await make_configmap(core, namespace, f"before-{i}")
        first = stream.stats.watches

        async def closed_and_reopened() -> bool:
            return stream.stats.watches >= first + 2

        await poll(closed_and_reopened, within=30)
        for i in range(3):
            await make_configmap(core, namespace, f"after-{i}")
        got = await collect(intake, lambda g: len(events(g, "configmaps")) >= 6)
    assert {e.obj["metadata"]["name"] for e in events(got, "configmaps")} == {
        *(f"before-{i}" for i in range(3)),
        *(f"after-{i}" for i in range(3)),
    }
    assert stream.stats.lists == 1
    assert stream.stats.relists == 0


@pytest.fixture
async def widgets(kube: client.ApiClient) -> AsyncIterator[Resource]:
    """A CRD of this test's own: the API server starts its watch cache when the CRD is
    created, so a resourceVersion from before then is outside that cache's window."""
    group = f"i{uuid.uuid4().hex[:8]}.intake.lattice.dev"
    ext = client.ApiextensionsV1Api(kube)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    await ext.create_custom_resource_definition(cast(client.V1CustomResourceDefinition, crd))

    async def established() -> bool:
        got = await ext.read_custom_resource_definition(f"widgets.{group}")
        conditions = got.status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    await poll(established, within=30)
    try:
        yield custom(group, "v1", "widgets")
    finally:
        await ext.delete_custom_resource_definition(f"widgets.{group}")


async def make_widget(api: client.ApiClient, widgets: Resource, ns: str, name: str) -> None:
    body = {"apiVersion": f"{widgets.group}/v1", "kind": "Widget", "metadata": {"name": name}}
    objects = client.CustomObjectsApi(api)
    await objects.create_namespaced_custom_object(widgets.group, "v1", ns, "widgets", body)


async def first_watch_line(api: client.ApiClient, path: str, rv: str) -> tuple[int, Any]:
    query = [("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", "5")]
    resp = await api.call_api(
        path, "GET", query_params=query, auth_settings=["BearerToken"], _preload_content=False
    )
    try:
        return resp.status, orjson.loads(await resp.content.readline())
    finally:
        resp.close()


async def test_a_resource_version_from_before_the_watch_cache_is_410_and_relists(
    kube: client.ApiClient, namespace: str, widgets: Resource
) -> None:
    for name in ("a", "b"):
        await make_widget(kube, widgets, namespace, name)
    # Verified, not assumed. On the suite's fresh etcd every built-in watch cache starts at
    # RV 1, so RV 1 is replayed there (and etcd compaction does not change that: the
    # cache serves it); a CRD's cache starts at the CRD's creation, so RV 1 is too old.
    _, builtin = await first_watch_line(kube, "/api/v1/namespaces/default/configmaps", "1")
    http_status, answer = await first_watch_line(kube, widgets.path, "1")
    report_line(
        f"intake: watch from RV 1 -> configmaps: {builtin['type']}; a new CRD: HTTP "
        f"{http_status} {answer['type']} {answer['object'].get('code')} "
        f"{answer['object'].get('message')!r}"
    )
    assert (http_status, answer["type"], answer["object"]["code"]) == (200, "ERROR", 410)

    settings = IntakeSettings(watch_timeout_s=1)
    async with Intake(kube, [widgets], settings=settings) as intake:
        await asyncio.wait_for(intake.wait_synced(), 60)
        stream = intake.streams[widgets.key]
        intake.get_nowait()
        await client.CustomObjectsApi(kube).delete_namespaced_custom_object(
            widgets.group, "v1", namespace, "widgets", "a"
        )

        async def relisted() -> bool:
            # As if the watch had fallen behind the cache's window, so its next resume is a
            # 410. An event or bookmark the live watch still reads moves the RV on again, so
            # set it until a watch has started from it.
            stream.resource_version = "1"
            return stream.stats.relists >= 1

        await poll(relisted, within=30)
        got = await collect(
            intake, lambda g: any(isinstance(u, Relisted) and not u.initial for u in g)
        )
    (reconcile,) = [u for u in got if isinstance(u, Relisted)]
    assert names(reconcile.items, namespace) == {"b"}  # what disappeared is gone
    assert stream.stats.relists == 1


async def test_a_missing_crd_is_reported_and_does_not_stop_the_rest(
    kube: client.ApiClient,
) -> None:
    missing = custom("nothere.lattice.dev", "v1", "widgets")
    async with Intake(kube, [missing, nodes()]) as intake:
        await asyncio.wait_for(intake.wait_synced(), 60)
        got = await collect(
            intake,
            lambda g: (
                {u.stream for u in g if isinstance(u, Relisted | Unavailable)}
                == {missing.key, "nodes"}
            ),
        )
        running = [not t.done() for t in intake._tasks]
    (gone,) = [u for u in got if isinstance(u, Unavailable)]
    assert gone.status == 404
    (listed,) = [u for u in got if isinstance(u, Relisted)]
    assert listed.items
    assert running == [True, True]
    assert not intake.streams[missing.key].available
