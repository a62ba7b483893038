"""Drive kube-scheduler through generated clusters and record what it decided.

Per cluster: create its namespaces, nodes and bound pods; make sure
kube-scheduler has seen them all (a sentinel pod's FailedScheduling or binding
names the expected node count); then create each incoming pod alone, wait for
kube-scheduler's verdict (a binding, or PodScheduled=False with its message),
read the cluster state back from the API, and delete the pod before the next
one so every pod meets the same cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import poll
from tests.e2e.differential.gen import Body, Cluster

# The filter part ends at the first ". "; PostFilter messages (DRA, preemption) follow it.
_MESSAGE = re.compile(r"^0/(\d+) nodes are available: (.*?)\.(?: .*)?$", re.S)


@dataclass(frozen=True)
class Verdict:
    """What kube-scheduler did with one pod."""

    node: str | None
    message: str | None
    total_nodes: int | None = None
    reasons: dict[str, int] | None = None
    """Per-reason node counts from the FailedScheduling message; None if it had none."""
    prefilter: str | None = None
    """A PreFilter rejection message (no per-node counts), if that is what it was."""


def parse_failure(message: str) -> Verdict:
    """Split "0/N nodes are available: 3 Insufficient cpu, 2 ...." into counts."""
    m = _MESSAGE.match(message.strip())
    if not m:
        return Verdict(None, message)
    total, body = int(m.group(1)), m.group(2)
    parts = re.split(r", (?=\d+ )", body)
    counts: dict[str, int] = {}
    for part in parts:
        num, _, reason = part.partition(" ")
        if not num.isdigit():
            return Verdict(None, message, total, None, prefilter=body)
        counts[reason] = counts.get(reason, 0) + int(num)
    return Verdict(None, message, total, counts)


@dataclass
class State:
    """The cluster as the API server had it when kube-scheduler decided."""

    nodes: list[Body]
    pods: list[Body]
    namespaces: list[Body]
    pod: Body
    """The incoming pod as stored: after defaulting and admission (e.g. added tolerations)."""


class KubeSide:
    """The kube-scheduler half of the differential test."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)

    async def setup(self, cl: Cluster) -> None:
        for ns in cl.namespaces():
            await self.core.create_namespace(cast(client.V1Namespace, ns))
        await asyncio.gather(*(self.core.create_node(cast(client.V1Node, n)) for n in cl.nodes))
        names = {n["metadata"]["name"] for n in cl.nodes}

        async def settled() -> bool:
            nodes = (await self.core.list_node()).items
            mine = [n for n in nodes if n.metadata.name in names]
            return len(mine) == len(names) and all(
                not any(t.key == "node.kubernetes.io/not-ready" for t in (n.spec.taints or []))
                and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                for n in mine
            )

        await poll(settled, within=60, interval=0.2)
        for pod in cl.existing:
            await self.core.create_namespaced_pod(
                pod["metadata"]["namespace"], cast(client.V1Pod, pod)
            )
        await self._sentinel(cl)

    async def _sentinel(self, cl: Cluster) -> None:
        """Wait until kube-scheduler's cache holds this cluster's nodes and pods.

        Pod and node events reach it in order per kind; a pod created after all
        of ours that names the expected node count in its verdict proves both.
        """
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sentinel", "namespace": cl.namespace},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "nodeSelector": {"lattice.dev/no-such-label": "x"},
            },
        }
        await self.core.create_namespaced_pod(cl.namespace, cast(client.V1Pod, body))
        want = len(cl.nodes)

        async def counted() -> bool:
            pod = await self.core.read_namespaced_pod("sentinel", cl.namespace)
            verdict = _verdict(pod)
            return verdict is not None and verdict.total_nodes == want

        await poll(counted, within=30, interval=0.05)
        await self._delete_pod(cl.namespace, "sentinel")

    async def place(self, cl: Cluster, pod: Body) -> tuple[Verdict, State]:
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        await self.core.create_namespaced_pod(ns, cast(client.V1Pod, pod))

        async def decided() -> Verdict | None:
            return _verdict(await self.core.read_namespaced_pod(name, ns))

        verdict = await poll(decided, within=30, interval=0.03)
        state = await self.state(exclude=(ns, name))
        await self._delete_pod(ns, name)
        return verdict, state

    async def state(self, exclude: tuple[str, str]) -> State:
        """Nodes, bound pods and namespaces as raw JSON, and the excluded pod itself."""
        # Raw JSON, exactly as any client sees it: camelCase keys, quantities as strings.
        responses = await asyncio.gather(
            self.core.list_node(_preload_content=False),
            self.core.list_pod_for_all_namespaces(_preload_content=False),
            self.core.list_namespace(_preload_content=False),
        )
        # _preload_content=False returns the raw aiohttp response, whatever the stubs say.
        raw = [cast(Any, r) for r in responses]
        items: list[list[Body]] = [json.loads(await r.read())["items"] for r in raw]
        raw_nodes, raw_pods, raw_ns = items

        def key(p: Body) -> tuple[str, str]:
            return (p["metadata"]["namespace"], p["metadata"]["name"])

        pods = [p for p in raw_pods if key(p) != exclude and p.get("spec", {}).get("nodeName")]
        (incoming,) = [p for p in raw_pods if key(p) == exclude]
        return State(raw_nodes, pods, raw_ns, incoming)

    async def _delete_pod(self, ns: str, name: str) -> None:
        await self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)

        async def gone() -> bool:
            try:
                await self.core.read_namespaced_pod(name, ns)
            except client.ApiException as exc:
                return exc.status == 404
            return False

        await poll(gone, within=30, interval=0.03)

    async def teardown(self, cl: Cluster) -> None:
        for ns in (cl.namespace, cl.other_namespace):
            await self.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        await asyncio.gather(*(self.core.delete_node(n["metadata"]["name"]) for n in cl.nodes))
        for ns in (cl.namespace, cl.other_namespace):
            await self.core.delete_namespace(ns)


def _verdict(pod: Any) -> Verdict | None:
    if pod.spec.node_name:
        return Verdict(pod.spec.node_name, None)
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.message:
            return parse_failure(cond.message)
    return None


@contextlib.contextmanager
def own_plane(
    factory: pytest.TempPathFactory, name: str, *, percentage_of_nodes_to_score: int | None = None
) -> Iterator[Path]:
    """A control plane of a differential test's own, with kube-scheduler (and the
    controller manager's PV binder and disruption controller): the suite's nodes would
    blur every verdict. ``percentage_of_nodes_to_score``: kube-scheduler's setting (100
    makes its choice one over every feasible node, so it can be compared with ours); None
    keeps its adaptive default. Yields its kubeconfig."""
    cluster = DevCluster(factory.mktemp(name) / "state")
    cluster.up(
        ClusterConfig(
            nodes=0,
            with_kube_scheduler=True,
            percentage_of_nodes_to_score=percentage_of_nodes_to_score,
        )
    )
    try:
        yield cluster.kubeconfig
    finally:
        cluster.down()
