"""What the DRA differentials against kube-scheduler share: the plane, the pinned pods, the
claims' written status, the node-name mapping and a pod's verdict.

One plane runs kube-scheduler and Lattice side by side on disjoint devices: every case has
drivers of its own and publishes the same devices twice, one slice per (driver, node);
kube-scheduler's pod is pinned to :data:`KUBE_NODE` and Lattice's to :data:`LATTICE_NODE`,
so neither ever sees the other's devices, and with one pool of one slice per driver on the
node kube's first fit is deterministic (the research brief, §3.1 and §6.3).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import poll
from lattice_dev.devcluster.profiles import node_name
from tests.e2e.test_scheduler import Plane, create_pods, lattice_plane, list_pods, pod

KUBE_NODE: Final = node_name(0)
LATTICE_NODE: Final = node_name(1)
NODES: Final = (KUBE_NODE, LATTICE_NODE)


def node_pair(index: int) -> tuple[str, str]:
    """The ``index``-th (kube-scheduler's node, Lattice's node) pair."""
    return node_name(2 * index), node_name(2 * index + 1)


SIDE_NODES: Final = node_pair(1)
"""A second pair of nodes, for cases that would disturb others on theirs (an incomplete
pool fails every All request on its node, whatever its driver)."""
BOUND: Final = "bound"


@contextlib.contextmanager
def dra_plane(tmp: Path, nodes: int = 2) -> Iterator[Plane]:
    """``nodes`` kwok nodes, kube-scheduler running, Lattice's RBAC applied (not yet
    started)."""
    with lattice_plane(tmp, ClusterConfig(nodes=nodes, with_kube_scheduler=True)) as p:
        yield p


def scheduler_for(node: str) -> str:
    """kube-scheduler's for the first node of every pair (even index), else Lattice."""
    return "default-scheduler" if int(node.rsplit("-", 1)[1]) % 2 == 0 else "lattice"


def pinned(
    case: str, node: str, claims: Sequence[str] | None = None, templates: Collection[str] = ()
) -> dict[str, Any]:
    """The case's pod for ``node``'s scheduler (:func:`scheduler_for`), pinned there, with
    ``claims`` by name (by default one claim named as the pod); a name in ``templates`` is a
    ResourceClaimTemplate's (kube-controller-manager generates the pod's claim from it)."""
    names = [f"{case}-{node}"] if claims is None else list(claims)
    return pod(
        f"{case}-{node}",
        scheduler=scheduler_for(node),
        nodeSelector={"kubernetes.io/hostname": node},
        resourceClaims=[
            {
                "name": pod_claim_name(i),
                ("resourceClaimTemplateName" if name in templates else "resourceClaimName"): name,
            }
            for i, name in enumerate(names)
        ],
    )


def pod_claim_name(index: int) -> str:
    """The name of a :func:`pinned` pod's ``index``-th entry in ``spec.resourceClaims``."""
    return f"devices-{index}" if index else "devices"


async def claim_status(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    raw: Any = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        "resource.k8s.io", "v1", ns, "resourceclaims", name, _preload_content=False
    )
    body: dict[str, Any] = json.loads(await raw.read())
    return body.get("status") or {}


async def list_claims(api: client.ApiClient, ns: str) -> dict[str, dict[str, Any]]:
    """Every claim of the namespace by name (one list call)."""
    raw: Any = await client.CustomObjectsApi(api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", ns, "resourceclaims", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(await raw.read())["items"]
    return {c["metadata"]["name"]: c for c in items}


STAMP: Final = "allocationTimestamp"


def unstamped(allocation: dict[str, Any] | None) -> dict[str, Any] | None:
    """``allocation`` without ``allocationTimestamp``: from 1.36 kube-scheduler stamps the
    claims it reserves, and so does Lattice, each with its own wall clock, so allocations
    are compared without it (and its presence checked apart)."""
    if allocation is None:
        return None
    return {k: v for k, v in allocation.items() if k != STAMP}


def as_kube(
    allocation: dict[str, Any], ours: str = LATTICE_NODE, theirs: str = KUBE_NODE
) -> dict[str, Any]:
    """Lattice's allocation (on ``ours``) with its node and pools named as
    kube-scheduler's (on ``theirs``)."""
    text = json.dumps(allocation).replace(ours, theirs)
    mapped: dict[str, Any] = json.loads(text)
    return mapped


def verdict(p: dict[str, Any]) -> str | None:
    """``bound``, the reason of a PodScheduled=False condition (Unschedulable,
    SchedulerError, ...), or None while the pod has neither."""
    if p["spec"].get("nodeName"):
        return BOUND
    for c in p.get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c.get("status") == "False":
            return str(c.get("reason") or "")
    return None


async def pinned_verdicts(
    api: client.ApiClient, ns: str, cases: Sequence[str], *, within: float = 60
) -> dict[str, list[str]]:
    """Per node (kube-scheduler's, Lattice's), ``bound`` or ``pending`` for each case in
    order: the case's pod pinned to each node (its claim named as the pod), created
    together, waited for until both are bound or Unschedulable (any other reason fails)."""
    out: dict[str, list[str]] = {KUBE_NODE: [], LATTICE_NODE: []}
    for case in cases:
        names = {f"{case}-{node}": node for node in (KUBE_NODE, LATTICE_NODE)}
        await create_pods(api, ns, [pinned(case, node) for node in names.values()])

        async def settled(names: dict[str, str] = names) -> dict[str, str | None] | None:
            pods = {p["metadata"]["name"]: p for p in await list_pods(api, ns)}
            seen = {n: verdict(pods[n]) for n in names if n in pods}
            return seen if len(seen) == 2 and all(seen.values()) else None

        seen = await poll(settled, within=within, interval=0.5)
        for name, node in names.items():
            out[node].append("bound" if seen[name] == BOUND else "pending")
            if seen[name] != BOUND:
                assert seen[name] == "Unschedulable", (name, seen[name])
    return out
