"""Node profiles for fake (kwok) nodes: realistic capacity and labels.

Capacities are strings in Kubernetes quantity syntax, exactly as a kubelet
would report them, so every consumer parses them through the same path as on
a real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lattice_dev.devcluster.build import kubernetes_version

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
ZONES = ("zone-a", "zone-b", "zone-c")


@dataclass(frozen=True)
class NodeProfile:
    """Capacity and labels shared by the nodes of one profile."""

    name: str
    instance_type: str
    capacity: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)

    def node_body(self, name: str, index: int) -> dict[str, Any]:
        """The Node object to create, as a kubelet registering itself would send it."""
        zone = ZONES[index % len(ZONES)]
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": self.instance_type,
            "topology.kubernetes.io/region": "local",
            "topology.kubernetes.io/zone": zone,
            "type": "kwok",
            "lattice.dev/node-profile": self.name,
            **self.labels,
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {},
            "status": {
                "capacity": dict(self.capacity),
                "allocatable": dict(self.capacity),
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": f"{kubernetes_version()}-kwok",
                    "kubeProxyVersion": "fake",
                    "containerRuntimeVersion": "fake",
                    "osImage": "kwok",
                    "kernelVersion": "fake",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
                "phase": "Running",
            },
        }


PROFILES: dict[str, NodeProfile] = {
    p.name: p
    for p in (
        NodeProfile(
            "standard",
            "kwok.standard-32",
            {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "500Gi"},
        ),
        NodeProfile(
            "small",
            "kwok.small-4",
            {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"},
        ),
        NodeProfile(
            "gpu-8x",
            "kwok.gpu-8x",
            {
                "cpu": "96",
                "memory": "1Ti",
                "pods": "110",
                "ephemeral-storage": "2Ti",
                "nvidia.com/gpu": "8",
                "rdma/hca": "4",
                "hugepages-1Gi": "0",
                "hugepages-2Mi": "0",
            },
            {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"},
        ),
    )
}


def get_profile(name: str) -> NodeProfile:
    """Look a profile up by name, with an error that lists the valid ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown node profile {name!r}; choose one of {', '.join(sorted(PROFILES))}"
        ) from None


def node_name(index: int) -> str:
    return f"kwok-node-{index:04d}"
