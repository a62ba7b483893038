"""`lattice demo` on GPU nodes: three scenes that show what Lattice is for.

Nine kwok nodes of the ``gpu-8x`` profile (8 GPUs and 4 RDMA NICs under four PCIe
switches each; their NodeTopology objects are published by the real agent code from a
fixture tree, as ``lattice devcluster up --node-profile gpu-8x`` does), tainted
``nvidia.com/gpu=present:NoSchedule`` as GPU pools usually are, so the CPU workload of
the demo stays off them. Each scene's pods keep to its own nodes with a nodeSelector.

1. **Fragmentation.** The same stream of 1- and 2-GPU pods, then one 8-GPU pod, goes to
   two nodes placed by Lattice and to two identical nodes placed by kube-scheduler
   (running beside it on the same control plane, its default profile). The table shows
   both placements, the free GPUs per node and the fragmentation measure GPUPlacement
   scores by (the free GPUs that a request of the scene's mix could not use, expected).
2. **PCIe.** A 2-GPU pod with an exclusive RDMA NIC (``rdma/hca: 1``, strict alignment)
   on a node where a 1-GPU pod already runs: its GPUs and NIC are read back from the
   pod's ``lattice.dev/devices`` and looked up in the node's NodeTopology, so the PCIe
   switch shown is the hardware's, not the scheduler's claim.
3. **Racks.** Two racks of two nodes (``example.com/rack``), one GPU node of rack-a busy.
   A gang of 2 x 4 GPUs that must stay in one rack, then a gang of 4 x 4 GPUs that needs a
   whole rack: the first takes the rack that holds it exactly, so the second still fits.

Nothing here is asserted by the demo itself: it prints what the API server holds. The
facts the scenes are meant to show are checked by ``tests/e2e/test_demo_gpu.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import numpy as np
from kubernetes_asyncio import client

from lattice_dev.devcluster.agents import (
    FixtureError,
    fixture_for_profile,
    publish_simulated_topologies,
)
from lattice_dev.devcluster.kube import create_nodes, poll
from lattice_dev.devcluster.profiles import get_profile
from scheduler.core.gpus import Free, SizeClass, fragmentation
from scheduler.model.quantity import Quantity
from scheduler.model.topology import NodeTopology

NS: Final = "demo-gpu"
PROFILE: Final = "gpu-8x"
GPU: Final = "nvidia.com/gpu"
NIC: Final = "rdma/hca"
SCENE: Final = "demo.lattice.dev/scene"
RACK: Final = "example.com/rack"
GANG_LABEL: Final = "scheduling.x-k8s.io/pod-group"
DEVICES: Final = "lattice.dev/devices"
CPU_PER_GPU: Final = 8
"""Cores a pod asks per GPU (the profile's 96 cores for 8 GPUs, a little under)."""
MEMORY_PER_GPU_GI: Final = 64
GI: Final = 1 << 30
STREAM: Final = (1, 2, 1, 2, 1, 1)
"""GPUs per pod of the fragmentation scene, in arrival order (8 in all), then one of BIG."""
BIG: Final = 8
NODE_GPUS: Final = Quantity.parse(get_profile(PROFILE).capacity[GPU]).value()
RACK_GANGS: Final = (("train-8", 2, 4), ("train-16", 4, 4))
"""(PodGroup, members, GPUs per member), in arrival order."""


@dataclass(frozen=True, slots=True)
class DemoNode:
    name: str
    scene: str
    rack: str | None = None


NODES: Final = (
    DemoNode("gpu-lattice-0", "frag-lattice"),
    DemoNode("gpu-lattice-1", "frag-lattice"),
    DemoNode("gpu-kube-0", "frag-kube"),
    DemoNode("gpu-kube-1", "frag-kube"),
    DemoNode("gpu-pcie-0", "pcie"),
    DemoNode("gpu-rack-a-0", "racks", "rack-a"),
    DemoNode("gpu-rack-a-1", "racks", "rack-a"),
    DemoNode("gpu-rack-b-0", "racks", "rack-b"),
    DemoNode("gpu-rack-b-1", "racks", "rack-b"),
)


def node_bodies() -> list[dict[str, Any]]:
    """The GPU nodes as kubelets would register them, labelled and tainted by an operator."""
    profile = get_profile(PROFILE)
    bodies = []
    for i, node in enumerate(NODES):
        body = profile.node_body(node.name, i)
        body["metadata"]["labels"][SCENE] = node.scene
        if node.rack is not None:
            body["metadata"]["labels"][RACK] = node.rack
        body["spec"]["taints"] = [{"key": GPU, "value": "present", "effect": "NoSchedule"}]
        bodies.append(body)
    return bodies


def gpu_pod(
    name: str,
    gpus: int,
    *,
    scene: str,
    scheduler: str = "lattice",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    nics: int = 0,
    host: str | None = None,
) -> dict[str, Any]:
    """A GPU worker: cores and memory in proportion to its GPUs, tolerating the GPU taint."""
    requests = {
        "cpu": str(CPU_PER_GPU * gpus),
        "memory": f"{MEMORY_PER_GPU_GI * gpus}Gi",
        GPU: str(gpus),
    }
    limits = {GPU: str(gpus)}
    if nics:
        requests[NIC] = limits[NIC] = str(nics)
    selector = {SCENE: scene}
    if host is not None:
        selector["kubernetes.io/hostname"] = host
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"app": name.rsplit("-", 1)[0], **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector,
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "worker",
                    "image": "example/cuda",
                    "resources": {"requests": requests, "limits": limits},
                }
            ],
        },
    }


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod went, or why it did not."""

    pod: str
    node: str | None
    why_not: str = ""
    devices: dict[str, Any] | None = None

    def where(self) -> str:
        return self.node or "Pending"


def _placement(live: dict[str, Any]) -> Placement:
    node = live["spec"].get("nodeName")
    why = ""
    if not node:
        cond = next(
            (
                c
                for c in live.get("status", {}).get("conditions", [])
                if c["type"] == "PodScheduled"
            ),
            None,
        )
        why = f"{cond.get('reason', '')}: {cond.get('message', '')}" if cond else "not yet seen"
    text = live["metadata"].get("annotations", {}).get(DEVICES)
    devices = json.loads(text) if text else None
    return Placement(live["metadata"]["name"], node, why, devices)


async def _pods(core: client.CoreV1Api) -> dict[str, dict[str, Any]]:
    raw: Any = await core.list_namespaced_pod(NS, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(await raw.read())["items"]
    return {p["metadata"]["name"]: p for p in items}


def _settled(live: dict[str, Any] | None) -> bool:
    """Bound, or its scheduler said it cannot be placed now."""
    if live is None:
        return False
    if live["spec"].get("nodeName"):
        return True
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in live.get("status", {}).get("conditions", [])
    )


async def _create_and_settle(
    core: client.CoreV1Api,
    bodies: Sequence[dict[str, Any]],
    *,
    within: float = 60.0,
    bound: bool = False,
) -> list[Placement]:
    """Create the pods and wait until each is settled (``bound``: until all are bound, as
    a gang's members are; a gang waiting for quorum says so on its members, which is not
    its answer). On time-out the state reached is returned, so the demo shows it."""
    for body in bodies:
        await core.create_namespaced_pod(NS, cast(client.V1Pod, body))
    names = [b["metadata"]["name"] for b in bodies]

    async def done() -> dict[str, dict[str, Any]] | None:
        pods = await _pods(core)
        ok = all(
            (pods.get(n) or {}).get("spec", {}).get("nodeName") if bound else _settled(pods.get(n))
            for n in names
        )
        return pods if ok else None

    try:
        pods = await poll(done, within=within, interval=0.3)
    except TimeoutError:
        pods = await _pods(core)
    return [_placement(pods[n]) for n in names]


# ---------------------------------------------------------------- scene 1: fragmentation


@dataclass(frozen=True, slots=True)
class FragArm:
    """One scheduler's side of the fragmentation scene."""

    scheduler: str
    stream: list[Placement]
    big: Placement
    free_gpus: dict[str, int]
    """Free GPUs per node after the stream, before the big pod."""
    fragmentation: float
    """Expected free GPUs (summed over the nodes) a request of the scene's mix cannot use."""


def scene_mix() -> tuple[SizeClass, ...]:
    """The scene's request sizes, weighted by how many pods of each arrive."""
    sizes = [*STREAM, BIG]
    return tuple(
        SizeClass(
            g, sizes.count(g) / len(sizes), CPU_PER_GPU * g * 1000, MEMORY_PER_GPU_GI * g * GI
        )
        for g in sorted(set(sizes))
    )


def fragmentation_of(
    nodes: Sequence[str], placed: Iterable[tuple[str, int]]
) -> tuple[dict[str, int], float]:
    """Free GPUs per node and the summed fragmentation, from (node, GPUs) of the pods placed
    there (each pod asks cores and memory in proportion to its GPUs)."""
    capacity = get_profile(PROFILE).capacity
    gpus0 = NODE_GPUS
    cpu0 = Quantity.parse(capacity["cpu"]).milli_value()
    mem0 = Quantity.parse(capacity["memory"]).value()
    used = dict.fromkeys(nodes, 0)
    for node, g in placed:
        used[node] += g
    gpus = np.array([gpus0 - used[n] for n in nodes], dtype=np.int64)
    cpu = np.array([cpu0 - CPU_PER_GPU * 1000 * used[n] for n in nodes], dtype=np.int64)
    mem = np.array([mem0 - MEMORY_PER_GPU_GI * GI * used[n] for n in nodes], dtype=np.int64)
    free = Free(gpus, cpu, mem, np.full(len(nodes), gpus0, dtype=np.int64))
    frag = float(fragmentation(free, scene_mix()).sum())
    return {n: int(g) for n, g in zip(nodes, gpus, strict=True)}, frag


async def fragmentation_scene(core: client.CoreV1Api) -> tuple[FragArm, FragArm]:
    """The same stream, pod by pod, to Lattice's two nodes and kube-scheduler's two."""
    arms = (("lattice", "frag-lattice", "l"), ("default-scheduler", "frag-kube", "k"))
    stream: dict[str, list[Placement]] = {a[0]: [] for a in arms}
    for i, g in enumerate(STREAM):
        bodies = [
            gpu_pod(f"{tag}-{g}gpu-{i}", g, scene=scene, scheduler=sched)
            for sched, scene, tag in arms
        ]
        for p, (sched, _, _) in zip(await _create_and_settle(core, bodies), arms, strict=True):
            stream[sched].append(p)
    out = []
    for sched, scene, tag in arms:
        nodes = [n.name for n in NODES if n.scene == scene]
        placed = [(p.node, g) for p, g in zip(stream[sched], STREAM, strict=True) if p.node]
        free, frag = fragmentation_of(nodes, placed)
        out.append((sched, scene, tag, free, frag))
    bigs = await _create_and_settle(
        core,
        [
            gpu_pod(f"{tag}-{BIG}gpu-big", BIG, scene=scene, scheduler=s)
            for s, scene, tag, _, _ in out
        ],
    )
    lattice, kube = (
        FragArm(s, stream[s], big, free, frag)
        for (s, _, _, free, frag), big in zip(out, bigs, strict=True)
    )
    return lattice, kube


# ---------------------------------------------------------------- scene 2: PCIe


@dataclass(frozen=True, slots=True)
class PcieResult:
    solo: Placement
    pair: Placement
    gpu_switches: dict[int, str] = field(default_factory=dict)
    """The pair's GPUs (nvidia-smi index) and the PCIe switch each sits under."""
    nic_switches: dict[str, str] = field(default_factory=dict)
    """The pair's NICs (PCI address) and their switch."""


async def pcie_scene(core: client.CoreV1Api, objects: client.CustomObjectsApi) -> PcieResult:
    solo, pair = [
        (
            await _create_and_settle(
                core,
                [
                    gpu_pod(
                        name,
                        g,
                        scene="pcie",
                        nics=nics,
                        annotations={"lattice.dev/gpu-alignment": "strict"},
                    )
                ],
            )
        )[0]
        for name, g, nics in (("solo-1gpu", 1, 0), ("pair-2gpu-1nic", 2, 1))
    ]
    if pair.node is None or pair.devices is None:
        return PcieResult(solo, pair)
    raw = await objects.get_cluster_custom_object(
        "lattice.dev", "v1alpha1", "nodetopologies", pair.node
    )
    topo = NodeTopology.from_spec(cast(dict[str, Any], raw)["spec"])
    by_index = {d.device_index: d.locality for d in topo.gpus}
    by_address = {d.address: d.locality for d in topo.nics}
    return PcieResult(
        solo,
        pair,
        {g: by_index.get(g, "?") for g in pair.devices.get("gpus", [])},
        {a: by_address.get(a, "?") for a in pair.devices.get("nics", [])},
    )


# ---------------------------------------------------------------- scene 3: racks


@dataclass(frozen=True, slots=True)
class RackResult:
    busy: Placement
    gangs: dict[str, list[Placement]]
    free_after_first: dict[str, int]
    """Free GPUs per rack once the first gang is placed."""


def rack_of(node: str | None) -> str | None:
    return next((n.rack for n in NODES if n.name == node), None)


async def rack_scene(core: client.CoreV1Api, objects: client.CustomObjectsApi) -> RackResult:
    (busy,) = await _create_and_settle(
        core, [gpu_pod("busy-8gpu", NODE_GPUS, scene="racks", host="gpu-rack-a-0")]
    )
    gangs: dict[str, list[Placement]] = {}
    free_after_first: dict[str, int] = {}
    for group, members, gpus in RACK_GANGS:
        await objects.create_namespaced_custom_object(
            "scheduling.x-k8s.io",
            "v1alpha1",
            NS,
            "podgroups",
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": group, "annotations": {"lattice.dev/topology-required": RACK}},
                "spec": {"minMember": members},
            },
        )
        bodies = [
            gpu_pod(f"{group}-{i}", gpus, scene="racks", labels={GANG_LABEL: group})
            for i in range(members)
        ]
        gangs[group] = await _create_and_settle(core, bodies, bound=True)
        if not free_after_first:
            placed = [busy, *gangs[group]]
            sizes = [NODE_GPUS, *[gpus] * members]
            for rack in sorted({n.rack for n in NODES if n.rack}):
                total = sum(NODE_GPUS for n in NODES if n.rack == rack)
                used = sum(g for p, g in zip(placed, sizes, strict=True) if rack_of(p.node) == rack)
                free_after_first[rack] = total - used
    return RackResult(busy, gangs, free_after_first)


# ---------------------------------------------------------------- the whole part


async def prepare(api: client.ApiClient) -> None:
    """Create the GPU nodes and their NodeTopology objects (the CRD must be established)."""
    await create_nodes(api, node_bodies())
    fixture = fixture_for_profile(PROFILE)
    if fixture is None:
        raise FixtureError(f"no fixture tree for the {PROFILE} profile")
    await publish_simulated_topologies(api, [n.name for n in NODES], fixture)
    core = client.CoreV1Api(api)

    async def ready() -> bool:
        nodes = {n.metadata.name: n for n in (await core.list_node()).items}
        return all(
            any(
                c.type == "Ready" and c.status == "True"
                for c in nodes[n.name].status.conditions or []
            )
            for n in NODES
            if n.name in nodes
        ) and all(n.name in nodes for n in NODES)

    await poll(ready, within=120, interval=0.5)


@dataclass(frozen=True, slots=True)
class GpuReport:
    lattice: FragArm
    kube: FragArm
    pcie: PcieResult
    racks: RackResult


async def run_scenes(api: client.ApiClient) -> GpuReport:
    core = client.CoreV1Api(api)
    objects = client.CustomObjectsApi(api)
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": NS}}))
    lattice, kube = await fragmentation_scene(core)
    pcie = await pcie_scene(core, objects)
    racks = await rack_scene(core, objects)
    return GpuReport(lattice, kube, pcie, racks)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def render(report: GpuReport) -> list[str]:
    """The report as the demo prints it."""
    lat, kube = report.lattice, report.kube
    lines = [
        "GPU scene 1: the same GPU pods, placed by Lattice and by kube-scheduler (default profile)",
        "on two identical pairs of 8-GPU nodes",
    ]
    rows: list[tuple[str, ...]] = [("GPUS", "LATTICE", "KUBE-SCHEDULER")]
    for g, a, b in zip(STREAM, lat.stream, kube.stream, strict=True):
        rows.append((str(g), a.where(), b.where()))
    lines += _table(rows)
    mix = ", ".join(f"{c.gpus} GPU {c.share:.0%}" for c in scene_mix())
    lines.append(
        f"  free GPUs per node after them: Lattice {sorted(lat.free_gpus.values())}, "
        f"kube-scheduler {sorted(kube.free_gpus.values())}"
    )
    lines.append(
        f"  fragmentation (free GPUs a request of the mix {mix} could not use, expected): "
        f"Lattice {lat.fragmentation:.2f}, kube-scheduler {kube.fragmentation:.2f}"
    )
    for arm, name in ((lat, "Lattice"), (kube, "kube-scheduler")):
        result = arm.big.node or f"Pending ({arm.big.why_not})"
        lines.append(f"  then an {BIG}-GPU pod, {name}: {result}")
    pcie = report.pcie
    lines += ["", "GPU scene 2: 2 GPUs and an RDMA NIC on one PCIe switch (strict alignment)"]
    lines.append(f"  {pcie.solo.pod} on {pcie.solo.where()}: devices {pcie.solo.devices}")
    if pcie.pair.node is None:
        lines.append(f"  {pcie.pair.pod}: Pending ({pcie.pair.why_not})")
    else:
        gpus = ", ".join(f"GPU {g} under switch {s}" for g, s in pcie.gpu_switches.items())
        nics = ", ".join(f"NIC {a} under switch {s}" for a, s in pcie.nic_switches.items())
        lines.append(f"  {pcie.pair.pod} on {pcie.pair.node}: {gpus}; {nics}")
        lines.append(
            "  (switches looked up in the node's NodeTopology, published by the agent code)"
        )
    racks = report.racks
    lines += ["", f"GPU scene 3: gangs that must stay in one {RACK}; rack-a has one node busy"]
    rows = [("GANG", "MEMBERS", "RACKS", "NODES")]
    for group, placements in racks.gangs.items():
        nodes = sorted({p.where() for p in placements})
        used = sorted({rack_of(p.node) or "-" for p in placements})
        rows.append((group, str(len(placements)), ",".join(used), ",".join(nodes)))
    lines += _table(rows)
    free = ", ".join(f"{r} {g}" for r, g in racks.free_after_first.items())
    lines.append(f"  free GPUs per rack once {RACK_GANGS[0][0]} was placed: {free}")
    for placements in racks.gangs.values():
        for p in placements:
            if p.node is None:
                lines.append(f"  {p.pod}: Pending ({p.why_not})")
                break
    return lines
