"""Gang solver scaling (``python -m lattice_dev.solver.bench``): pure, no cluster.

Builds GPU clusters of 1000 and 5000 nodes (8 GPUs, 96 CPUs each; racks of 20 nodes, blocks
of 10 racks; about a third of the nodes partly used by earlier pods) and times, for each
gang: ``build_problem`` (the framework once per member class, plus the joint rules), greedy
alone, and the full solve (greedy + CP-SAT per-node counts, per domain when the gang has a
topology key) under the time limit. Gangs: 64 members of 8 GPUs, 64 members of 1 GPU, the
1-GPU gang in one rack, a mixed gang (8-GPU workers, 2-GPU workers, CPU-only parameter
servers with hostname anti-affinity), and two gangs preferring racks (blocks the wider
level): for those it also prints the (blocks, racks) greedy's and the solve's plans span.
With ``--naive`` the boolean member x node model (no merging) runs on the smallest cluster
for comparison. Not a test: it prints figures, and the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lattice_dev.solver.naive import solve_naive
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.gang import GangSpec
from scheduler.model.names import LABEL_HOSTNAME
from scheduler.model.node import Node
from scheduler.model.pod import Pod
from scheduler.model.topology import GPU_RESOURCE
from scheduler.solver.check import spans
from scheduler.solver.greedy import greedy
from scheduler.solver.model import model_size
from scheduler.solver.problem import GangProblem, build_problem
from scheduler.solver.solve import solve

RACK_LABEL = "lattice.dev/rack"
BLOCK_LABEL = "lattice.dev/block"
LEVELS = (BLOCK_LABEL, RACK_LABEL)
"""Racks of 20 nodes, blocks of 10 racks: ``spec.topology.levels`` for preferred gangs."""


def build_cluster(num_nodes: int, *, seed: int = 0) -> Snapshot:
    """GPU nodes in racks of 20; about a third carry a pod holding 1..7 GPUs."""
    rng = random.Random(seed)
    snapshot = Snapshot()
    for i in range(num_nodes):
        name = f"gpu-{i:05d}"
        snapshot.add_node(
            Node.from_api(
                {
                    "metadata": {
                        "name": name,
                        "labels": {
                            LABEL_HOSTNAME: name,
                            RACK_LABEL: f"rack-{i // 20:03d}",
                            BLOCK_LABEL: f"block-{i // 200:02d}",
                        },
                    },
                    "status": {
                        "allocatable": {
                            "cpu": "96",
                            "memory": "1Ti",
                            "pods": "110",
                            GPU_RESOURCE: "8",
                        }
                    },
                }
            )
        )
        if rng.random() < 0.35:
            used = rng.randint(1, 7)
            pod = _pod(f"busy-{i}", cpu=f"{4 * used}", memory=f"{16 * used}Gi", gpus=used)
            snapshot.add_pod(pod, name)
    return snapshot


def _pod(
    name: str,
    *,
    cpu: str,
    memory: str,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    anti_hostname: bool = False,
) -> Pod:
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        requests[GPU_RESOURCE] = str(gpus)
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests}}]}
    if anti_hostname and labels:
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": labels}, "topologyKey": LABEL_HOSTNAME}
                ]
            }
        }
    return Pod.from_api(
        {
            "metadata": {
                "name": name,
                "namespace": "bench",
                "uid": name,
                "labels": {"job": "llm", **(labels or {})},
            },
            "spec": spec,
        }
    )


def uniform_gang(count: int, gpus: int) -> list[Pod]:
    return [_pod(f"w{gpus}-{i}", cpu=f"{4 * gpus}", memory="32Gi", gpus=gpus) for i in range(count)]


def mixed_gang() -> list[Pod]:
    big = [_pod(f"big-{i}", cpu="32", memory="256Gi", gpus=8) for i in range(8)]
    small = [_pod(f"small-{i}", cpu="8", memory="64Gi", gpus=2) for i in range(40)]
    ps = [
        _pod(f"ps-{i}", cpu="8", memory="32Gi", labels={"role": "ps"}, anti_hostname=True)
        for i in range(16)
    ]
    return big + small + ps


@dataclass(frozen=True, slots=True)
class Row:
    case: str
    nodes: int
    members: int
    classes: int
    build_s: float
    greedy_s: float
    greedy_placed: int
    solve_s: float
    status: str
    admitted: bool
    placed: int
    variables: int
    constraints: int
    model_vars: int
    model_cons: int
    partial: int


HEADER = (
    f"{'case':<26} {'nodes':>5} {'memb':>4} {'cls':>3} {'build_s':>7} {'greedy_s':>8} "
    f"{'g_placed':>8} {'solve_s':>7} {'status':<16} {'adm':<3} {'placed':>6} {'vars':>6} "
    f"{'cons':>6} {'m_vars':>6} {'m_cons':>6} {'partial':>7}"
)
"""vars/cons: summed over the count models solved (0: greedy met the bound, no model was
needed); m_vars/m_cons: one count model over the chosen domain (or all nodes), built only to
show its size; partial: nodes the plan leaves partially free of GPUs."""


def format_row(r: Row) -> str:
    return (
        f"{r.case:<26} {r.nodes:>5} {r.members:>4} {r.classes:>3} {r.build_s:>7.3f} "
        f"{r.greedy_s:>8.3f} {r.greedy_placed:>8} {r.solve_s:>7.3f} {r.status:<16} "
        f"{'yes' if r.admitted else 'no':<3} {r.placed:>6} {r.variables:>6} {r.constraints:>6} "
        f"{r.model_vars:>6} {r.model_cons:>6} {r.partial:>7}"
    )


def run_case(
    case: str,
    framework: Framework,
    snapshot: Snapshot,
    members: Sequence[Pod],
    *,
    topology_key: str | None = None,
    preferred: str | None = None,
    slice_size: int | None = None,
    time_limit_s: float,
    seed: int,
    workers: int,
) -> tuple[Row, GangProblem]:
    spec = GangSpec(
        namespace="bench",
        name=case,
        min_member=len(members),
        topology_key=topology_key,
        topology_preferred=preferred,
        slice_size=slice_size,
        slice_key=RACK_LABEL if slice_size else None,
    )
    problem = build_problem(
        framework, snapshot, spec, members, need=len(members), seed=seed, levels=LEVELS
    )
    started = time.perf_counter()
    greedy_plan = solve(problem, use_solver=False, seed=seed)
    greedy_s = time.perf_counter() - started
    plan = solve(problem, time_limit_s=time_limit_s, seed=seed, workers=workers)
    if problem.compact:
        index = {name: n for n, name in enumerate(problem.node_names)}
        spanned = []
        for answer in (greedy_plan, plan):
            counts = np.zeros_like(problem.limit)
            for i, node in answer.placements:
                counts[problem.member_class[i], index[node]] += 1
            spanned.append(spans(problem, counts))
        print(f"  {case}: (blocks, racks) spanned: greedy {spanned[0]}, solve {spanned[1]}")
    nodes = np.flatnonzero((problem.limit > 0).any(axis=0))
    if plan.domain is not None:
        nodes = nodes[problem.domain[nodes] == problem.domain_names.index(plan.domain)]
    model_vars, model_cons = model_size(problem, nodes, greedy(problem, nodes, seed=seed).counts)
    row = Row(
        case,
        snapshot.num_nodes,
        len(members),
        problem.num_classes,
        problem.build_time_s,
        greedy_s,
        greedy_plan.placed,
        plan.solve_time_s,
        plan.status.value,
        plan.admitted,
        plan.placed,
        plan.variables,
        plan.constraints,
        model_vars,
        model_cons,
        plan.partial_gpu_nodes,
    )
    return row, problem


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--members", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--naive", action="store_true", help="also the boolean model")
    args = parser.parse_args(argv)
    framework = Framework()
    print(HEADER)
    for num_nodes in args.nodes:
        snapshot = build_cluster(num_nodes, seed=args.seed)
        cases: list[tuple[str, list[Pod], str | None, str | None, int | None]] = [
            (f"{args.members} x 8 GPU", uniform_gang(args.members, 8), None, None, None),
            (f"{args.members} x 1 GPU", uniform_gang(args.members, 1), None, None, None),
            (
                f"{args.members} x 1 GPU, one rack",
                uniform_gang(args.members, 1),
                RACK_LABEL,
                None,
                None,
            ),
            ("mixed 8x8+40x2+16 ps", mixed_gang(), None, None, None),
            (
                f"{args.members} x 8 GPU, pref rack",
                uniform_gang(args.members, 8),
                None,
                RACK_LABEL,
                None,
            ),
            (
                f"{args.members // 4} x 4 GPU, pref rack",
                uniform_gang(args.members // 4, 4),
                None,
                RACK_LABEL,
                None,
            ),
            (
                f"{args.members} x 4 GPU, slices 8/rack",
                uniform_gang(args.members, 4),
                None,
                None,
                8,
            ),
            (
                f"{args.members} x 4 GPU, sl 8 pref rack",
                uniform_gang(args.members, 4),
                None,
                RACK_LABEL,
                8,
            ),
        ]
        for case, members, key, preferred, slice_size in cases:
            row, _ = run_case(
                case,
                framework,
                snapshot,
                members,
                topology_key=key,
                preferred=preferred,
                slice_size=slice_size,
                time_limit_s=args.time_limit,
                seed=args.seed,
                workers=args.workers,
            )
            print(format_row(row), flush=True)
    if args.naive:
        num_nodes = min(args.nodes)
        snapshot = build_cluster(num_nodes, seed=args.seed)
        for gpus in (8, 1):
            members = uniform_gang(args.members, gpus)
            spec = GangSpec(namespace="bench", name="naive", min_member=len(members))
            problem = build_problem(
                framework, snapshot, spec, members, need=len(members), merge=False
            )
            outcome = solve_naive(
                problem, time_limit_s=args.time_limit, seed=args.seed, workers=args.workers
            )
            placed = int(outcome.counts.sum()) if outcome.counts is not None else 0
            print(
                f"naive {args.members} x {gpus} GPU, {num_nodes} nodes: build "
                f"{problem.build_time_s:.3f}s, model+solve {outcome.wall_s:.3f}s, "
                f"{outcome.status.value}, placed {placed}/{len(members)}, "
                f"{outcome.variables} vars, {outcome.constraints} constraints",
                flush=True,
            )


if __name__ == "__main__":
    main()
