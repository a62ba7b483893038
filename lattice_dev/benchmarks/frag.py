"""`just bench-frag`: GPU fragmentation on a production trace, live, against kube-scheduler.

The trace's nodes (Alibaba GPU trace v2023 by default: 1213 nodes, 6212 GPUs) become kwok
nodes of one control plane; its tasks arrive in trace order, never deleted, until they ask
``--until-demand`` % of the GPUs (FGD's replay, as `lattice simulate` does it). Arms run
one after another on the same nodes, each in a namespace of its own, emptied before the
next: Lattice with its defaults, kube-scheduler with its default profile, and the same
kube-scheduler's MostAllocated profile (cpu 1, memory 1, nvidia.com/gpu 3: the bin-packing
configuration kube-scheduler's docs show). kube-scheduler keeps its adaptive
``percentageOfNodesToScore``, as its users run it (``--score-all`` for the tuned row).

Pods are created as fast as 32 parallel calls go, in trace order; both schedulers take them
in creation order (priority equal). An arm ends when every pod is bound or has been
reported Unschedulable (``PodScheduled=False``) and no binding came for ``--settle`` s.

Printed per arm: GPUs left unallocated (% of all), multi-GPU and all GPU tasks bound, pods/s
(bound pods over first create to last binding) and the scheduler's CPU ms per bound pod
(user + system of its process over the arm, start-up excluded); beside them the simulator's
figure for the same arrivals and policy, and the difference. ``--synthetic SHARE`` replaces
the trace's tasks by a mix drawn from them (:func:`scheduler.sim.trace.synthetic`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, cast

import aiohttp
from kubernetes_asyncio import client

from lattice_dev.benchmarks.common import REPO, Watcher, apply_crds, create_pods, start_lattice
from lattice_dev.benchmarks.common import wait_lattice_ready as _wait_ready
from lattice_dev.benchmarks.scheduling import cpu_seconds
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster, raw_node_ready
from lattice_dev.devcluster.kube import api_client
from lattice_dev.devcluster.profiles import KWOK_ANNOTATION
from scheduler.sim import KUBE_DEFAULT, KUBE_MOST_ALLOCATED, LATTICE, POLICY_NAMES
from scheduler.sim.replay import MOST_ALLOCATED_RESOURCES, ReplayConfig, arrivals, replay
from scheduler.sim.trace import Task, Trace, load_alibaba, synthetic

TRACE_DIR: Final = REPO / "e2e" / "traces" / "alibaba-gpu-v2023"
NODES_CSV: Final = "openb_node_list_gpu_node.csv"
SCHEDULER_NAMES: Final = {
    LATTICE: "lattice",
    KUBE_DEFAULT: "default-scheduler",
    KUBE_MOST_ALLOCATED: "most-allocated",
}
"""The schedulerName each arm's pods carry: one kube-scheduler serves both of its profiles."""
LS: Final = ("lattice.dev", "v1alpha1", "latticeschedulers")
PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10"


def kube_profiles() -> tuple[dict[str, Any], ...]:
    """kube-scheduler's default profile and its MostAllocated one, in one process."""
    most_allocated = {
        "schedulerName": SCHEDULER_NAMES[KUBE_MOST_ALLOCATED],
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": "MostAllocated",
                        "resources": [
                            {"name": n, "weight": w} for n, w in MOST_ALLOCATED_RESOURCES
                        ],
                    }
                },
            }
        ],
    }
    return ({"schedulerName": SCHEDULER_NAMES[KUBE_DEFAULT]}, most_allocated)


def kwok_node(body: dict[str, Any]) -> dict[str, Any]:
    """A trace node as a kwok-managed Node (the server assigns the uid)."""
    node = copy.deepcopy(body)
    meta = node["metadata"]
    meta.pop("uid", None)
    meta.setdefault("annotations", {})[KWOK_ANNOTATION] = "fake"
    meta["labels"].setdefault("type", "kwok")
    return node


def arm_pod(task: Task, ns: str, scheduler: str) -> dict[str, Any]:
    """The task's Pod for one arm: its namespace and schedulerName, no uid or status."""
    if task.body is None:
        raise ValueError(f"task {task.pod.name} has no Pod body to create")
    pod = copy.deepcopy(dict(task.body))
    pod["metadata"] = {"name": task.pod.name, "namespace": ns}
    pod["spec"]["schedulerName"] = scheduler
    for container in pod["spec"]["containers"]:
        container.setdefault("image", PAUSE_IMAGE)  # kwok runs nothing, the API wants one
    pod.pop("status", None)
    return pod


@dataclass
class ArmResult:
    arm: str
    pods: int
    bound: int
    gpu_tasks: tuple[int, int]
    """(bound, arrived)."""
    multi_gpu_tasks: tuple[int, int]
    unallocated_gpu_pct: float
    pods_per_s: float
    cpu_ms_per_pod: float
    unresolved: int
    """Pods neither bound nor reported Unschedulable when the arm ended (should be 0)."""
    not_ready_nodes: int = 0
    """Nodes seen not Ready (or tainted not-ready/unreachable) during the arm: on a machine
    too busy for kwok to renew its leases, the node controller taints nodes and pods that
    fail then count as unplaceable, so such a run's figures do not judge placement."""
    sim_unallocated_gpu_pct: float | None = None
    placements: list[tuple[str, str]] | None = None
    """(pod, node) in the order the bindings were seen (for --json: a replay of the same
    order through the simulator shows where live and simulated placement part)."""

    @property
    def sim_delta(self) -> float | None:
        if self.sim_unallocated_gpu_pct is None:
            return None
        return self.unallocated_gpu_pct - self.sim_unallocated_gpu_pct


def figures(
    arm: str,
    tasks: Sequence[Task],
    bound_nodes: dict[str, str],
    total_gpus: int,
    *,
    seconds: float,
    cpu_s: float,
    unresolved: int,
) -> ArmResult:
    """An arm's figures from which pods were bound (pod name -> node)."""
    gpu = multi = gpu_bound = multi_bound = allocated = 0
    for task in tasks:
        g = task.gpus
        on = task.pod.name in bound_nodes
        if g > 0:
            gpu += 1
            gpu_bound += on
            allocated += g if on else 0
            if g > 1:
                multi += 1
                multi_bound += on
    bound = sum(1 for t in tasks if t.pod.name in bound_nodes)
    return ArmResult(
        arm=arm,
        pods=len(tasks),
        bound=bound,
        gpu_tasks=(gpu_bound, gpu),
        multi_gpu_tasks=(multi_bound, multi),
        unallocated_gpu_pct=100 * (total_gpus - allocated) / total_gpus if total_gpus else 0.0,
        pods_per_s=bound / seconds if seconds > 0 else 0.0,
        cpu_ms_per_pod=1000 * cpu_s / bound if bound else 0.0,
        unresolved=unresolved,
    )


def unschedulable(pod: dict[str, Any]) -> bool:
    """The scheduler said it tried and the pod does not fit (``PodScheduled=False``)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return True
    return False


async def _unresolved(core: client.CoreV1Api, ns: str) -> int:
    """Pods of ``ns`` neither bound nor reported Unschedulable (one paged list)."""
    left, token = 0, ""
    while True:
        page: dict[str, Any] = {"_continue": token} if token else {}
        resp: Any = await core.list_namespaced_pod(ns, limit=1000, _preload_content=False, **page)
        body = json.loads(await resp.read())
        for pod in body.get("items") or []:
            if not (pod.get("spec") or {}).get("nodeName") and not unschedulable(pod):
                left += 1
        token = (body.get("metadata") or {}).get("continue") or ""
        if not token:
            return left


class NodeWatch:
    """Polls the nodes (watch cache, raw JSON) while an arm runs; remembers every node
    seen not Ready."""

    def __init__(self, core: client.CoreV1Api, every_s: float = 3.0) -> None:
        self.core = core
        self.every_s = every_s
        self.not_ready: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, client.ApiException):
                resp: Any = await self.core.list_node(resource_version="0", _preload_content=False)
                for node in json.loads(await resp.read()).get("items") or []:
                    if not raw_node_ready(node):
                        self.not_ready.add(node["metadata"]["name"])
            await asyncio.sleep(self.every_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def _clear(core: client.CoreV1Api, ns: str) -> None:
    """Force-delete the arm's pods so the next arm starts on empty nodes. Thousands of pods
    outlast one DELETE's client timeout, so it is repeated until the list is empty."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, client.ApiException):
            await core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        resp: Any = await core.list_namespaced_pod(ns, limit=1, _preload_content=False)
        if not json.loads(await resp.read()).get("items"):
            break
        await asyncio.sleep(2.0)
    with contextlib.suppress(client.ApiException):
        await core.delete_namespace(ns)


async def run_arm(
    cluster: DevCluster,
    api: client.ApiClient,
    arm: str,
    tasks: Sequence[Task],
    total_gpus: int,
    args: argparse.Namespace,
) -> ArmResult:
    core = client.CoreV1Api(api)
    ns = f"frag-{arm}"
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
    if arm == LATTICE:
        objects: Any = client.CustomObjectsApi(api)
        with contextlib.suppress(client.ApiException):  # 409: left by an earlier run
            await objects.create_cluster_custom_object(
                *LS,
                {
                    "apiVersion": f"{LS[0]}/{LS[1]}",
                    "kind": "LatticeScheduler",
                    "metadata": {"name": LATTICE},
                    "spec": {"schedulerName": SCHEDULER_NAMES[LATTICE]},
                },
            )
        started = time.time()
        pid = start_lattice(cluster, args.lattice_log_level)
        await _wait_ready(objects, started)
    else:
        state = cluster.load_state()
        assert state is not None
        pid = state.pids["kube-scheduler"]
    nodes = NodeWatch(core)
    nodes.start()
    watcher = Watcher(api, ns)
    watcher.start()
    await watcher.started.wait()
    bodies = [arm_pod(t, ns, SCHEDULER_NAMES[arm]) for t in tasks]
    names = {b["metadata"]["name"] for b in bodies}
    cpu0 = cpu_seconds(pid)
    t0 = time.monotonic()
    await create_pods(core, ns, bodies)
    # Done when nothing was bound for --settle s and every pod is bound or said not to fit.
    unresolved = len(names)
    deadline = time.monotonic() + args.arm_timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(args.settle)
        last = max(watcher.bound.values(), default=t0)
        if time.monotonic() - last < args.settle:
            continue
        unresolved = await _unresolved(core, ns)
        if unresolved == 0:
            break
    cpu_s = cpu_seconds(pid) - cpu0
    last = max(watcher.bound.values(), default=t0)
    result = figures(
        arm,
        tasks,
        {n: watcher.nodes[n] for n in names & watcher.bound.keys()},
        total_gpus,
        seconds=last - t0,
        cpu_s=cpu_s,
        unresolved=unresolved,
    )
    result.placements = sorted(
        ((n, watcher.nodes[n]) for n in names & watcher.bound.keys()),
        key=lambda p: watcher.bound[p[0]],
    )
    result.not_ready_nodes = len(nodes.not_ready)
    await nodes.stop()
    await watcher.stop()
    if arm == LATTICE:
        cluster.stop_component(LATTICE)
    await _clear(core, ns)
    return result


def report(trace: Trace, tasks: Sequence[Task], results: Sequence[ArmResult]) -> list[str]:
    gpus = trace.gpus
    asked = sum(t.gpus for t in tasks)
    lines = [
        f"{trace.name}: {len(trace.nodes)} kwok nodes, {gpus} GPUs; {len(tasks)} tasks "
        f"arrived ({asked} GPUs asked, {100 * asked / gpus:.0f}% of the GPUs), never deleted",
        "",
        f"{'arm':<20} {'unalloc GPU %':>13} {'sim %':>7} {'live-sim':>8} {'multi-GPU':>10} "
        f"{'GPU tasks':>10} {'pods/s':>7} {'CPU ms/pod':>10}",
    ]
    for r in results:
        sim = "-" if r.sim_unallocated_gpu_pct is None else f"{r.sim_unallocated_gpu_pct:.2f}"
        delta = "-" if r.sim_delta is None else f"{r.sim_delta:+.2f}"
        lines.append(
            f"{r.arm:<20} {r.unallocated_gpu_pct:>13.2f} {sim:>7} {delta:>8} "
            f"{r.multi_gpu_tasks[0]:>5}/{r.multi_gpu_tasks[1]:<4} "
            f"{r.gpu_tasks[0]:>5}/{r.gpu_tasks[1]:<4} {r.pods_per_s:>7.1f} "
            f"{r.cpu_ms_per_pod:>10.2f}"
            + (f"  ({r.unresolved} pods unresolved)" if r.unresolved else "")
            + (
                f"  WARNING: {r.not_ready_nodes} nodes went NotReady (machine overloaded)"
                if r.not_ready_nodes
                else ""
            )
        )
    by = {r.arm: r for r in results}
    lat = by.get(LATTICE)
    if lat is not None:
        for peer in (KUBE_DEFAULT, KUBE_MOST_ALLOCATED):
            p = by.get(peer)
            if p is not None and p.unallocated_gpu_pct > 0:
                lines.append(
                    f"lattice / {peer}: {lat.unallocated_gpu_pct / p.unallocated_gpu_pct:.2f}x "
                    f"the unallocated GPUs, {lat.multi_gpu_tasks[0] - p.multi_gpu_tasks[0]:+d} "
                    "multi-GPU tasks bound"
                )
    return lines


def load(args: argparse.Namespace) -> Trace:
    trace = load_alibaba(args.trace_dir / NODES_CSV, args.trace_dir / args.tasks)
    if args.synthetic is not None:
        trace = synthetic(trace, multi_share=args.synthetic, seed=args.seed)
    if args.max_nodes:
        keep = trace.nodes[: args.max_nodes]
        trace = Trace(
            keep,
            [],
            trace.tasks,
            trace.skipped,
            name=trace.name,
            node_bodies=trace.node_bodies[: args.max_nodes],
        )
    return trace


async def _bench(
    cluster: DevCluster, trace: Trace, tasks: list[Task], args: argparse.Namespace
) -> list[ArmResult]:
    results: list[ArmResult] = []
    await cluster.add_nodes([kwok_node(b) for b in trace.node_bodies])
    async with api_client(cluster.kubeconfig) as api:
        for arm in args.arms:
            t = time.monotonic()
            r = await run_arm(cluster, api, arm, tasks, trace.gpus, args)
            print(
                f"  {arm}: {r.unallocated_gpu_pct:.2f}% unallocated, multi-GPU "
                f"{r.multi_gpu_tasks[0]}/{r.multi_gpu_tasks[1]} [{time.monotonic() - t:.0f}s]",
                flush=True,
            )
            results.append(r)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace-dir", type=Path, default=TRACE_DIR)
    parser.add_argument("--tasks", default="openb_pod_list_multigpu40.csv", help="task CSV")
    parser.add_argument(
        "--synthetic", type=float, metavar="SHARE", help="synthetic mix (see lattice simulate)"
    )
    parser.add_argument("--seed", type=int, default=0, help="synthetic mix and sim seed")
    parser.add_argument("--until-demand", type=float, default=100.0, metavar="PCT")
    parser.add_argument("--arms", nargs="+", choices=POLICY_NAMES, default=list(POLICY_NAMES))
    parser.add_argument("--max-nodes", type=int, default=0, help="first N nodes only (tests)")
    parser.add_argument(
        "--score-all", action="store_true", help="kube: percentageOfNodesToScore 100"
    )
    parser.add_argument("--settle", type=float, default=5.0, help="s without a binding to end")
    parser.add_argument("--arm-timeout", type=float, default=1800.0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--lattice-log-level", default="warning", help="info: every attempt (kept with --keep-logs)"
    )
    parser.add_argument("--keep-logs", type=Path, help="copy the plane's logs here at the end")
    args = parser.parse_args(argv)
    trace = load(args)
    tasks = arrivals(trace.tasks, trace.gpus, args.until_demand)
    print(f"simulating the same arrivals ({len(tasks)} tasks) ...", flush=True)
    sim = replay(trace, args.arms, ReplayConfig(until_demand=args.until_demand, seed=args.seed))
    sim_pct = {r.policy: r.unallocated_gpu_pct for r in sim.results}
    scratch = Path(tempfile.mkdtemp(prefix="lattice-bench-frag-"))
    cluster = DevCluster(scratch / "state")
    started = time.monotonic()
    try:
        state = cluster.up(
            ClusterConfig(
                nodes=0,
                with_kube_scheduler=True,
                kube_scheduler_profiles=kube_profiles(),
                percentage_of_nodes_to_score=100 if args.score_all else None,
            )
        )
        apply_crds(cluster, state)
        results = asyncio.run(_bench(cluster, trace, tasks, args))
    finally:
        if args.keep_logs is not None:  # before down(), which removes the state
            shutil.copytree(cluster.log(LATTICE).parent, args.keep_logs, dirs_exist_ok=True)
        cluster.down()
        shutil.rmtree(scratch, ignore_errors=True)
    for r in results:
        r.sim_unallocated_gpu_pct = sim_pct.get(r.arm)
    lines = report(trace, tasks, results)
    if args.score_all:
        lines.append("(kube-scheduler scoring every node: a tuned peer, not its default)")
    print("\n" + "\n".join(lines))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(f"\n(total {time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
