"""Placement-quality benchmark for GPU pods (``python -m lattice_dev.core.topology_bench``).

Runs one stream of 1-, 2-, 4- and 8-GPU pods (some with an RDMA NIC) with churn (each pod
leaves after an exponential lifetime sized for the requested mean load) over N gpu-8x
nodes whose topology is the agent reader's view of the committed two-socket fixture tree,
under

* **lattice**: the default profile, Topology plugin included, devices as it chose them;
* **kube**: a model of kube-scheduler: the same core without the Topology plugin (so a
  node with enough free GPUs, ranked by kube's scores) and devices picked as a kubelet
  without topology hints would, lowest free device indexes first (NICs likewise);
* **kube-binpack**: the same with NodeResourcesFit scoring MostAllocated over cpu, memory
  and GPUs, the usual kube-scheduler advice for GPU clusters; it separates what packing
  alone buys from what topology-aware device choice buys.

For each it prints the pods placed, the aligned-placement rate (a pod is aligned when its
GPUs and NIC sit in the tightest domain the hardware offers for its size: one PCIe switch
for up to 2 GPUs, one NUMA node for 4; 8 GPUs always span both sockets), how many placed
pods a kubelet with topology policy single-numa-node would have rejected, and
fragmentation: how many 8-GPU pods could still be admitted (nodes with all 8 GPUs free) at
the end of the stream and on average while it ran, and how many free aligned 4-GPU slots
(NUMA nodes with 4 free GPUs) remain. Pure simulation, not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from scheduler.core.profile import (
    DEFAULT_PROFILE,
    Profile,
    ScoringStrategy,
)
from scheduler.core.profile import kube_profile as core_kube_profile
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology import DEVICES_ANNOTATION, DeviceAssignment, Level, TopologyState
from scheduler.core.topology.allocate import level_of
from scheduler.core.topology.request import TopologyRequest
from scheduler.model.node import Node
from scheduler.model.pod import Pod
from scheduler.model.topology import NodeTopology

SIZES: Final = ((1, 40), (2, 30), (4, 20), (8, 10))
"""GPUs per pod and their share of the stream, in percent."""
NIC_SHARE: Final = {1: 20, 2: 40, 4: 50, 8: 50}
"""Percent of pods of each size that also request an RDMA NIC."""
CPUS_PER_GPU: Final = 8
MEMORY_PER_GPU: Final = "64Gi"
FIXTURE: Final = Path(__file__).resolve().parents[2] / "tests" / "agent" / "fixtures"


@dataclass(frozen=True, slots=True)
class Arrival:
    index: int
    gpus: int
    nic: bool
    lifetime: int


def stream(count: int, nodes: int, load: float, seed: int) -> list[Arrival]:
    """One pod per tick, lifetimes exponential with a mean that keeps ``load`` of the GPUs busy."""
    rng = random.Random(seed)
    mean_gpus = sum(k * w for k, w in SIZES) / sum(w for _, w in SIZES)
    mean_life = load * nodes * 8 / mean_gpus
    sizes, weights = zip(*SIZES, strict=True)
    out = []
    for i in range(count):
        k = rng.choices(sizes, weights)[0]
        nic = rng.randrange(100) < NIC_SHARE[k]
        out.append(Arrival(i, k, nic, max(1, round(rng.expovariate(1 / mean_life)))))
    return out


def make_pod(arrival: Arrival) -> Pod:
    resources = {"nvidia.com/gpu": str(arrival.gpus)}
    if arrival.nic:
        resources["rdma/hca"] = "1"
    requests = {"cpu": str(CPUS_PER_GPU * arrival.gpus), "memory": MEMORY_PER_GPU, **resources}
    return Pod.from_api(
        {
            "metadata": {
                "name": f"job-{arrival.index}",
                "namespace": "bench",
                "uid": f"u{arrival.index}",
            },
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"requests": requests, "limits": resources}}
                ]
            },
        }
    )


def gpu_node(name: str) -> Node:
    capacity = {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8", "rdma/hca": "4"}
    return Node.from_api({"metadata": {"name": name}, "status": {"allocatable": capacity}})


@dataclass
class Result:
    name: str
    arrived: Counter[int] = field(default_factory=Counter)
    placed: Counter[int] = field(default_factory=Counter)
    aligned: Counter[int] = field(default_factory=Counter)
    numa_rejects: Counter[int] = field(default_factory=Counter)
    """Placed pods a single-numa-node kubelet would have rejected, by size."""
    whole_nodes_samples: list[int] = field(default_factory=list)
    whole_nodes_end: int = 0
    numa_slots_end: int = 0
    free_gpus_end: int = 0
    whole_nodes_drained: int = 0
    free_gpus_drained: int = 0
    seconds: float = 0.0


def run(
    name: str,
    topology: NodeTopology,
    arrivals: list[Arrival],
    nodes: int,
    *,
    lattice: bool,
    binpack: bool = False,
    sample_every: int = 25,
) -> Result:
    """Run the stream; ``lattice=False`` is the kube-scheduler model, ``binpack`` its
    MostAllocated variant."""
    profile = DEFAULT_PROFILE if lattice else kube_profile(binpack=binpack)
    framework = Framework(profile)
    names = [f"gpu-{i:03d}" for i in range(nodes)]
    snapshot = Snapshot([gpu_node(n) for n in names])
    state = TopologyState(profile.topology)
    for n in names:
        state.set_node_topology(n, topology)
    result = Result(name)
    leaving: dict[int, list[Pod]] = {}
    started = time.perf_counter()
    for arrival in arrivals:
        for pod in leaving.pop(arrival.index, []):
            snapshot.remove_pod(pod)
            state.pod_removed(pod.key)
        pod = make_pod(arrival)
        result.arrived[arrival.gpus] += 1
        decision = framework.schedule(snapshot, pod, seed=arrival.index, topology=state)
        node = decision.selected
        if node is not None:
            if lattice:
                annotations = dict(decision.annotations)
            else:
                annotations = {DEVICES_ANNOTATION: _kubelet_choice(state, node, arrival)}
            snapshot.add_pod(pod, node)
            state.pod_placed(pod, node, annotations)
            leaving.setdefault(arrival.index + arrival.lifetime, []).append(pod)
            result.placed[arrival.gpus] += 1
            level, ideal = _levels(state, node, pod, annotations[DEVICES_ANNOTATION])
            if level <= ideal:
                result.aligned[arrival.gpus] += 1
            if level is Level.CROSS:
                result.numa_rejects[arrival.gpus] += 1
        if arrival.index % sample_every == 0:
            result.whole_nodes_samples.append(_whole_nodes(state, names))
    result.seconds = time.perf_counter() - started
    result.whole_nodes_end = _whole_nodes(state, names)
    result.numa_slots_end = _numa_slots(state, names)
    result.free_gpus_end = _free_gpus(state, names)
    # Churn without arrivals: every other running pod (by arrival index) finishes.
    for pods in leaving.values():
        for gone in pods:
            if int(gone.uid[1:]) % 2 == 0:
                state.pod_removed(gone.key)
    result.whole_nodes_drained = _whole_nodes(state, names)
    result.free_gpus_drained = _free_gpus(state, names)
    return result


def kube_profile(*, binpack: bool = False) -> Profile:
    """kube-scheduler's default profile (none of Lattice's plugins); ``binpack``:
    NodeResourcesFit with MostAllocated over cpu, memory and GPUs (weight 3), the usual
    advice for GPU clusters."""
    if binpack:
        return core_kube_profile(
            name="kube-binpack",
            strategy=ScoringStrategy.MOST_ALLOCATED,
            resources=(("cpu", 1), ("memory", 1), ("nvidia.com/gpu", 3)),
        )
    return core_kube_profile(name="kube")


def _kubelet_choice(state: TopologyState, node: str, arrival: Arrival) -> str:
    """Lowest free GPU and NIC indexes: a kubelet's device manager without topology hints."""
    layout, free = state.layout(node), state.free(node, None)
    assert layout is not None
    assert free is not None
    gpus = [int(s) for s in free.gpus.nonzero()[0][: arrival.gpus]]
    nics = [int(s) for s in free.nics.nonzero()[0][: int(arrival.nic)]]
    zones = {int(layout.gpu_zone[s]) for s in gpus} | {int(layout.nic_zone[s]) for s in nics}
    return DeviceAssignment(
        tuple(i for i in (layout.gpu_index[s] for s in gpus) if i is not None),
        tuple(a for a in (layout.nic_address[s] for s in nics) if a is not None),
        layout.numa_ids[zones.pop()] if len(zones) == 1 else None,
    ).to_annotation()


def _levels(state: TopologyState, node: str, pod: Pod, text: str) -> tuple[Level, Level]:
    """(level of the placed devices, best level the hardware allows for this pod)."""
    layout = state.layout(node)
    assignment = DeviceAssignment.from_annotation(text)
    assert layout is not None
    assert assignment is not None
    gpus = [layout.gpu_index.index(i) for i in assignment.gpus]
    nics = [layout.nic_address.index(a) for a in assignment.nics]
    request = TopologyRequest.from_pod(pod, state.args)
    ideal = state.choose(node, None, request, Level.CROSS, pin_cpus=False)
    assert ideal is not None
    return level_of(layout, gpus, nics), ideal.level


def _whole_nodes(state: TopologyState, names: list[str]) -> int:
    count = 0
    for n in names:
        free = state.free(n, None)
        assert free is not None
        count += bool(free.gpus.all())
    return count


def _free_gpus(state: TopologyState, names: list[str]) -> int:
    total = 0
    for n in names:
        free = state.free(n, None)
        assert free is not None
        total += int(free.gpus.sum())
    return total


def _numa_slots(state: TopologyState, names: list[str]) -> int:
    slots = 0
    for n in names:
        layout, free = state.layout(n), state.free(n, None)
        assert layout is not None
        assert free is not None
        for z in range(layout.num_zones):
            slots += int((free.gpus & (layout.gpu_zone == z)).sum()) // 4
    return slots


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:5.1f}%" if whole else "    -"


def report(results: list[Result], nodes: int, pods: int, load: float, seed: int) -> str:
    head = (
        f"Topology placement: {nodes} gpu-8x nodes (two-socket-8gpu fixture: 2 NUMA nodes x "
        f"2 PCIe switches x 2 GPUs + 1 RDMA NIC), {pods} pods "
        f"({', '.join(f'{w}% {k}-GPU' for k, w in SIZES)}; NIC on "
        f"{', '.join(f'{NIC_SHARE[k]}%' for k, _ in SIZES)} of them), target load "
        f"{load:.0%}, seed {seed}"
    )
    width = 16
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, values: list[str]) -> None:
        rows.append((label, values))

    row("", [r.name for r in results])
    row("pods placed", [f"{sum(r.placed.values())}/{sum(r.arrived.values())}" for r in results])
    for k, _ in SIZES:
        row(f"  {k}-GPU placed", [f"{r.placed[k]}/{r.arrived[k]}" for r in results])
    small = (1, 2, 4)
    row(
        "aligned (1-4 GPU pods)",
        [_pct(sum(r.aligned[k] for k in small), sum(r.placed[k] for k in small)) for r in results],
    )
    for k in small:
        row(f"  aligned {k}-GPU", [_pct(r.aligned[k], r.placed[k]) for r in results])
    row(
        "single-numa-node rejects",
        [f"{sum(r.numa_rejects[k] for k in small)}" for r in results],
    )
    row("  (+ every 8-GPU pod)", [f"{r.numa_rejects[8]}" for r in results])
    row(
        "8-GPU admissible, run mean",
        [f"{sum(r.whole_nodes_samples) / max(len(r.whole_nodes_samples), 1):.1f}" for r in results],
    )
    row("  at end (free GPUs)", [f"{r.whole_nodes_end} ({r.free_gpus_end})" for r in results])
    row(
        "  half the pods left",
        [f"{r.whole_nodes_drained} ({r.free_gpus_drained})" for r in results],
    )
    row("aligned 4-GPU slots at end", [str(r.numa_slots_end) for r in results])
    row("seconds", [f"{r.seconds:.1f}" for r in results])
    label_width = max(len(label) for label, _ in rows) + 2
    lines = [head, ""]
    for label, values in rows:
        lines.append(label.ljust(label_width) + "".join(v.rjust(width) for v in values))
    lines += [
        "",
        "aligned: GPUs (and NIC) under one PCIe switch for 1-2 GPU pods, on one NUMA node for "
        "4-GPU pods.",
        "single-numa-node rejects: placed 1-4 GPU pods whose devices span NUMA nodes; an 8-GPU "
        "pod always spans on this hardware.",
        "8-GPU admissible: nodes with all 8 GPUs free; sampled every 25 arrivals for the mean, "
        "at the end of the stream, and after every other running pod then finished.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--load", type=float, default=0.85, help="target share of GPUs busy")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--fixture", type=Path, default=FIXTURE / "two-socket-8gpu", help="fixture tree"
    )
    args = parser.parse_args(argv)
    from scheduler.agent.reader import read_node  # the agent's reader: file I/O, bench only

    reading = read_node(sysfs_root=args.fixture / "sys", procfs_root=args.fixture / "proc")
    arrivals = stream(args.pods, args.nodes, args.load, args.seed)
    results = [
        run("lattice", reading.topology, arrivals, args.nodes, lattice=True),
        run("kube", reading.topology, arrivals, args.nodes, lattice=False),
        run("kube-binpack", reading.topology, arrivals, args.nodes, lattice=False, binpack=True),
    ]
    print(report(results, args.nodes, args.pods, args.load, args.seed))


if __name__ == "__main__":
    main()
