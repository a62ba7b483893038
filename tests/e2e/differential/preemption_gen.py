"""Seeded generator of preemption cases for the differential test against kube-scheduler.

A case is a namespace with its own pool of 2-4 nodes (label ``pool``), nodes filled with
low-priority pods, 0-2 PodDisruptionBudgets, and one preemptor selecting the pool. Pools
make cases independent, so many run at once on one control plane: the preemptor's
nodeSelector makes every other pool's nodes UnschedulableAndUnresolvable (never preemption
candidates), zones are per pool, and every affinity, spread and budget selector stays in the
case's namespace.

Priorities are distinct among the pods of one node: kube sorts victims with an unstable
sort, so two pods of equal priority and equal start second could be reprieved in either
order. Across nodes they may repeat, so the sum, count and start-time criteria are reached.
Budgets use integer ``minAvailable`` only: the disruption controller computes
``maxUnavailable`` and percentages only for pods with a scalable owner.

Volumes: some low-priority pods mount a claim of their own (a pre-bound pair with a CSI
volume: no node affinity, and no CSINode, so no attach limit), most of them
ReadWriteOncePod, and a share of the preemptors mount one of those claims: the holder,
when its priority is lower, must be among the victims (VolumeRestrictions counts the
claim's users as the dry run removes pods), and when it is not, nothing helps. Volumes are
drawn from a generator of their own, so a seed's cases are otherwise what they were
without them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Final

from tests.e2e.differential.volumes_objects import claim_volume, pv, pvc, storage_class

Body = dict[str, Any]

HOST: Final = "kubernetes.io/hostname"
ZONE: Final = "topology.kubernetes.io/zone"
APPS: Final = ("web", "db", "batch")
LOW_PRIORITIES: Final = tuple(range(-3, 31))
HIGH: Final = ("diff-high", 1000, "PreemptLowerPriority")
MID: Final = ("diff-mid", 15, "PreemptLowerPriority")
NEVER: Final = ("diff-never", 1000, "Never")
STATIC_CLASS: Final = "diff-pre-static"
"""The StorageClass of every case's pre-bound volumes (cluster-scoped, created once)."""
DRIVER: Final = "csi.lattice.dev"
LARGE_POOL: Final = 160
FULL_NODE: Final = ((500, 500, 500, 500), (1000, 500, 500), (1000, 1000), (1500, 500))
"""How a large pool's 2-cpu nodes are filled: always full, so every node is a candidate."""
RWOP: Final = "ReadWriteOncePod"


def low_class(value: int) -> str:
    return f"diff-low-{value}" if value >= 0 else f"diff-low-m{-value}"


def priority_classes() -> list[Body]:
    """Every PriorityClass the cases use (cluster-scoped, created once)."""
    out = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": low_class(v)},
            "value": v,
        }
        for v in LOW_PRIORITIES
    ]
    for name, value, policy in (HIGH, MID, NEVER):
        out.append(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "preemptionPolicy": policy,
            }
        )
    return out


def static_class() -> Body:
    return storage_class(STATIC_CLASS)


@dataclass
class Case:
    namespace: str
    nodes: list[Body] = field(default_factory=list)
    pods: list[Body] = field(default_factory=list)
    pdbs: list[Body] = field(default_factory=list)
    preemptor: Body = field(default_factory=dict)
    pvs: list[Body] = field(default_factory=list)
    """Cluster-scoped, named after the case's namespace."""
    pvcs: list[Body] = field(default_factory=list)
    rwop_claims: set[str] = field(default_factory=set)
    nominee: Body | None = None
    """A pending pod nominated to one of the pool's nodes (``nominee_node``): priority 1000
    and ``preemptionPolicy: Never``, selecting a label no node has, so it stays pending and
    kube-scheduler keeps its nomination; it counts on that node for the preemptor (of equal
    or lower priority) in the cycle and the dry run."""
    nominee_node: str = ""
    sampled: bool = False
    """A pool of :data:`LARGE_POOL` nodes: kube-scheduler's dry run examines only
    ``max(10 %, 100)`` of them from a random offset, so its pick is compared by its
    candidate criteria, not as the one best node."""

    @property
    def preemptor_claims(self) -> list[str]:
        return [
            v["persistentVolumeClaim"]["claimName"]
            for v in self.preemptor["spec"].get("volumes", [])
        ]


def _container(cpu: str, memory: str, port: int | None = None) -> Body:
    c: Body = {
        "name": "c",
        "image": "busybox",
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
    }
    if port is not None:
        c["ports"] = [{"containerPort": port, "hostPort": port, "protocol": "TCP"}]
    return c


def _millis(cpu: str) -> int:
    return int(cpu[:-1]) if cpu.endswith("m") else int(cpu) * 1000


def _mib(memory: str) -> int:
    return int(memory[:-2]) * (1024 if memory.endswith("Gi") else 1)


class PreemptionGenerator:
    """Draws cases from one seed: same seed, same cases."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.volume_rng = random.Random(seed * 7919 + 23)
        self.nominee_rng = random.Random(seed * 6271 + 41)
        self.seed = seed

    def case(self, round_index: int, index: int) -> Case:
        r = self.rng
        ns = f"pre-{self.seed}-{round_index}-{index}"
        case = Case(ns)
        for i in range(r.randint(2, 4)):
            case.nodes.append(self._node(f"{ns}-n{i}", ns, i))
        for node in case.nodes:
            self._fill(case, node)
        self._budgets(case)
        case.preemptor = self._preemptor(case)
        self._volumes(case)
        self._nominee(case)
        return case

    def _nominee(self, case: Case) -> None:
        """Sometimes a nominated pod on one of the pool's nodes (own generator, so the
        seed's cases are otherwise what they were without it)."""
        r = self.nominee_rng
        if r.random() >= 0.3:
            return
        case.nominee_node = r.choice(case.nodes)["metadata"]["name"]
        case.nominee = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "nominee", "namespace": case.namespace, "labels": {"app": "web"}},
            "spec": {
                "priorityClassName": NEVER[0],
                "nodeSelector": {"pool": case.namespace, "lattice.dev/nominee": "never"},
                "containers": [
                    _container(r.choice(("500m", "1", "1500m")), r.choice(("256Mi", "1Gi")))
                ],
            },
        }

    def large_case(self, round_index: int) -> Case:
        """One pool of :data:`LARGE_POOL` full 2-cpu nodes (distinct priorities per node,
        repeated across nodes) and a 1-cpu preemptor: every node is a potential node and
        a candidate, with victims of different priorities, counts and sums. Drawn from a
        generator of its own, so the seed's other cases are what they were without it."""
        r = random.Random(self.seed * 104729 + round_index)
        ns = f"pre-{self.seed}-{round_index}-large"
        case = Case(ns, sampled=True)
        for i in range(LARGE_POOL):
            name = f"{ns}-n{i}"
            capacity = {"cpu": "2", "memory": "8Gi", "pods": "110", "ephemeral-storage": "20Gi"}
            case.nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": {HOST: name, "pool": ns, ZONE: f"{ns}-z{i % 3}"},
                        "annotations": {"kwok.x-k8s.io/node": "fake"},
                    },
                    "spec": {},
                    "status": {"capacity": capacity, "allocatable": dict(capacity)},
                }
            )
            shape = r.choice(FULL_NODE)
            for k, (cpu, priority) in enumerate(
                zip(shape, r.sample(LOW_PRIORITIES, len(shape)), strict=False)
            ):
                case.pods.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"n{i}-p{k}",
                            "namespace": ns,
                            "labels": {"app": r.choice(APPS)},
                        },
                        "spec": {
                            "nodeName": name,
                            "priorityClassName": low_class(priority),
                            "containers": [_container(f"{cpu}m", "256Mi")],
                            "tolerations": [{"operator": "Exists"}],
                        },
                    }
                )
        case.preemptor = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "preemptor", "namespace": ns, "labels": {"app": "web"}},
            "spec": {
                "priorityClassName": HIGH[0],
                "nodeSelector": {"pool": ns},
                "containers": [_container("1", "256Mi")],
            },
        }
        return case

    def _volumes(self, case: Case) -> None:
        """Claims for some low-priority pods (each its own); the preemptor may mount one."""
        r, ns = self.volume_rng, case.namespace
        for body in case.pods:
            if r.random() >= 0.25:
                continue
            claim = f"c-{body['metadata']['name']}"
            modes = [RWOP] if r.random() < 0.75 else ["ReadWriteOnce"]
            volume = f"{ns}-{claim}"
            case.pvs.append(
                pv(
                    volume,
                    "1Gi",
                    storage_class=STATIC_CLASS,
                    claim=(ns, claim),
                    modes=modes,
                    csi=(DRIVER, volume),
                    phase=None,
                )
            )
            case.pvcs.append(
                pvc(
                    claim,
                    "1Gi",
                    namespace=ns,
                    storage_class=STATIC_CLASS,
                    modes=modes,
                    volume_name=volume,
                )
            )
            if modes == [RWOP]:
                case.rwop_claims.add(claim)
            body["spec"]["volumes"] = [claim_volume("data", claim)]
        if case.pvcs and r.random() < 0.4:
            claims = [c["metadata"]["name"] for c in case.pvcs]
            held = sorted(case.rwop_claims)
            claim = r.choice(held) if held and r.random() < 0.8 else r.choice(claims)
            case.preemptor["spec"]["volumes"] = [claim_volume("data", claim)]

    def _node(self, name: str, pool: str, i: int) -> Body:
        r = self.rng
        cpu = r.choice((2, 3, 4))
        capacity = {
            "cpu": str(cpu),
            "memory": f"{r.choice((4, 8))}Gi",
            "pods": r.choice(("3", "4", "110", "110", "110")),
            "ephemeral-storage": "20Gi",
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    HOST: name,
                    "pool": pool,
                    ZONE: f"{pool}-z{r.randint(0, 1) if i else 0}",
                },
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "spec": {},
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        }

    def _fill(self, case: Case, node: Body) -> None:
        """Low-priority pods until the node is (nearly) full, distinct priorities."""
        r = self.rng
        capacity = node["status"]["allocatable"]
        free_cpu = int(capacity["cpu"]) * 1000
        free_mem = _mib(capacity["memory"])
        slots = int(capacity["pods"])
        priorities = r.sample(LOW_PRIORITIES, len(LOW_PRIORITIES))
        ports: set[int] = set()
        name = node["metadata"]["name"]
        for k in range(slots):
            cpu = r.choice(("250m", "500m", "500m", "1", "1500m"))
            memory = r.choice(("256Mi", "512Mi", "1Gi", "2Gi"))
            if _millis(cpu) > free_cpu or _mib(memory) > free_mem:
                if r.random() < 0.5:
                    break
                continue
            free_cpu -= _millis(cpu)
            free_mem -= _mib(memory)
            port = 8080 if r.random() < 0.15 and 8080 not in ports else None
            if port is not None:
                ports.add(port)
            spec: Body = {
                "nodeName": name,
                "priorityClassName": low_class(priorities[k]),
                "containers": [_container(cpu, memory, port)],
                "tolerations": [{"operator": "Exists"}],
            }
            if r.random() < 0.15:
                spec["affinity"] = {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "labelSelector": {"matchLabels": {"app": r.choice(APPS)}},
                                "topologyKey": r.choice((HOST, ZONE)),
                            }
                        ]
                    }
                }
            case.pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name[len(case.namespace) + 1 :]}-p{k}",
                        "namespace": case.namespace,
                        "labels": {"app": r.choice(APPS)},
                    },
                    "spec": spec,
                }
            )

    def _budgets(self, case: Case) -> None:
        r = self.rng
        for b in range(r.choice((0, 1, 1, 2))):
            app = r.choice(APPS)
            matching = sum(p["metadata"]["labels"]["app"] == app for p in case.pods)
            case.pdbs.append(
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": f"b{b}", "namespace": case.namespace},
                    "spec": {
                        "minAvailable": r.randint(max(0, matching - 2), matching),
                        "selector": {"matchLabels": {"app": app}},
                    },
                }
            )

    def _preemptor(self, case: Case) -> Body:
        r = self.rng
        app = r.choice(APPS)
        biggest = max(int(n["status"]["allocatable"]["cpu"]) for n in case.nodes) * 1000
        cpu = r.choice([c for c in (500, 1000, 1500, 2000, 3000, 4000) if c <= biggest + 500])
        memory = r.choice(("256Mi", "1Gi", "2Gi", "4Gi"))
        port = 8080 if r.random() < 0.1 else None
        cls = r.choices((HIGH, MID, NEVER), weights=(75, 18, 7))[0]
        spec: Body = {
            "priorityClassName": cls[0],
            "nodeSelector": {"pool": case.namespace},
            "containers": [_container(f"{cpu}m", memory, port)],
        }
        affinity: Body = {}
        roll = r.random()
        if roll < 0.2:
            affinity["podAntiAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"app": r.choice(APPS)}},
                        "topologyKey": r.choice((HOST, HOST, ZONE)),
                    }
                ]
            }
        elif roll < 0.3:
            affinity["podAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": r.choice(APPS)}}, "topologyKey": ZONE}
                ]
            }
        if affinity:
            spec["affinity"] = affinity
        if r.random() < 0.1:
            spec["topologySpreadConstraints"] = [
                {
                    "maxSkew": 1,
                    "topologyKey": r.choice((HOST, ZONE)),
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": app}},
                }
            ]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "preemptor", "namespace": case.namespace, "labels": {"app": app}},
            "spec": spec,
        }
