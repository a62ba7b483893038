"""Builders for topology tests: gpu-8x nodes read from the agent fixtures, GPU pods, a bed.

Node topologies come from the real agent reader on the committed fixture trees
(``tests/agent/fixtures``), never from hand-written records, so these tests also pin down
what the reader makes of that hardware: two NUMA nodes, four PCIe switches each holding
GPUs ``2s, 2s+1`` and one RDMA NIC (switch s on NUMA node ``s // 2``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

from scheduler.agent.reader import read_node
from scheduler.core.explain import Decision
from scheduler.core.profile import DEFAULT_PROFILE, Profile
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology import DEVICES_ANNOTATION, TopologyState
from scheduler.model.pod import Pod
from scheduler.model.topology import NodeTopology
from tests.agent.trees import TWO_SOCKET, VM, read_fixture, roots
from tests.builders import NodeBuilder, PodBuilder, make_node, make_pod

NIC_OF_SWITCH = ("0000:1c:00.0", "0000:3f:00.0", "0000:9c:00.0", "0000:b5:00.0")
"""RDMA NIC under each of the two-socket fixture's four switches (GPUs 2s and 2s+1)."""


@cache
def two_socket() -> NodeTopology:
    return read_fixture(TWO_SOCKET).topology


@cache
def single_gpu_vm() -> NodeTopology:
    return read_fixture(VM).topology


def two_socket_with_kubelet(tmp: Path, policy: str, cpu_policy: str = "static") -> NodeTopology:
    """The two-socket tree read with a KubeletConfiguration, as the agent would mount it."""
    config = tmp / f"kubelet-{policy}-{cpu_policy}.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\n"
        f"topologyManagerPolicy: {policy}\n"
        f"cpuManagerPolicy: {cpu_policy}\n"
    )
    sysfs, procfs = roots(TWO_SOCKET)
    reading = read_node(sysfs_root=sysfs, procfs_root=procfs, kubelet_config=config)
    assert not reading.warnings, reading.warnings
    return reading.topology


def gpu_node(name: str, gpus: int = 8, cpu: str = "96") -> NodeBuilder:
    """A gpu-8x node as the devcluster profile registers it."""
    node = make_node(name, cpu=cpu, memory="1Ti")
    return node.resource("nvidia.com/gpu", gpus).resource("rdma/hca", 4)


def gpu_pod(
    name: str,
    gpus: int,
    *,
    nic: bool = False,
    alignment: str | None = None,
    rdma_annotation: bool = False,
    cpu: str = "4",
    memory: str = "16Gi",
    guaranteed: bool = False,
) -> PodBuilder:
    resources = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    if nic:
        resources["rdma/hca"] = "1"
    builder = make_pod(name)
    if guaranteed:
        limits = {"cpu": cpu, "memory": memory, **resources}
        builder.container(cpu, memory, resources=resources, limits=limits)
    else:
        builder.container(cpu, memory, resources=resources)
    if alignment is not None:
        annotate(builder, "lattice.dev/gpu-alignment", alignment)
    if rdma_annotation:
        annotate(builder, "lattice.dev/rdma", "true")
    return builder


def annotate(builder: PodBuilder, key: str, value: str) -> PodBuilder:
    builder.body["metadata"].setdefault("annotations", {})[key] = value
    return builder


def devices(decision: Decision) -> dict[str, object] | None:
    """The decoded ``lattice.dev/devices`` annotation of a decision, if any."""
    text = decision.annotations.get(DEVICES_ANNOTATION)
    if text is None:
        return None
    body: dict[str, object] = json.loads(text)
    return body


class Bed:
    """A snapshot, a TopologyState and a framework, with the controller's bookkeeping."""

    def __init__(
        self,
        nodes: Iterable[NodeBuilder],
        topologies: Mapping[str, NodeTopology] | None = None,
        profile: Profile = DEFAULT_PROFILE,
    ) -> None:
        self.snapshot = Snapshot([n.build() for n in nodes])
        self.state = TopologyState(profile.topology)
        for name, topology in (topologies or {}).items():
            self.state.set_node_topology(name, topology)
        self.framework = Framework(profile)
        self.pods: dict[str, tuple[Pod, str]] = {}

    def decide(self, pod: PodBuilder | Pod, *, seed: int = 0) -> Decision:
        built = pod.build() if isinstance(pod, PodBuilder) else pod
        return self.framework.schedule(self.snapshot, built, seed=seed, topology=self.state)

    def place(self, pod: PodBuilder | Pod, *, seed: int = 0) -> Decision:
        """Decide, then assume as the controller does (snapshot + ledger)."""
        decision = self.decide(pod, seed=seed)
        if decision.selected is not None:
            self.snapshot.add_pod(decision.pod, decision.selected)
            self.state.assume(decision)
            self.pods[decision.pod.name] = (decision.pod, decision.selected)
        return decision

    def bind(self, pod: Pod, node: str, annotations: Mapping[str, str]) -> None:
        """Place a pod as if it had been bound earlier, with these annotations."""
        self.snapshot.add_pod(pod, node)
        self.state.pod_placed(pod, node, annotations)
        self.pods[pod.name] = (pod, node)

    def remove(self, name: str) -> None:
        pod, _ = self.pods.pop(name)
        self.snapshot.remove_pod(pod)
        self.state.pod_removed(pod.key)


def holding(bed: Bed, node: str, gpus: Iterable[int]) -> None:
    """Bind 1-GPU pods holding ``gpus`` on ``node``, as recorded by earlier bindings."""
    for gpu in gpus:
        pod = gpu_pod(f"hold-{node}-{gpu}", 1).build()
        bed.bind(pod, node, {DEVICES_ANNOTATION: f'{{"gpus":[{gpu}],"nics":[],"numa":null}}'})


def gpu_bed(count: int = 1, *, topology: NodeTopology | None = None) -> Bed:
    names = [f"n{i}" for i in range(count)]
    topo = topology if topology is not None else two_socket()
    return Bed([gpu_node(n) for n in names], dict.fromkeys(names, topo))


def default_profile_without_topology() -> Profile:
    """kube-scheduler's profile as the core implements it, without Lattice's Topology."""
    return Profile(
        name="kube",
        filters=tuple(f for f in DEFAULT_PROFILE.filters if f != "Topology"),
        scores=tuple((s, w) for s, w in DEFAULT_PROFILE.scores if s != "Topology"),
    )
