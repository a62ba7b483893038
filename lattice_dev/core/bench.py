"""Benchmark one filter+score cycle for a plain pod (``python -m lattice_dev.core.bench``).

Builds clusters of 1000 and 5000 nodes with a few existing pods per node, a sprinkling of
cordoned and tainted nodes, then times :meth:`Framework.schedule` for a pod that only requests
cpu and memory, and compares it with a straightforward per-node Python loop computing the
same filters (NodeUnschedulable, TaintToleration, NodeResourcesFit) and scores
(LeastAllocated, BalancedAllocation, TaintToleration). Not a test: it prints figures.

A fourth figure is a run of identical plain pods placed one after another, with and
without opportunistic batching (:mod:`scheduler.core.batch`).

A third figure is the same cycle with every node's load reported (LoadAware filter with a
CPU threshold and its score active), with one placement noted per cycle as the controller
does, so the predictor's per-cycle cost shows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from scheduler.core.batch import Batch
from scheduler.core.load import LoadView
from scheduler.core.profile import LoadAwareArgs, Profile
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.names import CPU, MEMORY, PODS
from scheduler.model.node import Node, Taint
from scheduler.model.pod import Pod
from scheduler.predict import LoadPredictor, PredictConfig


def build_cluster(
    num_nodes: int, pods_per_node: int
) -> tuple[Snapshot, list[Node], dict[str, list[Pod]]]:
    nodes: list[Node] = []
    placed: dict[str, list[Pod]] = {}
    snapshot = Snapshot()
    for i in range(num_nodes):
        taints: tuple[Taint, ...] = ()
        if i % 50 == 0:
            taints = (Taint("dedicated", "gpu", "NoSchedule"),)
        if i % 37 == 0:
            taints += (Taint("spot", "true", "PreferNoSchedule"),)
        node = Node.from_api(
            {
                "metadata": {
                    "name": f"node-{i:05d}",
                    "labels": {
                        "kubernetes.io/hostname": f"node-{i:05d}",
                        "topology.kubernetes.io/zone": f"zone-{i % 3}",
                    },
                },
                "spec": {
                    "unschedulable": i % 97 == 0,
                    "taints": [
                        {"key": t.key, "value": t.value, "effect": t.effect} for t in taints
                    ],
                },
                "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}},
            }
        )
        nodes.append(node)
        snapshot.add_node(node)
        placed[node.name] = []
        for j in range(pods_per_node):
            pod = plain_pod(
                f"p-{i}-{j}", cpu=f"{250 * (1 + (i + j) % 8)}m", memory=f"{1 + (i * j) % 6}Gi"
            )
            snapshot.add_pod(pod, node.name)
            placed[node.name].append(pod)
    return snapshot, nodes, placed


def plain_pod(name: str, *, cpu: str, memory: str) -> Pod:
    return Pod.from_api(
        {
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
                ]
            },
        }
    )


@dataclass
class _NaiveNode:
    node: Node
    pods: list[Pod]


def naive_cycle(nodes: list[_NaiveNode], pod: Pod) -> str | None:
    """The per-node loop a first implementation would write (same semantics, no numpy)."""
    req = pod.resources.requests
    feasible: list[tuple[_NaiveNode, int, int, int]] = []
    for entry in nodes:
        node = entry.node
        if node.unschedulable:
            continue
        if any(t.blocks_scheduling for t in node.taints):
            continue
        used_cpu = sum(p.resources.accounted.get(CPU, 0) for p in entry.pods)
        used_mem = sum(p.resources.accounted.get(MEMORY, 0) for p in entry.pods)
        if len(entry.pods) + 1 > node.allocatable.get(PODS, 0):
            continue
        alloc_cpu, alloc_mem = node.allocatable.get(CPU, 0), node.allocatable.get(MEMORY, 0)
        if req.get(CPU, 0) > alloc_cpu - used_cpu or req.get(MEMORY, 0) > alloc_mem - used_mem:
            continue
        nz_cpu = (
            sum(p.resources.non_zero_cpu for p in entry.pods) + pod.resources.score_requests[CPU]
        )
        nz_mem = (
            sum(p.resources.non_zero_memory for p in entry.pods)
            + pod.resources.score_requests[MEMORY]
        )
        least = (
            (alloc_cpu - nz_cpu) * 100 // alloc_cpu + (alloc_mem - nz_mem) * 100 // alloc_mem
        ) // 2
        f_cpu = min((used_cpu + req.get(CPU, 0)) / alloc_cpu, 1.0)
        f_mem = min((used_mem + req.get(MEMORY, 0)) / alloc_mem, 1.0)
        after = int((1 - abs(f_cpu - f_mem) / 2) * 100)
        before = int(
            (1 - abs(min(used_cpu / alloc_cpu, 1.0) - min(used_mem / alloc_mem, 1.0)) / 2) * 100
        )
        balanced = 50 + (50 + after - before) // 2  # kube 1.36+: the change in balance
        soft = sum(1 for t in node.taints if t.effect == "PreferNoSchedule")
        feasible.append((entry, least, balanced, soft))
    if not feasible:
        return None
    max_soft = max(s for *_, s in feasible)
    best, best_score = None, -1
    for entry, least, balanced, soft in feasible:
        taint_score = 100 if max_soft == 0 else 100 - soft * 100 // max_soft
        total = least + balanced + 3 * taint_score
        if total > best_score:
            best, best_score = entry.node.name, total
    return best


def load_cycle(snapshot: Snapshot) -> Callable[[Pod], object]:
    """A cycle function with every node reporting load and one placement noted per call."""
    config = PredictConfig(cpu_threshold=0.9)
    framework = Framework(Profile(name="load-bench", load_aware=LoadAwareArgs(predict=config)))
    predictor = LoadPredictor(config)
    now = 1000.0
    for i, name in enumerate(snapshot.node_names):
        predictor.observe(name, now - 5, 1000.0 + 37 * (i % 500), 2**34, 32000, 128 * 2**30)
    calls = iter(range(10**9))

    def cycle(pod: Pod) -> object:
        decision = framework.schedule(snapshot, pod, load=LoadView(predictor, now))
        if decision.selected is not None:
            predictor.note_placement(decision.selected, f"p{next(calls)}", 500, 2**30, now)
        return decision

    return cycle


def identical_run(size: int, pods_per_node: int, count: int, *, batched: bool) -> float:
    """CPU seconds per pod to place ``count`` identical plain pods one after another, each
    assumed on its node as the controller does, with or without opportunistic batching."""
    snapshot, _, _ = build_cluster(size, pods_per_node)
    framework = Framework()
    pods = [plain_pod(f"run-{i}", cpu="100m", memory="128Mi") for i in range(count)]
    batch = Batch() if batched else None
    start = time.process_time()
    for pod in pods:
        decision = framework.schedule(snapshot, pod, batch=batch)
        if decision.selected is None:
            break
        snapshot.add_pod(pod, decision.selected)
        if batch is not None:
            batch.assumed(snapshot, decision.selected)
    return (time.process_time() - start) / count


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 5000])
    parser.add_argument("--pods-per-node", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--run-pods", type=int, default=500, help="identical pods in a run")
    parser.add_argument("--runs", type=int, default=3, help="runs of identical pods, each way")
    args = parser.parse_args()
    framework = Framework()
    pod = plain_pod("incoming", cpu="500m", memory="1Gi")
    for size in args.sizes:
        snapshot, nodes, placed = build_cluster(size, args.pods_per_node)
        naive_nodes = [_NaiveNode(n, placed[n.name]) for n in nodes]
        decision = framework.schedule(snapshot, pod)
        fast = median_seconds(partial(framework.schedule, snapshot, pod), args.repeat)
        slow = median_seconds(partial(naive_cycle, naive_nodes, pod), max(5, args.repeat // 20))
        print(
            f"{size:>6} nodes: vectorised {fast * 1e3:7.3f} ms  naive loop {slow * 1e3:8.3f} ms  "
            f"speed-up x{slow / fast:6.1f}  ({len(decision.feasible)} feasible, "
            f"selected {decision.selected})"
        )
        loaded = median_seconds(partial(load_cycle(snapshot), pod), args.repeat)
        print(f"{size:>6} nodes: with LoadAware on reported load {loaded * 1e3:7.3f} ms")
        runs: dict[bool, list[float]] = {
            flag: [] for flag in (False, True)
        }  # interleaved: the machine's load moves
        for _ in range(args.runs):
            for flag in (False, True):
                runs[flag].append(
                    identical_run(size, args.pods_per_node, args.run_pods, batched=flag)
                )
        full, batched = (statistics.median(runs[flag]) for flag in (False, True))
        print(
            f"{size:>6} nodes: {args.run_pods} identical pods, CPU per pod (cycle + assume), "
            f"median of {args.runs}: full cycles {full * 1e3:7.3f} ms  batched "
            f"{batched * 1e3:7.3f} ms  (x{full / batched:4.2f})"
        )


if __name__ == "__main__":
    main()
