"""`lattice run` end to end on its own control plane: what it says about itself (/livez,
/healthz, /readyz, kube-scheduler's metric names, the status's graph, PodScheduled written
only on change) and NodeResourceTopology objects (NFD's topology-updater) making placement
NUMA-aware on a node without the Lattice agent."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any, cast

import pytest
import yaml
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import create_nodes, poll
from lattice_dev.devcluster.profiles import get_profile
from scheduler.control.reporter import UNSCHEDULABLE
from scheduler.model import noderesourcetopology as nrt
from tests.charts.test_dashboard import DASHBOARD, metric_names, panels
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_scheduler import (
    Plane,
    _scrape,
    create_pods,
    lattice_plane,
    list_pods,
    pod,
    wait_bound,
)

NRT_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {
        "name": f"{nrt.PLURAL}.{nrt.GROUP}",
        # *.k8s.io groups need this; NFD's CRD carries the same kind of annotation.
        "annotations": {"api-approved.kubernetes.io": "unapproved, test stand-in"},
    },
    "spec": {
        "group": nrt.GROUP,
        "scope": "Cluster",
        "names": {
            "plural": nrt.PLURAL,
            "singular": "noderesourcetopology",
            "kind": nrt.KIND,
            "shortNames": ["node-res-topo"],
        },
        "versions": [
            {
                "name": nrt.VERSION,
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}
"""A minimal structural stand-in for NFD's CRD: only the API it serves matters here."""

GPU_NODE = "kwok-gpu-nrt-0"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with lattice_plane(tmp_path_factory.mktemp("healthplane"), ClusterConfig(nodes=3)) as p:
        p.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(NRT_CRD))
        p.run("wait", "--for=condition=Established", f"crd/{NRT_CRD['metadata']['name']}")
        yield p


async def namespace(api: client.ApiClient, name: str) -> str:
    core = client.CoreV1Api(api)
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": name}}))
    return name


async def get(sched: LatticeProcess, path: str) -> str:
    return await _scrape(sched, path)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""(name, labels) -> value of one /metrics scrape."""


def samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return sum(v for (n, ls), v in found.items() if n == name and set(labels.items()) <= ls)


async def serving(sched: LatticeProcess) -> None:
    async def up() -> bool:
        return any(ln.get("event") == "serving" for ln in sched.lines())

    await poll(up, within=60, interval=0.2)


async def test_health_metrics_and_status_of_a_working_leader(
    plane: Plane, api: client.ApiClient
) -> None:
    ns = await namespace(api, "health")
    core = client.CoreV1Api(api)
    sched = plane.lattice().start()
    try:
        await serving(sched)

        async def ready() -> bool:
            return await get(sched, "/readyz") == "ok"

        await poll(ready, within=60, interval=0.3)
        assert await get(sched, "/livez") == "ok"
        assert await get(sched, "/healthz") == "ok"

        await create_pods(api, ns, [pod(f"p-{i}") for i in range(12)])
        await create_pods(api, ns, [pod("waiting", nodeSelector={"pool": "none"})])
        await wait_bound(api, ns, 12, within=120)

        async def condition() -> Any:
            p = await core.read_namespaced_pod("waiting", ns)
            conds = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
            return conds[0] if conds and conds[0].status == "False" else None

        first = await poll(condition, within=60, interval=0.3)
        assert first.reason == UNSCHEDULABLE

        # Node label changes move the pod to a new attempt with the same verdict.
        def attempts() -> list[dict[str, Any]]:
            return [
                ln
                for ln in sched.lines()
                if ln.get("event") == "pod_unschedulable" and ln.get("pod") == f"{ns}/waiting"
            ]

        for i in range(3):
            plane.run("label", "node", "kwok-node-0000", f"lattice.dev/poke={i}", "--overwrite")

            async def retried(n: int = i + 2) -> bool:
                return len(attempts()) >= n

            await poll(retried, within=60, interval=0.3)
        again = await condition()
        assert again.last_transition_time == first.last_transition_time, "patched again"
        events = await core.list_namespaced_event(
            ns, field_selector="reason=FailedScheduling,involvedObject.name=waiting"
        )
        stamps = [datetime.fromisoformat(str(ln["timestamp"])) for ln in attempts()]
        span = (max(stamps) - min(stamps)).total_seconds()
        # One event per backoff window (10 s) of unchanged message, not one per attempt.
        assert 1 <= len(events.items) <= 1 + int(span // 10)

        async def metrics_settled() -> Samples | None:
            found = samples(await get(sched, "/metrics"))
            pending = value(found, "scheduler_pending_pods", queue="unschedulable")
            return found if pending == 1 else None

        found = await poll(metrics_settled, within=30, interval=0.5)
        attempts_total = "scheduler_schedule_attempts_total"
        assert value(found, attempts_total, result="scheduled", profile="lattice") == 12
        assert value(found, attempts_total, result="unschedulable", profile="lattice") >= 4
        assert value(found, attempts_total, result="error", profile="lattice") == 0
        assert value(found, "scheduler_pod_scheduling_sli_duration_seconds_count") == 12
        assert value(found, "scheduler_plugin_execution_duration_seconds_count") > 0
        assert value(found, "process_resident_memory_bytes") > 0
        assert value(found, "lattice_graph_patches_total") > 0
        exposed = {name for name, _ in found}
        for panel in panels(json.loads(DASHBOARD.read_text())):
            for target in panel.get("targets", []):
                missing = metric_names(target["expr"]) - exposed
                assert not missing, f"{panel['title']}: {missing} not in the live /metrics"

        async def graph_in_status() -> dict[str, Any] | None:
            obj: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
                "lattice.dev", "v1alpha1", "latticeschedulers", "lattice"
            )
            graph: dict[str, Any] | None = obj.get("status", {}).get("graph")
            return graph if graph and graph["vertices"] >= 3 + 12 else None

        graph = await poll(graph_in_status, within=30, interval=0.5)
        assert graph["edges"] > 0
        assert await get(sched, "/healthz") == "ok", "a busy-then-idle leader is healthy"
    finally:
        sched.stop()
        await core.delete_namespace(ns)
    assert sched.proc is not None
    assert sched.proc.returncode == 0


def zone(numa: int, gpus: int) -> dict[str, Any]:
    return {
        "name": f"node-{numa}",
        "type": "Node",
        "costs": [
            {"name": "node-0", "value": 10 if numa == 0 else 21},
            {"name": "node-1", "value": 21 if numa == 0 else 10},
        ],
        "resources": [
            {"name": "cpu", "capacity": "48", "allocatable": "48", "available": "48"},
            {"name": "memory", "capacity": "512Gi", "allocatable": "500Gi", "available": "500Gi"},
            {
                "name": "nvidia.com/gpu",
                "capacity": str(gpus),
                "allocatable": str(gpus),
                "available": str(gpus),
            },
        ],
    }


def nrt_object(policy: str) -> dict[str, Any]:
    """As NFD's topology-updater writes it for a two-socket node with 4 GPUs per socket."""
    return {
        "apiVersion": nrt.API_VERSION,
        "kind": nrt.KIND,
        "metadata": {"name": GPU_NODE},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": policy},
            {"name": "topologyManagerScope", "value": "pod"},
        ],
        "zones": [zone(0, 4), zone(1, 4)],
    }


def gpu_pod(name: str, gpus: int, **annotations: str) -> dict[str, Any]:
    body = pod(name, nodeSelector={"kubernetes.io/hostname": GPU_NODE})
    body["metadata"]["annotations"] = annotations
    body["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)},
        "limits": {"nvidia.com/gpu": str(gpus)},
    }
    return body


async def test_node_resource_topology_makes_placement_numa_aware(
    plane: Plane, api: client.ApiClient
) -> None:
    ns = await namespace(api, "numa")
    core = client.CoreV1Api(api)
    objects = client.CustomObjectsApi(api)
    body = copy.deepcopy(get_profile("gpu-8x").node_body(GPU_NODE, 0))
    await create_nodes(api, [body])
    # Before `lattice run` starts: the start-up list must bring it in.
    await objects.create_cluster_custom_object(
        nrt.GROUP, nrt.VERSION, nrt.PLURAL, nrt_object("single-numa-node")
    )
    sched = plane.lattice().start()
    try:
        await create_pods(
            api,
            ns,
            [gpu_pod("eight", 8), gpu_pod("four", 4, **{"lattice.dev/gpu-alignment": "strict"})],
        )

        async def four_bound() -> dict[str, Any] | None:
            pods = {p["metadata"]["name"]: p for p in await list_pods(api, ns)}
            return pods["four"] if pods["four"]["spec"].get("nodeName") else None

        four = await poll(four_bound, within=60, interval=0.3)
        devices = json.loads(four["metadata"]["annotations"]["lattice.dev/devices"])
        # Known only from the NodeResourceTopology: a NUMA node, no device identities.
        assert devices == {"gpus": [], "nics": [], "numa": 0}

        async def eight_refused() -> Any:
            p = await core.read_namespaced_pod("eight", ns)
            conds = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
            return conds[0] if conds and conds[0].status == "False" else None

        refused = await poll(eight_refused, within=60, interval=0.3)
        assert refused.reason == UNSCHEDULABLE
        assert "cannot hold 8 GPUs on one NUMA node" in refused.message, refused.message

        # The kubelet's policy relaxed: the watch brings the change and frees the pod.
        await core.delete_namespaced_pod("four", ns, grace_period_seconds=0)
        current = await objects.get_cluster_custom_object(
            nrt.GROUP, nrt.VERSION, nrt.PLURAL, GPU_NODE
        )
        relaxed = nrt_object("none")
        relaxed["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await objects.replace_cluster_custom_object(
            nrt.GROUP, nrt.VERSION, nrt.PLURAL, GPU_NODE, relaxed
        )

        async def eight_bound() -> str | None:
            node: str | None = (await core.read_namespaced_pod("eight", ns)).spec.node_name
            return node

        assert await poll(eight_bound, within=90, interval=0.3) == GPU_NODE
    finally:
        sched.stop()
        await core.delete_namespace(ns)
        await objects.delete_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, GPU_NODE)
        await core.delete_node(GPU_NODE)
