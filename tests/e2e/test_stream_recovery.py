"""`lattice run` across kube-apiserver restarts: watches that break mid-burst, and watches
whose resourceVersion the restarted API server no longer serves (410 Gone).

A control plane of its own with six roomy kwok nodes (pods capacity raised so a
thousand small pods fit), our CRDs and the shipped RBAC. The harness restarts
kube-apiserver with the same command line (:meth:`DevCluster.restart_component`).

Why a restart gives 410: the restarted API server's watch caches start at etcd's
revision at start-up, and a watch from an older resourceVersion is answered
``ERROR 410 "too old resource version"``. The second test makes sure the gap is real
and invisible: while the API server is down it deletes pods and a node straight in
etcd (the gRPC gateway on etcd's client URL), which moves the revision past anything a
client can have seen, and which no watch can ever report as an event.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar, cast

import aiohttp
import orjson
import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig, raw_node_ready
from lattice_dev.devcluster.kube import create_nodes
from lattice_dev.devcluster.profiles import get_profile, node_name
from scheduler.control.status import ensure_object
from tests.conftest import report_line
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_scheduler import Plane, lattice_plane, list_pods, pod, scheduled_events

pytestmark = pytest.mark.cluster

NODES = 6
NODE_PODS = "400"
"""Pods capacity of each node (the profile's 110 would not take 1000 pods on six)."""
GHOST = "stream-ghost"
"""The node the 410 test deletes while the API server is down."""
POOL = {"stream-test/pool": "main"}
"""A label of the module's nodes that the ghost lacks: the 410 test's burst cannot land there."""
GATE = "stream-test/held"
INTAKE_RELIST_STREAMS = ("pods/pending", "pods/assigned", "nodes")
"""Streams whose 410 Gone the 410 test requires in the process's own ``intake_relist``
lines (the intake logs one per stream that got 410 and re-listed)."""
LEASE = ("--lease-duration", "60", "--renew-deadline", "45", "--retry-period", "2")
"""A lease that outlives the outage: the API server is away 3-20 s on a loaded 2-core box,
and past the default 10 s renew deadline the leader gives up and, by design (as
kube-scheduler), exits. What is tested here is the watches and bindings, not that."""

T = TypeVar("T")


def node_body(name: str, index: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = get_profile("standard").node_body(name, index)
    body["metadata"]["labels"].update(labels or {})
    for key in ("capacity", "allocatable"):
        body["status"][key]["pods"] = NODE_PODS
    return body


async def wait_nodes_ready(api: client.ApiClient, names: set[str], within: float = 90) -> None:
    async def ready() -> bool:
        raw: Any = await client.CoreV1Api(api).list_node(_preload_content=False)
        items = orjson.loads(await raw.read())["items"]
        return names <= {n["metadata"]["name"] for n in items if raw_node_ready(n)}

    await tolerant_poll(ready, within=within)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with lattice_plane(tmp_path_factory.mktemp("streamplane"), ClusterConfig(nodes=0)) as p:

        async def add_nodes() -> None:
            from lattice_dev.devcluster.kube import api_client

            async with api_client(p.cluster.kubeconfig) as api:
                await create_nodes(api, [node_body(node_name(i), i, POOL) for i in range(NODES)])
                await wait_nodes_ready(api, {node_name(i) for i in range(NODES)})

        asyncio.run(add_nodes())
        yield p


# -- helpers ------------------------------------------------------------------------------

TRANSIENT = (OSError, TimeoutError, aiohttp.ClientError)
"""What a request meets while the API server restarts (refused, reset, cut connections)."""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, client.ApiException):
        return exc.status in (0, 429, 500, 502, 503, 504)
    return isinstance(exc, TRANSIENT)


async def tolerant_poll(
    probe: Callable[[], Awaitable[T | None]], within: float, interval: float = 0.3
) -> T:
    """Like ``kube.poll``, but an API server that is away or starting only means "not yet"."""
    deadline = time.monotonic() + within
    last = "no answer yet"
    while True:
        try:
            value = await probe()
            if value is not None and value is not False:
                return value
            last = repr(value)
        except Exception as exc:
            if not _transient(exc):
                raise
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {within:.0f}s (last: {last[:300]})")
        await asyncio.sleep(interval)


async def create_pods_through_outages(
    api: client.ApiClient, ns: str, bodies: list[dict[str, Any]], within: float = 180
) -> None:
    """Create pods as a client with retries does: a create that meets the restart is tried
    again (409 then means the lost-reply try had created it)."""
    core = client.CoreV1Api(api)
    sem = asyncio.Semaphore(32)
    deadline = time.monotonic() + within

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            while True:
                try:
                    await core.create_namespaced_pod(ns, cast(client.V1Pod, body))
                    return
                except client.ApiException as exc:
                    if exc.status == 409:
                        return
                    if not _transient(exc) or time.monotonic() > deadline:
                        raise
                except TRANSIENT:
                    if time.monotonic() > deadline:
                        raise
                await asyncio.sleep(0.2)

    await asyncio.gather(*(one(b) for b in bodies))


async def bound_count(api: client.ApiClient, ns: str) -> int:
    return sum(1 for p in await list_pods(api, ns) if p["spec"].get("nodeName"))


async def wait_all_bound(
    api: client.ApiClient, ns: str, names: set[str], sched: LatticeProcess, within: float
) -> list[dict[str, Any]]:
    """The namespace's pods once exactly ``names`` exist and every one has a node; fails at
    once if the scheduler has exited."""

    async def done() -> list[dict[str, Any]] | None:
        assert sched.proc is not None
        code = sched.proc.poll()
        assert code is None, f"lattice exited (code {code}) while pods were pending"
        pods = await list_pods(api, ns)
        got = {p["metadata"]["name"] for p in pods}
        if got == names and all(p["spec"].get("nodeName") for p in pods):
            return pods
        return None

    try:
        return await tolerant_poll(done, within=within, interval=0.5)
    except TimeoutError:
        pods = await list_pods(api, ns)
        got = {p["metadata"]["name"] for p in pods}
        unbound = sorted(p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName"))
        raise AssertionError(
            f"after {within:.0f}s: {len(unbound)} unbound ({unbound[:10]}), "
            f"missing {sorted(names - got)[:10]}, unexpected {sorted(got - names)[:10]}"
        ) from None


def bound_lines(sched: LatticeProcess, ns: str) -> dict[str, list[str]]:
    """Pod name -> the node of each ``pod_bound`` line the process logged for it."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    for line in sched.lines():
        if line.get("event") == "pod_bound" and str(line.get("pod", "")).startswith(f"{ns}/"):
            out[str(line["pod"]).split("/", 1)[1]].append(str(line["node"]))
    return out


async def metric(sched: LatticeProcess, sample: str) -> float | None:
    """One sample of the process's /metrics (its port is in the ``serving`` line), e.g.
    ``scheduler_pending_pods{queue="gated"}``; None if it is not (yet) there."""
    serving = [ln for ln in sched.lines() if ln.get("event") == "serving"]
    if not serving:
        return None
    port = int(str(serving[0]["reason"]).rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    for row in text.splitlines():
        name, _, value = row.rpartition(" ")
        if name == sample:
            return float(value)
    return None


GATED = 'scheduler_pending_pods{queue="gated"}'
CACHED_NODES = "lattice_cache_size_nodes"


def assert_each_bound_once(
    sched: LatticeProcess, ns: str, pods: list[dict[str, Any]], events: collections.Counter[str]
) -> None:
    """No pod bound twice, by every record there is: the API server's Scheduled events, the
    process's own ``pod_bound`` lines, and those lines' node against the pod's node now."""
    twice = sorted(name for name, n in events.items() if n > 1)
    assert not twice, f"Scheduled twice: {twice[:10]}"
    logged = bound_lines(sched, ns)
    twice = sorted(name for name, nodes in logged.items() if len(nodes) > 1)
    assert not twice, f"pod_bound logged twice: {[(n, logged[n]) for n in twice[:10]]}"
    node_of = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    moved = {
        n: (nodes[0], node_of.get(n)) for n, nodes in logged.items() if nodes[0] != node_of.get(n)
    }
    assert not moved, f"logged bound to one node, on another (or gone) now: {moved}"


# -- etcd, straight ---------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class Etcd:
    """The devcluster's etcd through its JSON gateway (``/v3/kv/*``): for changes made
    while kube-apiserver is down, which no watch can report."""

    def __init__(self, plane: Plane) -> None:
        state = plane.cluster.load_state()
        assert state is not None
        self.url = f"http://127.0.0.1:{state.ports['etcd']}"

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out

    def revision(self) -> int:
        return int(self._call("/v3/kv/range", {"key": _b64("/")})["header"]["revision"])

    def pods(self, ns: str) -> dict[str, bytes]:
        """Pod name -> its stored value (protobuf) in namespace ``ns``."""
        prefix = f"/registry/pods/{ns}/"
        got = self._call(
            "/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))}
        )
        return {
            base64.b64decode(kv["key"]).decode()[len(prefix) :]: base64.b64decode(kv["value"])
            for kv in got.get("kvs", [])
        }

    def delete(self, key: str) -> None:
        got = self._call("/v3/kv/deleterange", {"key": _b64(key)})
        assert got.get("deleted") == "1", f"etcd: {key} not deleted: {got}"


def _fields(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(field number, bytes) of a protobuf message's length-delimited fields."""
    i = 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return value

    while i < len(data):
        key = varint()
        wire = key & 7
        if wire == 0:
            varint()
        elif wire == 2:
            n = varint()
            yield key >> 3, data[i : i + n]
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"protobuf wire type {wire}")


def _field(data: bytes, number: int) -> bytes | None:
    return next((v for n, v in _fields(data) if n == number), None)


def stored_node_name(value: bytes) -> str:
    """spec.nodeName of a pod as kube-apiserver stores it: ``k8s\\0`` + runtime.Unknown
    (raw = field 2) wrapping the Pod (spec = field 2), whose nodeName is field 10."""
    assert value.startswith(b"k8s\x00"), value[:16]
    raw = _field(value[4:], 2)
    spec = _field(raw, 2) if raw is not None else None
    name = _field(spec, 10) if spec is not None else None
    return name.decode() if name else ""


async def watch_answer(api: client.ApiClient, path: str, rv: int) -> dict[str, Any]:
    """The first line of a watch of ``path`` from ``rv``."""
    query = [("watch", "true"), ("resourceVersion", str(rv)), ("timeoutSeconds", "5")]
    resp = await api.call_api(
        path, "GET", query_params=query, auth_settings=["BearerToken"], _preload_content=False
    )
    try:
        assert resp.status == 200, resp.status
        line: dict[str, Any] = orjson.loads(await resp.content.readline())
        return line
    finally:
        resp.close()


async def set_spec(api: client.ApiClient, spec: dict[str, Any]) -> None:
    """Merge into the LatticeScheduler object (the process reads it at start-up)."""
    await ensure_object(api, "lattice")
    patch = cast(Any, client.CustomObjectsApi(api)).patch_cluster_custom_object
    await patch(
        "lattice.dev",
        "v1alpha1",
        "latticeschedulers",
        "lattice",
        {"spec": spec},
        _content_type="application/merge-patch+json",
    )


# -- the tests --------------------------------------------------------------------------


async def test_kube_apiserver_restart_mid_burst_binds_each_of_1000_pods_once(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    etcd = Etcd(plane)
    # Bindings paced at 100/s (read at start-up): unpaced, a quiet machine binds all 1000
    # before the API server is down, and the test would prove nothing.
    await set_spec(api, {"clientQPS": 100, "clientBurst": 1})
    sched = plane.lattice(*LEASE, identity="restart-burst").start()
    names = {f"burst-{i}" for i in range(1000)}
    outage: dict[str, int] = {}
    try:
        creating = asyncio.create_task(
            create_pods_through_outages(api, ns, [pod(n, cpu="10m") for n in sorted(names)])
        )

        async def some_bound() -> bool:
            return await bound_count(api, ns) >= 150

        await tolerant_poll(some_bound, within=120, interval=0.1)

        def count_at_outage() -> None:
            stored = etcd.pods(ns)
            outage["stored"] = len(stored)
            outage["bound"] = sum(1 for v in stored.values() if stored_node_name(v))

        down_for = await asyncio.to_thread(
            plane.cluster.restart_component, "kube-apiserver", while_down=count_at_outage
        )
        assert outage["bound"] < 1000, "the burst was over before the restart: nothing tested"
        await creating
        pods = await wait_all_bound(api, ns, names, sched, within=120)
        assert sched.proc is not None
        assert sched.proc.poll() is None, "lattice exited when the API server went away"
        events = await scheduled_events(api, ns)
        assert_each_bound_once(sched, ns, pods, events)
        assert {p["spec"]["nodeName"] for p in pods} <= {node_name(i) for i in range(NODES)}
        report_line(
            f"apiserver restart mid-burst: {outage['bound']}/{outage['stored']} stored pods bound "
            f"when it stopped, down {down_for:.1f}s, all 1000 bound once afterwards"
        )
    finally:
        sched.stop()
        await set_spec(api, {"clientQPS": 500, "clientBurst": 1000})  # the defaults
    assert sched.proc.returncode == 0, "not a graceful stop after the restart"


async def test_watch_resumed_across_a_restart_gets_410_relists_and_reconciles(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    """Pods and a node deleted in etcd while the API server is down: the scheduler's watches
    get 410 on resume, and only a new list can tell it. 100 pods are held by a scheduling
    gate through the restart and are free to go anywhere afterwards (on the empty ghost
    node above all, were it still believed in); 200 more are being bound when the API
    server stops, on the pool the ghost is not in."""
    etcd = Etcd(plane)
    core = client.CoreV1Api(api)
    await create_nodes(api, [node_body(GHOST, NODES)])
    await wait_nodes_ready(api, {GHOST})
    # Bindings paced at 60/s, read at start-up: the burst is still on when the API server stops.
    await set_spec(api, {"clientQPS": 60, "clientBurst": 1})
    sched = plane.lattice(*LEASE, identity="restart-410").start()
    held = {f"held-{i}" for i in range(100)}
    burst = {f"burst-{i}" for i in range(200)}
    gap: dict[str, Any] = {}
    try:
        gated = [pod(n, cpu="10m", schedulingGates=[{"name": GATE}]) for n in sorted(held)]
        await create_pods_through_outages(api, ns, gated)

        async def all_held() -> bool:
            return await metric(sched, GATED) == len(held)

        await tolerant_poll(all_held, within=60)
        bursting = [pod(n, cpu="10m", nodeSelector=POOL) for n in sorted(burst)]
        await create_pods_through_outages(api, ns, bursting)

        async def some_bound() -> bool:
            return await bound_count(api, ns) >= 60

        await tolerant_poll(some_bound, within=120, interval=0.1)

        def delete_behind_its_back() -> None:
            gap["revision"] = etcd.revision()  # no client can have seen a newer one
            on_node = {name: stored_node_name(v) for name, v in etcd.pods(ns).items()}
            pending = sorted(n for n in burst if n in on_node and not on_node[n])
            gap["pending"] = len(pending)
            gap["on_ghost"] = sorted(n for n, node in on_node.items() if node == GHOST)
            gap["deleted"] = set(pending[::4]) | set(sorted(held)[::4])
            for name in sorted(gap["deleted"]):
                etcd.delete(f"/registry/pods/{ns}/{name}")
            etcd.delete(f"/registry/minions/{GHOST}")

        down_for = await asyncio.to_thread(
            plane.cluster.restart_component, "kube-apiserver", while_down=delete_behind_its_back
        )
        back = time.monotonic()
        assert not gap["on_ghost"], f"bound to the ghost before the stop: {gap['on_ghost']}"
        assert gap["pending"] >= 20, f"only {gap['pending']} pods pending at the stop"
        # A watch resumed from any resourceVersion served before the restart is 410 Gone, so
        # what was deleted in the gap the scheduler can only learn from a new list.
        for path in ("/api/v1/nodes", "/api/v1/pods"):
            answer = await watch_answer(api, path, gap["revision"])
            assert (answer["type"], answer["object"].get("code")) == ("ERROR", 410), answer

        kept_held = held - gap["deleted"]

        async def reconciled() -> bool:
            # The ghost out of the cache, the deleted held pods out of the queue.
            nodes = await metric(sched, CACHED_NODES)
            return nodes == NODES and await metric(sched, GATED) == len(kept_held)

        await tolerant_poll(reconciled, within=60)
        reconciled_after = time.monotonic() - back
        ungate = [{"op": "remove", "path": "/spec/schedulingGates"}]
        for name in sorted(kept_held):
            await core.patch_namespaced_pod(name, ns, ungate)
        remaining = (held | burst) - gap["deleted"]
        pods = await wait_all_bound(api, ns, remaining, sched, within=120)
        assert sched.proc is not None
        assert sched.proc.poll() is None, "lattice exited when the API server went away"
        on_ghost = sorted(p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] == GHOST)
        assert not on_ghost, f"bound to the node deleted during the gap: {on_ghost[:10]}"
        logged = bound_lines(sched, ns)
        bound_gone = sorted(gap["deleted"] & logged.keys())
        assert not bound_gone, f"pods deleted during the gap were bound: {bound_gone[:10]}"
        events = await scheduled_events(api, ns)
        assert_each_bound_once(sched, ns, pods, events)
        relists = [
            str(ln.get("reason", "")) for ln in sched.lines() if ln.get("event") == "intake_relist"
        ]
        for stream in INTAKE_RELIST_STREAMS:
            assert any(r.startswith(f"{stream}: 410") for r in relists), (stream, relists)
        reconciles = [
            str(ln.get("reason", "")) for ln in sched.lines() if ln.get("event") == "feed_reconcile"
        ]
        # The bound pods' re-list came page by page (never held whole), and was applied.
        assert any(r.startswith("pods/assigned: ") and r.endswith(", paged") for r in reconciles), (
            reconciles
        )
        report_line(
            f"410 after an apiserver restart: {gap['pending']} of the burst pending at the stop; "
            f"{len(gap['deleted'])} pods and a node deleted in etcd, down {down_for:.1f}s; "
            f"reconciled {reconciled_after:.1f}s after; the other {len(remaining)} bound once"
        )
    finally:
        sched.stop()
        await set_spec(api, {"clientQPS": 500, "clientBurst": 1000})  # the defaults
        try:
            await core.delete_node(GHOST)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    assert sched.proc.returncode == 0, "not a graceful stop after the restart"
