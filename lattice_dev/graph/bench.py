"""Benchmark the affinity graph (``python -m lattice_dev.graph.bench``). Not a test: it prints.

Builds one big cluster (default 5000 nodes, 30 000 placed pods in 600 deployments of 50
replicas over 10 namespaces) once, through the snapshot, so the graph is built by events.
Deployments cycle through four shapes: required hostname anti-affinity to themselves;
preferred zone affinity to another deployment plus preferred hostname anti-affinity;
required zone affinity to another deployment plus a ScheduleAnyway zone spread; and a
DoNotSchedule zone spread. Then it reports:

* the median time to apply one pod event to the graph (a new replica placed, a replica
  relabelled, a replica removed), and the full rebuild of the graph from the cluster state,
  with their ratio;
* the median filter+score cycle (default profile, every node) for a new replica with
  required anti-affinity, one with preferred affinity, one with a hard spread and a plain
  pod, next to the same cycle with the naive oracle plugins;
* peak RSS.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import resource
import statistics
import time
from collections.abc import Callable
from functools import partial
from types import MappingProxyType
from typing import Any

from lattice_dev.graph.naive import naive_registry
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.graph.affinity import AffinityGraph
from scheduler.model.names import LABEL_HOSTNAME
from scheduler.model.node import Namespace, Node
from scheduler.model.pod import Pod

ZONE = "topology.kubernetes.io/zone"
REPLICAS = 50
NAMESPACES = 10
ZONES = 10


def make_node(i: int) -> Node:
    name = f"node-{i:05d}"
    return Node.from_api(
        {
            "metadata": {
                "name": name,
                "labels": {
                    LABEL_HOSTNAME: name,
                    ZONE: f"zone-{i % ZONES}",
                    "topology.kubernetes.io/region": f"region-{i % 2}",
                },
            },
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}},
        }
    )


def _term(key: str, app: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}


def template(group: int, groups: int) -> Pod:
    """The pod template of deployment ``group`` (see the module docstring for the shapes)."""
    # Another deployment of the same namespace (terms default to their pod's namespace).
    app, other = f"app-{group}", f"app-{(group + NAMESPACES) % groups}"
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]
    }
    shape = group % 4
    if shape == 0:
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [_term(LABEL_HOSTNAME, app)]
            }
        }
    elif shape == 1:
        spec["affinity"] = {
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 80, "podAffinityTerm": _term(ZONE, other)}
                ]
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 20, "podAffinityTerm": _term(LABEL_HOSTNAME, app)}
                ]
            },
        }
    elif shape == 2:
        spec["affinity"] = {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_term(ZONE, other)]}
        }
    spread = {
        "maxSkew": 1,
        "topologyKey": ZONE,
        "labelSelector": {"matchLabels": {"app": app}},
    }
    if shape == 2:
        spec["topologySpreadConstraints"] = [{**spread, "whenUnsatisfiable": "ScheduleAnyway"}]
    elif shape == 3:
        spec["topologySpreadConstraints"] = [{**spread, "whenUnsatisfiable": "DoNotSchedule"}]
    return Pod.from_api(
        {
            "metadata": {
                "name": app,
                "namespace": f"ns-{group % NAMESPACES}",
                "labels": {"app": app, "tier": ("web", "api", "cache")[group % 3]},
            },
            "spec": spec,
        }
    )


def replica(tmpl: Pod, index: int, **labels: str) -> Pod:
    name = f"{tmpl.name}-{index}"
    merged = MappingProxyType({**tmpl.labels, **labels})
    return dataclasses.replace(tmpl, name=name, uid=f"{tmpl.namespace}/{name}", labels=merged)


def build_cluster(num_nodes: int, groups: int) -> tuple[Snapshot, list[Pod], float]:
    started = time.perf_counter()
    snapshot = Snapshot()
    for i in range(NAMESPACES):
        snapshot.set_namespace(Namespace(f"ns-{i}", MappingProxyType({"team": f"t{i % 3}"})))
    for i in range(num_nodes):
        snapshot.add_node(make_node(i))
    templates = [template(g, groups) for g in range(groups)]
    for g, tmpl in enumerate(templates):
        for j in range(REPLICAS):
            node = (g * 7919 + j * (num_nodes // REPLICAS + 1)) % num_nodes
            snapshot.add_pod(replica(tmpl, j), f"node-{node:05d}")
    return snapshot, templates, time.perf_counter() - started


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def pod_events(
    snapshot: Snapshot, templates: list[Pod], count: int, seed: int
) -> dict[str, list[float]]:
    """Timed pod events on the snapshot's graph, each undone so the cluster stays as built."""
    graph = snapshot.affinity_graph
    rng = random.Random(seed)
    names = snapshot.node_names
    samples: dict[str, list[float]] = {"place": [], "relabel": [], "remove": []}

    def timed(kind: str, fn: Callable[..., object], *args: object) -> None:
        start = time.perf_counter()
        fn(*args)
        samples[kind].append(time.perf_counter() - start)

    for k in range(count):
        tmpl = templates[rng.randrange(len(templates))]
        new = replica(tmpl, REPLICAS + k)
        timed("place", graph.on_pod_placed, new, rng.choice(names))
        timed("remove", graph.on_pod_removed, new.key)
        index = rng.randrange(REPLICAS)
        existing = replica(tmpl, index)
        node = snapshot.node_of_pod(existing.key)
        assert node is not None
        timed("relabel", graph.on_pod_placed, replica(tmpl, index, rev=str(k)), node)
        graph.on_pod_placed(existing, node)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=30000, help="placed pods (50 per group)")
    parser.add_argument("--events", type=int, default=1000, help="pod events of each kind")
    parser.add_argument("--cycles", type=int, default=60, help="repetitions per fast cycle")
    parser.add_argument("--naive-cycles", type=int, default=3)
    parser.add_argument("--rebuilds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    groups = max(2 * NAMESPACES, args.pods // REPLICAS)

    snapshot, templates, built = build_cluster(args.nodes, groups)
    graph = snapshot.affinity_graph
    print(
        f"cluster: {args.nodes} nodes, {groups * REPLICAS} placed pods, "
        f"{len(graph.indexes.terms)} term vertices, {len(graph.graph)} vertices, "
        f"{graph.graph.number_of_edges()} edges; built through events in {built:.1f} s"
    )

    samples = pod_events(snapshot, templates, args.events, args.seed)
    every = [s for kind in samples.values() for s in kind]
    event_ms = statistics.median(every) * 1e3
    detail = ", ".join(f"{k} {statistics.median(v) * 1e6:.0f} us" for k, v in samples.items())
    print(f"pod event (patch computed and applied): median {event_ms * 1e3:.0f} us ({detail})")

    nodes = list(snapshot.nodes())
    placed = [
        (p, snapshot.node_names[i]) for i in range(snapshot.num_nodes) for p in snapshot.pods_on(i)
    ]
    namespaces = [Namespace(k, v) for k, v in snapshot.namespaces().items()]
    rebuild_ms = median_ms(lambda: AffinityGraph.build(nodes, placed, namespaces), args.rebuilds)
    print(
        f"full rebuild of graph and indexes: {rebuild_ms / 1e3:.2f} s; "
        f"rebuild / patch = {rebuild_ms / event_ms:,.0f}x (target >= 100x)"
    )

    fast, naive = Framework(), Framework(registry=naive_registry())
    incoming = {
        "required anti-affinity": replica(templates[0], 10_000),
        "preferred affinity": replica(templates[1], 10_000),
        "required affinity + soft spread": replica(templates[2], 10_000),
        "hard spread": replica(templates[3], 10_000),
        "plain (no terms, same cluster)": dataclasses.replace(
            replica(templates[3], 10_001), spread_constraints=()
        ),
    }
    for label, pod in incoming.items():
        ours = fast.schedule(snapshot, pod)
        theirs = naive.schedule(snapshot, pod)
        assert ours.selected == theirs.selected, label
        assert ours.explanation.to_json() == theirs.explanation.to_json(), label
        t_fast = median_ms(partial(fast.schedule, snapshot, pod), args.cycles)
        t_naive = median_ms(partial(naive.schedule, snapshot, pod), args.naive_cycles)
        print(
            f"filter+score cycle, {label:<32} graph {t_fast:6.2f} ms   "
            f"naive oracle {t_naive:8.1f} ms   x{t_naive / t_fast:,.0f}   "
            f"({len(ours.feasible)} feasible)"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
