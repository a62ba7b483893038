"""The scheduler process end to end, on its own control plane with 100 kwok nodes.

`lattice run` runs as a real process with the least-privilege RBAC we ship
(bound to a token user), so every test also proves the ClusterRole suffices.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import LATTICE_USER, ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import create_nodes, poll
from lattice_dev.devcluster.profiles import get_profile
from tests.conftest import report_line
from tests.e2e.lattice_proc import LatticeProcess, least_privilege_rbac

REPO = Path(__file__).resolve().parents[2]
NODES = 100
LEASE_NS = "lattice-system"


class Plane:
    def __init__(self, cluster: DevCluster, tmp: Path) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.kubectl = str(Path(cluster.load_state().binaries) / "kubectl")  # type: ignore[union-attr]
        self.user_kubeconfig = cluster.kubeconfig_for(LATTICE_USER.name)
        self._n = 0

    def run(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        out = subprocess.run(
            [self.kubectl, f"--kubeconfig={self.cluster.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            input=stdin,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr}")
        return out.stdout

    def lattice(self, *extra: str, identity: str | None = None) -> LatticeProcess:
        self._n += 1
        ident = identity or f"lattice-{self._n}"
        return LatticeProcess(
            self.user_kubeconfig,
            self.tmp / f"{ident}.log",
            ident,
            "--lease-namespace",
            LEASE_NS,
            *extra,
        )


@contextlib.contextmanager
def lattice_plane(tmp: Path, config: ClusterConfig) -> Iterator[Plane]:
    """A control plane of its own with our CRDs and the shipped scheduler RBAC
    (bound to a token user as well, so `lattice run` runs with exactly those rights)."""
    cluster = DevCluster(tmp / "state")
    cluster.up(config)
    try:
        p = Plane(cluster, tmp)
        p.run("apply", "--server-side", "-f", str(REPO / "crds"))
        p.run("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        rbac = least_privilege_rbac(
            REPO / "manifests" / "scheduler.yaml", LATTICE_USER.name, LEASE_NS
        )
        p.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(rbac))
        yield p
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with lattice_plane(tmp_path_factory.mktemp("schedplane"), ClusterConfig(nodes=NODES)) as p:
        yield p


def pod(name: str, cpu: str = "100m", scheduler: str = "lattice", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name.rsplit("-", 1)[0]}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                }
            ],
            **spec,
        },
    }


async def create_pods(api: client.ApiClient, ns: str, bodies: list[dict[str, Any]]) -> None:
    core = client.CoreV1Api(api)
    sem = asyncio.Semaphore(32)

    async def one(b: dict[str, Any]) -> None:
        async with sem:
            await core.create_namespaced_pod(ns, cast(client.V1Pod, b))

    await asyncio.gather(*(one(b) for b in bodies))


async def list_pods(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    raw: Any = await client.CoreV1Api(api).list_namespaced_pod(ns, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(await raw.read())["items"]
    return items


async def scheduled_events(api: client.ApiClient, ns: str) -> collections.Counter[str]:
    events = await client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector="reason=Scheduled"
    )
    return collections.Counter(e.involved_object.name for e in events.items)


async def wait_scheduled_events(
    api: client.ApiClient, ns: str, count: int, within: float = 30
) -> collections.Counter[str]:
    """Scheduled events trail the bindings (they go through the reporter's queue after)."""

    async def all_reported() -> collections.Counter[str] | None:
        got = await scheduled_events(api, ns)
        return got if len(got) >= count else None

    return await poll(all_reported, within=within, interval=0.5)


async def wait_bound(
    api: client.ApiClient, ns: str, count: int, within: float
) -> list[dict[str, Any]]:
    async def all_bound() -> list[dict[str, Any]] | None:
        pods = [p for p in await list_pods(api, ns) if p["spec"].get("schedulerName") == "lattice"]
        bound = [p for p in pods if p["spec"].get("nodeName")]
        return bound if len(bound) >= count else None

    return await poll(all_bound, within=within, interval=0.5)


async def _scrape(sched: LatticeProcess, path: str) -> str:
    """GET from the scheduler's metrics server (its port is in the 'serving' log line)."""
    import aiohttp

    line = next(ln for ln in sched.lines() if ln.get("event") == "serving")
    port = int(str(line["reason"]).rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}{path}") as r:
        return await r.text()


def test_rbac_is_least_privilege(plane: Plane) -> None:
    def can(verb: str, resource: str, *extra: str) -> bool:
        out = plane.run(
            "auth", "can-i", verb, resource, f"--as={LATTICE_USER.name}", *extra, check=False
        )
        return out.strip() == "yes"

    sa = "--as=system:serviceaccount:lattice-system:lattice-scheduler"
    sub_binding = "--subresource=binding"
    assert (
        plane.run("auth", "can-i", "create", "pods", sub_binding, sa, check=False).strip() == "yes"
    )
    assert can("create", "pods", sub_binding)
    assert can("patch", "pods", "--subresource=status")
    assert can("watch", "pods")
    assert can("create", "events")
    assert can("delete", "pods")  # preemption's victims
    assert can("watch", "poddisruptionbudgets.policy")
    # Its own Lease only, by name (create cannot be limited by name).
    assert can("update", "leases/lattice-scheduler", "-n", LEASE_NS)
    assert not can("update", "leases/someone-else", "-n", LEASE_NS)
    assert can("patch", "latticeschedulers.lattice.dev", "--subresource=status")
    for verb, resource in [
        ("get", "secrets"),
        ("list", "configmaps"),
        ("deletecollection", "pods"),
        ("update", "pods"),
        ("create", "pods"),
        ("update", "nodes"),
        ("create", "leases"),
    ]:
        assert not can(verb, resource), f"should not {verb} {resource}"
    assert not can("update", "leases", "-n", "kube-system")


def test_manifests_pass_server_side_dry_run(plane: Plane) -> None:
    out = plane.run("apply", "--dry-run=server", "-f", str(REPO / "manifests"))
    assert "deployment.apps/lattice-scheduler" in out
    assert "daemonset.apps/lattice-agent" in out


async def test_500_pods_on_100_nodes(plane: Plane, api: client.ApiClient, ns: str) -> None:
    sched = plane.lattice().start()
    try:
        zone_pinned = [
            pod(f"zone-{i}", nodeSelector={"topology.kubernetes.io/zone": "zone-b"})
            for i in range(100)
        ]
        spread = [
            pod(
                f"spread-{i}",
                cpu="500m",
                topologySpreadConstraints=[
                    {
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": "spread"}},
                    }
                ],
            )
            for i in range(200)
        ]
        plain = [pod(f"plain-{i}", cpu="1") for i in range(200)]
        others = [pod(f"other-{i}", scheduler="someone-else") for i in range(20)]
        await create_pods(api, ns, zone_pinned + spread + plain + others)
        bound = await wait_bound(api, ns, 500, within=240)
        assert len(bound) == 500
        alloc = {n: get_profile("standard").capacity for n in range(NODES)}
        per_node: collections.Counter[str] = collections.Counter()
        spread_per_node: collections.Counter[str] = collections.Counter()
        for p in bound:
            node = p["spec"]["nodeName"]
            idx = int(node.rsplit("-", 1)[1])
            per_node[node] += int(
                float(
                    p["spec"]["containers"][0]["resources"]["requests"]["cpu"].replace("m", "e-3")
                )
                * 1000
            )
            if p["metadata"]["name"].startswith("zone-"):
                assert idx % 3 == 1, f"{p['metadata']['name']} on {node} outside zone-b"
            if p["metadata"]["name"].startswith("spread-"):
                spread_per_node[node] += 1
        assert max(per_node.values()) <= int(alloc[0]["cpu"]) * 1000
        assert (
            max(spread_per_node.values())
            - min(spread_per_node[f"kwok-node-{i:04d}"] for i in range(NODES))
            <= 1
        )
        others_now = [
            p for p in await list_pods(api, ns) if p["spec"]["schedulerName"] == "someone-else"
        ]
        assert len(others_now) == 20
        assert all(
            not p["spec"].get("nodeName") and not p.get("status", {}).get("conditions")
            for p in others_now
        )
        events = await wait_scheduled_events(api, ns, 500)
        assert all(c == 1 for c in events.values())
        assert len(events) == 500
        metrics = await _scrape(sched, "/metrics")
        assert 'lattice_scheduling_attempts_total{result="scheduled"} 500.0' in metrics
        assert "lattice_binding_duration_seconds_count 500.0" in metrics
        assert await _scrape(sched, "/readyz") == "ok"

        async def status_shows_it() -> dict[str, Any] | None:
            obj: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
                "lattice.dev", "v1alpha1", "latticeschedulers", "lattice"
            )
            st = obj.get("status", {})
            return st if st.get("counts", {}).get("scheduled", 0) >= 500 else None

        status = await poll(status_shows_it, within=20, interval=0.5)
        assert status["leader"] == sched.identity
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        assert status["latency"]["p99Ms"] > 0
        table = plane.run("get", "latticeschedulers")
        assert sched.identity in table
        assert "True" in table
    finally:
        sched.stop()
    assert sched.proc is not None
    assert sched.proc.returncode == 0  # a graceful stop on SIGTERM
    lease = await client.CoordinationV1Api(api).read_namespaced_lease("lattice-scheduler", LEASE_NS)
    assert not lease.spec.holder_identity  # released on graceful stop
    lines = sched.lines()
    traced = [ln for ln in lines if ln.get("event") == "pod_bound"]
    assert len(traced) == 500
    # kopf's start-up (discovery, its first list) is over before the first cycle.
    said = [ln.get("event") for ln in lines]
    assert "kopf_slow_to_start" not in said
    done = said.index("start_up_done")
    assert str(lines[done]["reason"]).startswith("kopf listed: True; ")
    assert done < said.index("pod_bound")
    # The writes' connections (64 bindings + 8 reports in flight) were open before it too.
    opened = said.index("connections_opened")
    assert lines[opened]["reason"] == "72 keep-alive connections for writes"
    assert done < opened < said.index("pod_bound")
    assert all(len(ln["trace_id"]) == 32 for ln in traced)


async def test_unschedulable_gets_event_and_condition_then_lands_on_a_new_node(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    sched = plane.lattice().start()
    core = client.CoreV1Api(api)
    try:
        await create_pods(api, ns, [pod("waiting", nodeSelector={"pool": "new"})])

        async def failed() -> Any:
            p = await core.read_namespaced_pod("waiting", ns)
            conds = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
            return conds[0] if conds and conds[0].status == "False" else None

        cond = await poll(failed, within=60, interval=0.3)
        assert cond.reason == "Unschedulable"
        assert cond.message == (
            f"0/{NODES} nodes are available: {NODES} node(s) didn't match Pod's node "
            f"affinity/selector. preemption: 0/{NODES} nodes are available: {NODES} "
            "Preemption is not helpful for scheduling."
        )
        events = await core.list_namespaced_event(ns, field_selector="reason=FailedScheduling")
        assert any(e.message == cond.message and e.type == "Warning" for e in events.items)
        assert all(e.metadata.annotations.get("lattice.dev/trace-id") for e in events.items)

        body = get_profile("small").node_body("kwok-pool-new-0", 0)
        body["metadata"]["labels"]["pool"] = "new"
        await create_nodes(api, [body])
        bound = await wait_bound(api, ns, 1, within=60)
        assert bound[0]["spec"]["nodeName"] == "kwok-pool-new-0"
    finally:
        sched.stop()
        await core.delete_node("kwok-pool-new-0")


async def test_sigkill_mid_burst_then_restart_binds_each_pod_once(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    first = plane.lattice(
        "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1", identity="burst-a"
    ).start()
    second: LatticeProcess | None = None
    try:
        creating = asyncio.create_task(
            create_pods(api, ns, [pod(f"burst-{i}") for i in range(1000)])
        )

        async def some_bound() -> bool:
            return len([p for p in await list_pods(api, ns) if p["spec"].get("nodeName")]) >= 150

        await poll(some_bound, within=120, interval=0.2)
        first.signal(signal.SIGKILL)
        first.wait(10)
        await creating
        second = plane.lattice(
            "--lease-duration",
            "4",
            "--renew-deadline",
            "3",
            "--retry-period",
            "1",
            identity="burst-b",
        ).start()
        bound = await wait_bound(api, ns, 1000, within=300)
        assert len({p["metadata"]["name"] for p in bound}) == 1000
        events = await scheduled_events(api, ns)
        assert max(events.values()) == 1, "a pod was bound twice"
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_standby_takes_over_within_the_lease(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    fast = (
        "--lease-duration",
        "6",
        "--renew-deadline",
        "4",
        "--retry-period",
        "1",
    )
    a = plane.lattice(*fast, identity="ha-a").start()
    b = plane.lattice(*fast, identity="ha-b").start()
    coord = client.CoordinationV1Api(api)
    try:

        async def holder() -> str | None:
            try:
                lease = await coord.read_namespaced_lease("lattice-scheduler", LEASE_NS)
            except client.ApiException:
                return None
            return lease.spec.holder_identity or None

        leader = await poll(holder, within=60, interval=0.2)
        await create_pods(api, ns, [pod(f"ha-{i}") for i in range(100)])
        await wait_bound(api, ns, 100, within=120)
        # Reports trail bindings and a SIGKILL loses the unsent ones (as it would
        # kube-scheduler's): kill once the first hundred are reported.
        await wait_scheduled_events(api, ns, 100)
        victim, survivor = (a, b) if leader == "ha-a" else (b, a)
        before = await coord.read_namespaced_lease("lattice-scheduler", LEASE_NS)
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        killed_at = time.monotonic()

        async def taken_over() -> bool:
            return await holder() == survivor.identity

        await poll(taken_over, within=30, interval=0.2)
        takeover = time.monotonic() - killed_at
        after = await coord.read_namespaced_lease("lattice-scheduler", LEASE_NS)
        # The lease is valid for its duration after the last renewal; the standby
        # checks every retry period and notices a renewal up to one period late. The
        # victim may renew once more after `before` was read, and on two shared cores a
        # loaded Python process lags by up to a second: hence one more period and 1 s.
        gap = (after.spec.acquire_time - before.spec.renew_time).total_seconds()
        report_line(
            f"leader failover: standby acquired {gap:.1f}s after the last renewal "
            f"({takeover:.1f}s after SIGKILL), lease 6s, retry 1s"
        )
        assert gap <= 6 + 3 * 1 + 1.0, f"standby took {gap:.1f}s after the last renewal"
        await create_pods(api, ns, [pod(f"ha2-{i}") for i in range(100)])
        await wait_bound(api, ns, 200, within=120)
        events = await wait_scheduled_events(api, ns, 200)
        assert len(events) == 200
        assert max(events.values()) == 1
    finally:
        a.stop()
        b.stop()
