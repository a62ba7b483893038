"""Benchmark one preemption at scale (``python -m lattice_dev.benchmarks.preemption``).

Builds clusters of 1000 and 5000 nodes (``lattice_dev.core.bench``'s nodes: 32 cpu, 128 Gi,
3 zones, a few cordoned or tainted) holding 30 000 existing pods spread evenly: four
PriorityClass levels, start times varied, some apps under PodDisruptionBudgets, and every
node filled to within one preemptor of its cpu, so a high-priority pod fits nowhere
without evictions. Deterministic by ``--seed``.

For each kind of preemptor it times, in the pure core (no API server):

* the filter pass that finds the pod Unschedulable (:meth:`Framework.schedule`), and
* the preemption cycle proper (:func:`scheduler.core.preemption.preempt`: potential nodes,
  screen, dry run with victim selection on up to ``max(10 %, 100)`` candidates, pick),

then runs the naive oracle (:mod:`lattice_dev.core.oracle.preemption`: a fresh snapshot and a
whole filter pass per fit check) on the same inputs and checks both chose the same node (or
one it found tied) with the same victims and PDB violations there. Exits 1 when they
disagree. A full oracle run costs about (potential nodes visited + victims tried on 100-500
candidates) fit checks of a second or more each at 30 000 pods, hours per preemption, so it
runs in full only up to ``--oracle-max-nodes`` (default 200; ``--oracle-repeat`` runs each,
default 1). Above that it is run on the core's chosen node alone (a cycle restricted to it,
so the oracle's dry run has that one potential node; ``--oracle-spot-nodes`` adds nodes the
core found tied): that checks the victims there, and its time per fit check, times the
checks a full run would make (:func:`oracle_checks`), is the oracle's estimated time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeVar

from lattice_dev.core.bench import build_cluster
from lattice_dev.core.oracle import preemption as oracle
from scheduler.core.explain import Decision
from scheduler.core.preemption import (
    Candidate,
    Inputs,
    Preemption,
    num_candidates,
    potential_nodes,
    preempt,
)
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.pdb import PodDisruptionBudget
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PodFacts

T = TypeVar("T")

HOSTNAME: Final = "kubernetes.io/hostname"
ZONE: Final = "topology.kubernetes.io/zone"
NODE_CPU_MILLIS: Final = 32_000
NODE_MEMORY_GIB: Final = 128

PRIORITY_CLASSES: Final = (("batch", 0, 35), ("default", 100, 35), ("service", 1000, 20))
"""(name, value, weight in percent) of the existing pods' PriorityClasses below the
preemptor; the rest are :data:`CRITICAL`."""
CRITICAL: Final = ("critical", 100_000, 10)
PREEMPTOR_PRIORITY: Final = 10_000
PREEMPTOR_CPU_MILLIS: Final = 4_000
TIERS: Final = ("web", "db", "cache", "batch")
APPS_PER_TIER: Final = 10
BUDGETED_APPS: Final = 12
"""Each of the 40 apps is under a PodDisruptionBudget (allowing 0 to 3 disruptions) with
probability 12/40."""


@dataclass(frozen=True)
class World:
    """One cluster and everything preemption reads besides it."""

    snapshot: Snapshot
    inputs: Inputs


def build_world(num_nodes: int, num_pods: int, seed: int) -> World:
    """``num_pods`` existing pods spread evenly over ``num_nodes`` nodes, each node left with
    less free cpu than :data:`PREEMPTOR_CPU_MILLIS`."""
    rng = random.Random(seed)
    snapshot, nodes, _ = build_cluster(num_nodes, 0)
    classes = (*PRIORITY_CLASSES, CRITICAL)
    facts: dict[str, PodFacts] = {}
    per_node, extra = divmod(num_pods, num_nodes)
    serial = 0
    for i, node in enumerate(nodes):
        count = per_node + (i < extra)
        cpu_used = cpu_left = NODE_CPU_MILLIS - rng.randrange(PREEMPTOR_CPU_MILLIS)
        mem_used = mem_left = NODE_MEMORY_GIB * 1024 * rng.randrange(50, 90) // 100
        weights = [rng.uniform(0.5, 1.5) for _ in range(count)]
        total = sum(weights)
        for j, weight in enumerate(weights):
            last = j == count - 1
            cpu = cpu_left if last else int(cpu_used * weight / total)
            mem = mem_left if last else int(mem_used * weight / total)
            cpu_left, mem_left = cpu_left - cpu, mem_left - mem
            name, priority, _ = rng.choices(classes, weights=[c[2] for c in classes])[0]
            tier = rng.choice(TIERS)
            pod = existing_pod(
                f"p-{serial:06d}",
                cpu_millis=cpu,
                memory_mib=mem,
                priority=priority,
                priority_class=name,
                labels={"tier": tier, "app": f"{tier}-{rng.randrange(APPS_PER_TIER)}"},
            )
            serial += 1
            snapshot.add_pod(pod, node.name)
            facts[pod.key] = PodFacts(start_time=1.7e9 + rng.randrange(86_400 * 30))
    pdbs = [
        budget(f"{tier}-{k}", allowed=rng.randrange(4))
        for tier in TIERS
        for k in range(APPS_PER_TIER)
        if rng.randrange(len(TIERS) * APPS_PER_TIER) < BUDGETED_APPS
    ]
    return World(snapshot, Inputs(pdbs=pdbs, facts=facts, seed=seed))


def existing_pod(
    name: str,
    *,
    cpu_millis: int,
    memory_mib: int,
    priority: int,
    priority_class: str,
    labels: dict[str, str],
) -> Pod:
    return Pod.from_api(
        {
            "metadata": {"name": name, "namespace": "default", "uid": name, "labels": labels},
            "spec": {
                "priority": priority,
                "priorityClassName": priority_class,
                "containers": [
                    {
                        "name": "c",
                        "resources": {
                            "requests": {"cpu": f"{cpu_millis}m", "memory": f"{memory_mib}Mi"}
                        },
                    }
                ],
            },
        }
    )


def budget(app: str, *, allowed: int) -> PodDisruptionBudget:
    return PodDisruptionBudget.from_api(
        {
            "metadata": {"name": app, "namespace": "default"},
            "spec": {"maxUnavailable": allowed, "selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed},
        }
    )


def _term(topology_key: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": labels}, "topologyKey": topology_key}


PREEMPTOR_KINDS: Final[dict[str, dict[str, Any]]] = {
    "plain": {},
    "hostname anti-affinity": {
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [_term(HOSTNAME, {"tier": "web"})]
            }
        }
    },
    "zone affinity": {
        "affinity": {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [_term(ZONE, {"tier": "db"})]
            }
        }
    },
    "zone spread": {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"tier": "web"}},
            }
        ]
    },
}
"""The preemptor's extra spec per kind: plain requests; required anti-affinity to the web
tier per node (all web pods on the node must go); required affinity to the db tier per zone
(held everywhere, but the filters run per check); a hard zone spread of the web tier with
skew 1 (only nodes in the zones with the fewest web pods are candidates)."""


def preemptor(kind: str) -> Pod:
    return Pod.from_api(
        {
            "metadata": {
                "name": "preemptor",
                "namespace": "default",
                "uid": "preemptor",
                "labels": {"app": "front"},
            },
            "spec": {
                "priority": PREEMPTOR_PRIORITY,
                "priorityClassName": "urgent",
                "containers": [
                    {
                        "name": "c",
                        "resources": {
                            "requests": {"cpu": f"{PREEMPTOR_CPU_MILLIS}m", "memory": "4Gi"}
                        },
                    }
                ],
                **PREEMPTOR_KINDS[kind],
            },
        }
    )


@dataclass(frozen=True)
class Timing:
    median: float
    best: float


def timed(fn: Callable[[], T], repeat: int) -> tuple[Timing, T]:
    """Runs ``fn`` ``repeat`` times: the median and minimum seconds, and the last result."""
    samples: list[float] = []
    for _ in range(repeat - 1):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    start = time.perf_counter()
    result = fn()
    samples.append(time.perf_counter() - start)
    return Timing(statistics.median(samples), min(samples)), result


def agreement(core: Preemption | None, naive: Preemption | None) -> str | None:
    """None when the oracle agrees (both none, or the same tied nodes with the core's node
    among them and the same victims and violations there), else what differs."""
    if core is None or naive is None:
        return None if core is naive else f"core {_brief(core)} vs oracle {_brief(naive)}"
    if core.node not in naive.tied or set(core.tied) != set(naive.tied):
        return f"core {_brief(core)} vs oracle {_brief(naive)}"
    return _same_victims(core, naive.candidates, [core.node])


def _same_victims(
    core: Preemption, theirs: Sequence[Candidate], nodes: Sequence[str]
) -> str | None:
    ours = {c.node: c for c in core.candidates}
    by_node = {c.node: c for c in theirs}
    for node in nodes:
        mine, other = ours.get(node), by_node.get(node)
        if (
            mine is None
            or other is None
            or {v.key for v in mine.victims} != {v.key for v in other.victims}
            or mine.pdb_violations != other.pdb_violations
        ):
            return f"on {node}: core {_victims(mine)} vs oracle {_victims(other)}"
    return None


def spot_agreement(core: Preemption, nodes: Sequence[str], naive: Preemption | None) -> str | None:
    """The oracle on ``nodes`` only (the core's choice and nodes it found tied): it must find
    them all tied, with the core's victims and violations on each."""
    if naive is None or set(naive.tied) != set(nodes):
        return f"core {_brief(core)} vs oracle on {list(nodes)}: {_brief(naive)}"
    return _same_victims(core, naive.candidates, nodes)


def _victims(c: Candidate | None) -> str:
    if c is None:
        return "no candidate"
    return f"{sorted(v.name for v in c.victims)} ({c.pdb_violations} violations)"


def _brief(p: Preemption | None) -> str:
    if p is None:
        return "none"
    return f"{p.node} victims={sorted(v.name for v in p.victims)} tied={list(p.tied)}"


def lower_pods(snapshot: Snapshot, node: str, pod: Pod) -> int:
    row = snapshot.index_of(node)
    assert row is not None
    return sum(1 for other in snapshot.pods_on(row) if other.priority < pod.priority)


def oracle_checks(snapshot: Snapshot, decision: Decision, found: Preemption, inputs: Inputs) -> int:
    """How many fit checks (fresh snapshot, full filter pass) the full oracle makes on these
    inputs: one per potential node with lower-priority pods that its dry run visits, and one
    per lower-priority pod on each candidate. The dry run visits nodes in the core's order
    (same seed) and stops where the core stopped, after its last candidate, once enough were
    found; a candidate left out of a full bucket counts one check, so this errs low."""
    pod = decision.pod
    potential = potential_nodes(snapshot, decision)
    offset = random.Random(inputs.seed).randrange(len(potential))
    order = potential[offset:] + potential[:offset]
    position = {name: i for i, name in enumerate(order)}
    candidates = {c.node for c in found.candidates}
    stop = len(order)
    if len(candidates) >= num_candidates(len(order)) and any(
        c.pdb_violations == 0 for c in found.candidates
    ):
        stop = max(position[name] for name in candidates) + 1
    checks = 0
    for name in order[:stop]:
        lower = lower_pods(snapshot, name, pod)
        if lower:
            checks += 1 + (lower if name in candidates else 0)
    return checks


@dataclass(frozen=True)
class OracleRun:
    """The oracle's time per preemption (measured, or estimated from a spot check) and
    whether it agreed."""

    seconds: float
    mode: str
    differs: str | None


def run_oracle(
    framework: Framework,
    snapshot: Snapshot,
    decision: Decision,
    found: Preemption | None,
    args: argparse.Namespace,
    inputs: Inputs,
) -> OracleRun:
    """The full oracle up to ``--oracle-max-nodes``; above, the oracle on the core's chosen
    node (and up to ``--oracle-spot-nodes`` - 1 nodes tied with it), its time per fit check
    scaled to the checks the full oracle would make."""
    if snapshot.num_nodes <= args.oracle_max_nodes or found is None:
        slow, naive = timed(
            partial(oracle.preempt, framework, snapshot, decision, inputs), args.oracle_repeat
        )
        return OracleRun(slow.median, "full", agreement(found, naive))
    nodes = [found.node, *(n for n in found.tied if n != found.node)][: args.oracle_spot_nodes]
    narrowed = framework.schedule(snapshot, decision.pod, restrict_to=frozenset(nodes))
    slow, naive = timed(
        partial(oracle.preempt, framework, snapshot, narrowed, inputs), args.oracle_repeat
    )
    spot_checks = sum(1 + lower_pods(snapshot, n, decision.pod) for n in nodes)
    per_check = slow.median / spot_checks
    full = oracle_checks(snapshot, decision, found, inputs)
    mode = f"est: {full} checks x {per_check * 1e3:.0f} ms (spot {len(nodes)} node)"
    return OracleRun(per_check * full, mode, spot_agreement(found, nodes, naive))


def run_size(
    framework: Framework, world: World, kinds: Sequence[str], args: argparse.Namespace
) -> bool:
    """Prints one row per kind; False when the core and the oracle disagreed on one."""
    agreed = True
    snapshot, inputs = world.snapshot, world.inputs
    for kind in kinds:
        pod = preemptor(kind)
        cycle, decision = timed(partial(framework.schedule, snapshot, pod), args.repeat)
        if decision.selected is not None:
            print(f"{snapshot.num_nodes:>6} {kind:<23} fits on {decision.selected} (no preemption)")
            continue
        fast, found = timed(partial(preempt, framework, snapshot, decision, inputs), args.repeat)
        naive = run_oracle(framework, snapshot, decision, found, args, inputs)
        agreed &= naive.differs is None
        print(
            f"{snapshot.num_nodes:>6} {kind:<23} {cycle.median * 1e3:8.1f} "
            f"{fast.median * 1e3:9.1f} {fast.best * 1e3:9.1f} {naive.seconds:10.1f} "
            f"x{naive.seconds / fast.median:7.0f} {'yes' if naive.differs is None else 'NO':>5}"
            f"  {_summary(found)}; oracle {naive.mode}",
            flush=True,
        )
        if naive.differs is not None:
            print(f"       disagreement: {naive.differs}")
    return agreed


def _summary(p: Preemption | None) -> str:
    if p is None:
        return "no preemption"
    return (
        f"{p.node}: {len(p.victims)} victims, {p.pdb_violations} PDB violations, "
        f"{len(p.candidates)} candidates, {len(p.tied)} tied"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="1000,5000", help="comma-separated cluster sizes")
    parser.add_argument("--pods", type=int, default=30_000, help="existing pods per cluster")
    parser.add_argument("--kinds", default=",".join(PREEMPTOR_KINDS), help="preemptor kinds")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of the core")
    parser.add_argument("--oracle-repeat", type=int, default=1, help="timed runs of the oracle")
    parser.add_argument(
        "--oracle-max-nodes",
        type=int,
        default=200,
        help="full oracle up to this size; above, a spot check on the chosen node",
    )
    parser.add_argument(
        "--oracle-spot-nodes", type=int, default=1, help="nodes (chosen, then tied) spot-checked"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.nodes.split(",") if s]
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(PREEMPTOR_KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}; known: {list(PREEMPTOR_KINDS)}")
    framework = Framework()
    print(
        f"{args.pods} existing pods, seed {args.seed}; filters and preempt in ms, oracle in s\n"
        f"{'nodes':>6} {'preemptor':<23} {'filters':>8} {'preempt':>9} {'min':>9} "
        f"{'oracle s':>10} {'ratio':>8} {'agree':>5}  chosen"
    )
    agreed = True
    for size in sizes:
        start = time.perf_counter()
        world = build_world(size, args.pods, args.seed)
        print(
            f"-- {size} nodes: built in {time.perf_counter() - start:.1f} s, "
            f"{len(world.inputs.pdbs)} PDBs",
            flush=True,
        )
        agreed &= run_size(framework, world, kinds, args)
    print(
        "filters: Framework.schedule, the cycle that found the pod Unschedulable (not in "
        "preempt)\npreempt: preempt() alone - potential nodes, screen, dry run, pick "
        f"(median, min of {args.repeat})\noracle s: the naive oracle per preemption, measured "
        f"(full, median of {args.oracle_repeat}) up to {args.oracle_max_nodes} nodes; above, "
        "estimated: its fit checks on the chosen node timed, times the checks a full run "
        "makes\n" + ("core and oracle agree" if agreed else "core and oracle DISAGREE")
    )
    return 0 if agreed else 1


if __name__ == "__main__":
    sys.exit(main())
