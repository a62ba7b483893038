"""Seeded generator of small random clusters and pods for the differential test.

Everything is an API-shaped dict, exactly what is sent to the API server, so
kube-scheduler and Lattice see the same objects. The shapes are chosen so that
conflicts are common: few, small nodes; taints, labels and ports drawn from
short lists; affinity and spread terms over the same few labels.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
APPS = ("web", "db", "cache")
TAINTS = (
    ({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}, 0.25),
    ({"key": "spot", "value": "true", "effect": "NoExecute"}, 0.15),
    ({"key": "soft", "value": "", "effect": "PreferNoSchedule"}, 0.2),
)

Body = dict[str, Any]


@dataclass
class Cluster:
    """One random cluster: its nodes, pods already bound, and pods to place one by one."""

    index: int
    namespace: str
    other_namespace: str
    nodes: list[Body] = field(default_factory=list)
    existing: list[Body] = field(default_factory=list)
    incoming: list[Body] = field(default_factory=list)

    def namespaces(self) -> list[Body]:
        return [
            {"metadata": {"name": self.namespace, "labels": {"team": "a"}}},
            {"metadata": {"name": self.other_namespace, "labels": {"team": "b"}}},
        ]


def _container(name: str, requests: dict[str, str], ports: list[int] | None = None) -> Body:
    c: Body = {"name": name, "image": "busybox", "resources": {"requests": requests}}
    # Extended resources and hugepages cannot be overcommitted: limits must equal requests.
    limits = {
        k: v for k, v in requests.items() if k == "nvidia.com/gpu" or k.startswith("hugepages-")
    }
    if limits:
        c["resources"]["limits"] = limits
    if ports:
        c["ports"] = [{"containerPort": p, "hostPort": p, "protocol": "TCP"} for p in ports]
    return c


class Generator:
    """Draws clusters from one seed: same seed, same clusters."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.roomy = False
        """Every other cluster: bigger nodes and few hard constraints, so most pods fit
        several nodes and kube-scheduler's scores, not its filters, decide where."""

    def _hard(self, p: float) -> float:
        """The probability of a constraint that filters nodes (a third of it in a roomy
        cluster)."""
        return p / 3 if self.roomy else p

    def cluster(self, index: int, incoming: int) -> Cluster:
        r = self.rng
        ns = f"diff-{self.seed}-{index}"
        cl = Cluster(index, ns, ns + "-o")
        self.roomy = index % 2 == 1
        for i in range(r.randint(3, 8) if self.roomy else r.randint(2, 5)):
            cl.nodes.append(self.node(f"dn-{self.seed}-{index}-{i}"))
        names = [n["metadata"]["name"] for n in cl.nodes]
        for i in range(r.randint(0, 16) if self.roomy else r.randint(0, 8)):
            cl.existing.append(self.existing_pod(f"ex-{i}", r.choice(names), cl))
        for i in range(incoming):
            cl.incoming.append(self.incoming_pod(f"in-{i}", cl))
        return cl

    def node(self, name: str) -> Body:
        r = self.rng
        labels = {HOST: name, "type": "kwok"}
        if r.random() < 0.9:
            labels[ZONE] = r.choice(("z1", "z2", "z3"))
        if r.random() < 0.5:
            labels["disk"] = r.choice(("ssd", "hdd"))
        if r.random() < 0.7:
            labels["tier"] = str(r.randint(1, 5))
        capacity = {
            "cpu": r.choice(("4", "8", "16") if self.roomy else ("1", "2", "4")),
            "memory": r.choice(("8Gi", "16Gi", "32Gi") if self.roomy else ("2Gi", "4Gi", "8Gi")),
            "pods": "110" if self.roomy else r.choice(("3", "110", "110")),
            "ephemeral-storage": "20Gi",
        }
        if r.random() < 0.35:
            capacity["nvidia.com/gpu"] = r.choice(("1", "2"))
        if r.random() < 0.2:
            capacity["hugepages-2Mi"] = "64Mi"
        spec: Body = {}
        taints = [
            dict(t)
            for t, p in TAINTS
            if r.random() < (p if t["effect"] == "PreferNoSchedule" else self._hard(p))
        ]
        if taints:
            spec["taints"] = taints
        if r.random() < self._hard(0.1):
            spec["unschedulable"] = True
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "spec": spec,
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        }

    def _requests(self, big: bool) -> dict[str, str]:
        r = self.rng
        cpus = ("100m", "500m", "1", "1500m", "3") if big else ("100m", "250m", "500m", "1")
        mems = ("64Mi", "1Gi", "3Gi", "6Gi") if big else ("128Mi", "512Mi", "1Gi")
        req = {"cpu": r.choice(cpus), "memory": r.choice(mems)}
        if r.random() < self._hard(0.2):
            req["nvidia.com/gpu"] = r.choice(("1", "2"))
        if big and r.random() < self._hard(0.1):
            req["ephemeral-storage"] = r.choice(("1Gi", "30Gi"))
        if big and r.random() < self._hard(0.1):
            req["hugepages-2Mi"] = r.choice(("32Mi", "128Mi"))
        return req

    def _term(self, cl: Cluster) -> Body:
        r = self.rng
        term: Body = {
            "labelSelector": {
                "matchExpressions": [{"key": "app", "operator": "In", "values": [r.choice(APPS)]}]
            },
            "topologyKey": r.choice((HOST, ZONE, ZONE)),
        }
        roll = r.random()
        if roll < 0.15:
            term["namespaces"] = [cl.other_namespace]
        elif roll < 0.25:
            term["namespaceSelector"] = {}
        elif roll < 0.35:
            term["namespaceSelector"] = {"matchLabels": {"team": "b"}}
        return term

    def _weighted_terms(self, cl: Cluster) -> list[Body]:
        r = self.rng
        return [
            {"weight": r.choice((1, 5, 50, 100)), "podAffinityTerm": self._term(cl)}
            for _ in range(r.randint(1, 2))
        ]

    def existing_pod(self, name: str, node: str, cl: Cluster) -> Body:
        r = self.rng
        ports = [r.choice((8080, 9090))] if r.random() < self._hard(0.2) else None
        spec: Body = {
            "nodeName": node,
            "containers": [_container("c", self._requests(big=False), ports)],
            "tolerations": [{"operator": "Exists"}],
        }
        affinity: Body = {}
        if r.random() < self._hard(0.25):
            affinity["podAntiAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [self._term(cl)]
            }
        # Scored for the incoming pod (symmetrically): the hard-affinity weight and the
        # existing pods' preferred terms.
        if r.random() < 0.1:
            affinity["podAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [self._term(cl)]
            }
        for kind in ("podAffinity", "podAntiAffinity"):
            if r.random() < 0.15:
                affinity.setdefault(kind, {})["preferredDuringSchedulingIgnoredDuringExecution"] = (
                    self._weighted_terms(cl)
                )
        if affinity:
            spec["affinity"] = affinity
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": r.choice((cl.namespace, cl.namespace, cl.other_namespace)),
                "labels": {"app": r.choice(APPS)},
            },
            "spec": spec,
        }

    def _node_requirement(self, cl: Cluster) -> Body:
        r = self.rng
        kind = r.randrange(6)
        if kind == 0:
            return {
                "key": ZONE,
                "operator": r.choice(("In", "NotIn")),
                "values": r.sample(("z1", "z2", "z3"), r.randint(1, 2)),
            }
        if kind == 1:
            return {"key": "disk", "operator": r.choice(("Exists", "DoesNotExist"))}
        if kind == 2:
            return {
                "key": "tier",
                "operator": r.choice(("Gt", "Lt")),
                "values": [str(r.randint(1, 5))],
            }
        if kind == 3:
            return {"key": "disk", "operator": "In", "values": [r.choice(("ssd", "hdd"))]}
        if kind == 4:
            return {"key": "tier", "operator": "NotIn", "values": [str(r.randint(1, 5))]}
        return {"key": HOST, "operator": "In", "values": [r.choice(cl.nodes)["metadata"]["name"]]}

    def incoming_pod(self, name: str, cl: Cluster) -> Body:
        r = self.rng
        app = r.choice(APPS)
        ports = [r.choice((8080, 9090))] if r.random() < self._hard(0.15) else None
        spec: Body = {"containers": [_container("c", self._requests(big=True), ports)]}
        if r.random() < 0.2:
            spec["initContainers"] = [_container("init", self._requests(big=True))]
        if r.random() < self._hard(0.25):
            spec["nodeSelector"] = r.choice(
                ({"disk": "ssd"}, {ZONE: r.choice(("z1", "z2", "z3"))}, {"type": "kwok"})
            )
        affinity: Body = {}
        if r.random() < self._hard(0.3):
            terms = []
            for _ in range(r.randint(1, 2)):
                term: Body = {
                    "matchExpressions": [self._node_requirement(cl) for _ in range(r.randint(1, 2))]
                }
                if r.random() < 0.1:
                    names = [n["metadata"]["name"] for n in cl.nodes]
                    term = {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": r.sample(names, 1)}
                        ]
                    }
                terms.append(term)
            affinity["nodeAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        if r.random() < 0.3:
            # Scores only: the weighted sum of the terms a node matches.
            affinity.setdefault("nodeAffinity", {})[
                "preferredDuringSchedulingIgnoredDuringExecution"
            ] = [
                {
                    "weight": r.choice((1, 10, 50, 100)),
                    "preference": {
                        "matchExpressions": [
                            self._node_requirement(cl) for _ in range(r.randint(1, 2))
                        ]
                    },
                }
                for _ in range(r.randint(1, 3))
            ]
        if r.random() < self._hard(0.15):
            affinity["podAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [self._term(cl)]
            }
        if r.random() < self._hard(0.2):
            affinity["podAntiAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [self._term(cl)]
            }
        for kind in ("podAffinity", "podAntiAffinity"):
            if r.random() < 0.2:
                affinity.setdefault(kind, {})["preferredDuringSchedulingIgnoredDuringExecution"] = (
                    self._weighted_terms(cl)
                )
        if affinity:
            spec["affinity"] = affinity
        tolerations = []
        if r.random() < 0.4:
            tolerations.append(
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
            )
        if r.random() < 0.3:
            tolerations.append({"key": "spot", "operator": "Exists", "effect": "NoExecute"})
        if r.random() < 0.05:
            tolerations.append({"operator": "Exists"})
        if tolerations:
            spec["tolerations"] = tolerations
        if r.random() < 0.25:
            constraint: Body = {
                "maxSkew": r.choice((1, 1, 2)),
                "topologyKey": r.choice((ZONE, HOST)),
                "whenUnsatisfiable": r.choice(
                    ("DoNotSchedule", "ScheduleAnyway", "ScheduleAnyway")
                    if self.roomy
                    else ("DoNotSchedule", "DoNotSchedule", "ScheduleAnyway")
                ),
                "labelSelector": {"matchLabels": {"app": r.choice((app, app, r.choice(APPS)))}},
            }
            if constraint["whenUnsatisfiable"] == "DoNotSchedule" and r.random() < 0.3:
                constraint["minDomains"] = r.randint(2, 4)
            if r.random() < 0.2:
                constraint["nodeAffinityPolicy"] = "Ignore"
            if r.random() < 0.2:
                constraint["nodeTaintsPolicy"] = "Honor"
            spec["topologySpreadConstraints"] = [constraint]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": cl.namespace, "labels": {"app": app}},
            "spec": spec,
        }
