"""Gangs in the network, live: the topology simulator's stream against ``lattice run`` on kwok.

The offline simulator (``lattice simulate --gangs --topology``, :mod:`scheduler.sim.topology`)
replays a seeded stream of gangs of four kinds (required-rack, preferred-rack,
preferred-block, slices) on a generated cluster. This benchmark replays the *same* stream
live, so the two can be compared:

* **Cluster**: one devcluster with kwok nodes of the ``gpu-8x`` profile named and labelled
  as :func:`~scheduler.sim.topology.topology_cluster` makes them (``b{i}-r{j}-n{k}``,
  ``example.com/block``, ``example.com/rack``), and a LatticeScheduler whose
  ``spec.topology.levels`` are the simulator's :data:`~scheduler.sim.topology.LEVELS`
  (``spec.gang.solver: CPSAT``, the time limit of ``--solver-time-limit``).
* **Stream**: :func:`~scheduler.sim.topology.topology_stream` with ``--mean-run`` seconds
  of mean run time (time-compressed: the arrivals follow from the offered load), each gang
  one PodGroup (``minMember`` = its members) with the annotations its
  :class:`~scheduler.model.gang.GangSpec` implies (:func:`podgroup_body`) and its members
  (``bench-gang``'s pod body: GPUs decide). A gang is deleted its run time after the watch
  saw it admitted, or ``--patience`` (default the mean run time, as the simulator) after
  its creation if it was not.
* **Figures** (:func:`live_result`, as the simulator's :class:`PolicyResult`): gangs
  admitted / arrived; GPUs allocated, averaged over time from the first arrival to the
  last (each member from its binding until the watch saw it gone); for preferred gangs,
  domains of the preferred level spanned against the simulator's
  :func:`~scheduler.sim.topology.fewest_domains` over the free GPUs at the moment the
  gang's first member was bound (every other member bound before then and not yet gone);
  waits from the last member's creation to the last binding.
* **Checks** (:func:`placement_violations`), read from the API server right after each
  admission: every required gang's members on nodes of one domain (the Node objects'
  labels), every slice (the pods' ``lattice.dev/topology-slice`` annotation) whole and in
  one domain of its level. Any violation exits 1.
* **Offline**: :func:`~scheduler.sim.topology.replay_policy` of the same stream, Lattice
  policy, same patience, printed beside the live row in the simulator's columns.

Run: ``just bench-topology`` (or ``python -m lattice_dev.benchmarks.topology --help``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from lattice_dev.benchmarks.common import apply_crds
from lattice_dev.benchmarks.gangs import (
    KUBE_SCHEDULER,
    LATTICE,
    LS_GROUP,
    LS_PLURAL,
    LS_VERSION,
    PG_GROUP,
    PG_PLURAL,
    PG_VERSION,
    GangBench,
    GangWindow,
    PodRecord,
    PodWatch,
    gang_outcome,
    gang_spec,
    pod_body,
    podgroup_body,
)
from lattice_dev.devcluster.build import kubernetes_version
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client, create_nodes, node_is_ready, poll
from lattice_dev.devcluster.profiles import get_profile
from scheduler.model.gang import (
    POD_GROUP_LABEL,
    TOPOLOGY_PREFERRED_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
    TOPOLOGY_SLICE_ANNOTATION,
    TOPOLOGY_SLICE_REQUIRED_ANNOTATION,
    TOPOLOGY_SLICE_SIZE_ANNOTATION,
)
from scheduler.model.workload import UPSTREAM_GROUP, UPSTREAM_PLURAL, UPSTREAM_VERSION
from scheduler.sim.topology import (
    GREEDY as SIM_GREEDY,
)
from scheduler.sim.topology import (
    KUBE_TAS as SIM_KUBE_TAS,
)
from scheduler.sim.topology import (
    LATTICE as SIM_LATTICE,
)
from scheduler.sim.topology import (
    LEVELS,
    Gang,
    Layout,
    PolicyResult,
    SeedRun,
    Shape,
    fewest_domains,
    format_rows,
    replay_policy,
    topology_cluster,
    topology_stream,
)

NODE_PROFILE = "gpu-8x"
LIVE = "Lattice live"
OFFLINE = "Lattice offline"
ARMS = ("lattice", "greedy", "kube")
"""Live arms: Lattice with CP-SAT, Lattice greedy-only, kube-scheduler 1.37 with
``GenericWorkload`` and ``TopologyAwareWorkloadScheduling`` on (the upstream PodGroup)."""
ARM_ROWS = {"lattice": LIVE, "greedy": "Greedy live", "kube": "KubeTAS live"}
OFFLINE_ROWS = {
    "lattice": (SIM_LATTICE, OFFLINE),
    "greedy": (SIM_GREEDY, "Greedy offline"),
    "kube": (SIM_KUBE_TAS, "KubeTAS offline"),
}
KUBE_GATES = ("GenericWorkload=true", "TopologyAwareWorkloadScheduling=true")
KUBE_RUNTIME_CONFIG = ("scheduling.k8s.io/v1beta1=true",)


# --- bodies (pure) -------------------------------------------------------------------------


def node_bodies(shape: Shape) -> list[dict[str, Any]]:
    """The simulator's cluster as kwok Node bodies: its names and topology labels on the
    ``gpu-8x`` profile (whose GPU count must be the shape's)."""
    profile = get_profile(NODE_PROFILE)
    out = []
    for i, node in enumerate(topology_cluster(shape)):
        body = profile.node_body(node.name, i)
        gpus = int(body["status"]["allocatable"]["nvidia.com/gpu"])
        if gpus != shape.gpus:
            raise ValueError(f"{NODE_PROFILE} nodes have {gpus} GPUs, the shape asks {shape.gpus}")
        body["metadata"]["labels"] |= {k: node.labels[k] for k in LEVELS}
        out.append(body)
    return out


def gang_annotations(gang: Gang) -> dict[str, str]:
    """The PodGroup annotations the simulator's GangSpec stands for (docs/gangs.md)."""
    spec = gang.spec
    out: dict[str, str] = {}
    if spec.topology_key is not None:
        out[TOPOLOGY_REQUIRED_ANNOTATION] = spec.topology_key
    if spec.topology_preferred is not None:
        out[TOPOLOGY_PREFERRED_ANNOTATION] = spec.topology_preferred
    if spec.slice_size is not None and spec.slice_key is not None:
        out[TOPOLOGY_SLICE_SIZE_ANNOTATION] = str(spec.slice_size)
        out[TOPOLOGY_SLICE_REQUIRED_ANNOTATION] = spec.slice_key
    return out


def gang_podgroup(gang: Gang, timeout_s: int) -> dict[str, Any]:
    body = podgroup_body(gang.name, gang.members, timeout_s)
    body["metadata"]["annotations"] = gang_annotations(gang)
    return body


def member_bodies(gang: Gang, arm: str = "lattice") -> list[dict[str, Any]]:
    """The gang's pods, named as the simulator names them: on Lattice, or (``kube``) on
    kube-scheduler, naming their upstream PodGroup in ``spec.schedulingGroup`` (the
    scheduler-plugins label stays for the benchmark's own listing; kube ignores it)."""
    if arm != "kube":
        return [pod_body(p.name, gang.gpus, LATTICE, gang.name) for p in gang.pods]
    out = []
    for p in gang.pods:
        body = pod_body(p.name, gang.gpus, KUBE_SCHEDULER, gang.name)
        body["spec"]["schedulingGroup"] = {"podGroupName": gang.name}
        out.append(body)
    return out


def kube_key(gang: Gang) -> str | None:
    """The one required key kube-scheduler 1.37 takes: the gang's required level, else
    its slice level (the only way one key keeps every slice in one domain, as the
    simulator's KubeTAS); a preference cannot be expressed."""
    return gang.spec.topology_key or gang.spec.slice_key


def upstream_podgroup(gang: Gang) -> dict[str, Any]:
    """``scheduling.k8s.io/v1beta1`` PodGroup for the kube arm: all members, one key."""
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": gang.members}}}
    key = kube_key(gang)
    if key is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    return {
        "apiVersion": f"{UPSTREAM_GROUP}/{UPSTREAM_VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": gang.name},
        "spec": spec,
    }


def scheduler_body(time_limit_s: float) -> dict[str, Any]:
    return {
        "apiVersion": f"{LS_GROUP}/{LS_VERSION}",
        "kind": "LatticeScheduler",
        "metadata": {"name": LATTICE},
        "spec": {
            "schedulerName": LATTICE,
            "gang": {"solver": "CPSAT", "solverTimeLimitSeconds": time_limit_s},
            "topology": {"levels": list(LEVELS)},
        },
    }


# --- checks and figures (pure) -------------------------------------------------------------

Member = tuple[str, str | None]
"""(node name, ``lattice.dev/topology-slice`` annotation) of one bound member."""


def placement_violations(
    gang: Gang,
    members: Sequence[Member],
    labels: Mapping[str, Mapping[str, str]],
    *,
    arm: str = "lattice",
) -> list[str]:
    """What breaks the gang's required level or its slices, from its bound members and the
    nodes' labels (``labels[node][key]``); empty when nothing does. The kube arm is held
    to the one key it was given (:func:`kube_key`), and writes no slices."""
    out: list[str] = []
    if len(members) != gang.members:
        out.append(f"{gang.name}: {len(members)} members bound, {gang.members} expected")
    key = kube_key(gang) if arm == "kube" else gang.spec.topology_key
    if key is not None:
        domains = {labels.get(n, {}).get(key) for n, _ in members}
        if len(domains) != 1 or None in domains:
            out.append(f"{gang.name}: required {key}, members in {sorted(map(str, domains))}")
    size, level = gang.spec.slice_size, gang.spec.slice_key
    if size is not None and level is not None and arm != "kube":
        slices: dict[str | None, list[str]] = {}
        for node, s in members:
            slices.setdefault(s, []).append(node)
        if None in slices:
            out.append(f"{gang.name}: {len(slices[None])} members without a slice annotation")
        for s, nodes in sorted(slices.items(), key=lambda kv: str(kv[0])):
            if s is None:
                continue
            domains = {labels.get(n, {}).get(level) for n in nodes}
            if len(nodes) != size:
                out.append(f"{gang.name}: slice {s} has {len(nodes)} members, not {size}")
            if len(domains) != 1 or None in domains:
                out.append(f"{gang.name}: slice {s} in {level}s {sorted(map(str, domains))}")
    return out


def allocated_mean(records: Sequence[PodRecord], start: float, end: float) -> float:
    """GPUs held, averaged over ``[start, end]``: each pod from its binding until it is gone
    (or deleted, if the watch never saw it go)."""
    if end <= start:
        return 0.0
    area = 0.0
    for r in records:
        if r.bound is None or r.node is None:
            continue
        stop = r.gone if r.gone is not None else r.deleted
        lo, hi = max(r.bound, start), min(end if stop is None else stop, end)
        if hi > lo:
            area += r.gpus * (hi - lo)
    return area / (end - start)


def free_before(
    layout: Layout,
    node_gpus: Mapping[str, int],
    records: Sequence[PodRecord],
    gang: str,
    at: float,
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Free GPUs per node (layout order) just before ``at``: other gangs' members bound
    before it and not gone by then."""
    used = dict.fromkeys(layout.names, 0)
    for r in records:
        if r.gang == gang or r.node not in used or r.bound is None or r.bound >= at:
            continue
        if r.holds_at(at):
            used[r.node] += r.gpus
    return np.array([max(node_gpus[n] - used[n], 0) for n in layout.names], dtype=np.int64)


def live_result(
    stream: Sequence[Gang],
    records: Mapping[str, PodRecord],
    windows: Mapping[str, GangWindow],
    layout: Layout,
    node_gpus: Mapping[str, int],
    *,
    horizon: float,
    seconds: float,
    policy: str = LIVE,
) -> PolicyResult:
    """The live run's figures in the simulator's record (module docstring)."""
    result = PolicyResult(policy, gangs=len(stream), seconds=seconds)
    everything = list(records.values())
    index = {n: i for i, n in enumerate(layout.names)}
    for gang in stream:
        result.arrived_by_kind[gang.kind] += 1
        outcome = gang_outcome(windows[gang.name], records, horizon)
        if not outcome.admitted:
            result.given_up += 1
            continue
        result.admitted += 1
        result.admitted_by_kind[gang.kind] += 1
        if outcome.time_to_admit_s is not None:
            result.waits.append(outcome.time_to_admit_s)
        mine = [records[p.name] for p in gang.pods]
        if gang.preferred is None:
            continue
        first = min(cast(float, r.bound) for r in mine)
        free = free_before(layout, node_gpus, everything, gang.name, first)
        fewest = fewest_domains(layout, free, gang)
        dom = layout.levels[layout.level(gang.preferred)]
        spanned = len({int(dom[index[cast(str, r.node)]]) for r in mine})
        if fewest is not None:
            result.spans.append((spanned, fewest))
    if stream:
        total = sum(node_gpus.values())
        mean = allocated_mean(everything, stream[0].created, stream[-1].created)
        result.allocated_pct_time = 100 * mean / total if total else math.nan
    return result


def by_kind_lines(results: Sequence[PolicyResult]) -> list[str]:
    out = []
    for r in results:
        parts = [f"{k} {r.admitted_by_kind[k]}/{n}" for k, n in r.arrived_by_kind.items() if n]
        out.append(f"  {r.policy}: " + ", ".join(parts))
    return out


# --- the cluster side ----------------------------------------------------------------------


class TopologyBench(GangBench):
    """The live run: one namespace, Lattice with the simulator's levels, the stream's gangs
    each created, waited for, run and deleted (``bench-gang``'s pacing and deletes)."""

    def __init__(
        self,
        cluster: DevCluster,
        api: client.ApiClient,
        stream: Sequence[Gang],
        node_labels: Mapping[str, Mapping[str, str]],
        node_gpus: Mapping[str, int],
        args: argparse.Namespace,
        arm: str = "lattice",
    ) -> None:
        super().__init__(cluster, api, [], node_gpus, args)
        self.gangs = list(stream)
        self.labels = node_labels
        self.arm = arm
        self.placed: dict[str, list[Member]] = {}
        self.errors: list[str] = []

    async def run(self, ns: str) -> tuple[dict[str, PodRecord], dict[str, GangWindow], float]:
        await self.core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
        if self.arm == "kube":
            await self._start_scheduler("kube", 0)
        else:
            body = scheduler_body(self.args.solver_time_limit)
            body["spec"]["gang"] = gang_spec(
                "greedy" if self.arm == "greedy" else "cpsat", self.args.solver_time_limit
            )
            with contextlib.suppress(ApiException):  # one object across the Lattice arms
                await self.objects.create_cluster_custom_object(
                    LS_GROUP, LS_VERSION, LS_PLURAL, body
                )
            await self._start_scheduler(
                "greedy" if self.arm == "greedy" else "cpsat", self._log_size()
            )
        records = {
            p.name: PodRecord(p.name, g.gpus, gang=g.name) for g in self.gangs for p in g.pods
        }
        windows = {g.name: GangWindow(g.name, tuple(p.name for p in g.pods)) for g in self.gangs}
        t0 = time.monotonic() + 1.0
        watch = PodWatch(self.api, ns, records, t0)
        watch.start()
        await watch.started.wait()
        lags: list[float] = []
        tasks = [
            asyncio.create_task(self._run_gang(ns, g, t0, records, windows[g.name], lags))
            for g in self.gangs
        ]
        last = self.gangs[-1].created if self.gangs else 0.0
        horizon = last + self.args.patience + 2.0
        await asyncio.wait(tasks, timeout=max(t0 + horizon - time.monotonic(), 0.0))
        ended = time.monotonic() - t0
        for task in tasks:
            task.cancel()
        for exc in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(exc, Exception):
                self.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[:1]}")
        component = "kube-scheduler" if self.arm == "kube" else LATTICE
        if not self.cluster.running().get(component, False):
            self.errors.append(f"{component} was not running at the end of the run")
        self.cluster.stop_component(component)
        await watch.stop()
        await self._clear(ns)
        if lags and max(lags) > 1.0:
            self.errors.append(f"pacing lag up to {max(lags):.1f} s")
        return records, windows, ended

    async def _run_gang(
        self,
        ns: str,
        gang: Gang,
        t0: float,
        records: Mapping[str, PodRecord],
        window: GangWindow,
        lags: list[float],
    ) -> None:
        await self._sleep_until(t0, gang.created, lags)
        recs = [records[p.name] for p in gang.pods]
        try:
            if self.arm == "kube":
                await self.objects.create_namespaced_custom_object(
                    UPSTREAM_GROUP, UPSTREAM_VERSION, ns, UPSTREAM_PLURAL, upstream_podgroup(gang)
                )
            else:
                await self.objects.create_namespaced_custom_object(
                    PG_GROUP,
                    PG_VERSION,
                    ns,
                    PG_PLURAL,
                    gang_podgroup(gang, math.ceil(self.args.patience)),
                )
            await asyncio.gather(
                *(
                    self._create_pod(ns, body, r, t0)
                    for body, r in zip(member_bodies(gang, self.arm), recs, strict=True)
                )
            )
            window.opened = max(cast(float, r.created) for r in recs)
            until = t0 + window.opened + self.args.patience
            if await self._wait_bound(recs, until):
                pods = await self.core.list_namespaced_pod(
                    ns, label_selector=f"{POD_GROUP_LABEL}={gang.name}"
                )
                self.placed[gang.name] = [
                    (
                        p.spec.node_name,
                        (p.metadata.annotations or {}).get(TOPOLOGY_SLICE_ANNOTATION),
                    )
                    for p in pods.items
                    if p.spec.node_name
                ]
                await asyncio.sleep(gang.run)
        finally:
            if window.opened is not None:
                window.closed = time.monotonic() - t0
            await asyncio.shield(self._delete_gang(ns, gang.name, recs, t0))

    async def _delete_gang(self, ns: str, name: str, recs: Sequence[PodRecord], t0: float) -> None:
        if self.arm == "kube":
            with contextlib.suppress(ApiException):
                await self.objects.delete_namespaced_custom_object(
                    UPSTREAM_GROUP, UPSTREAM_VERSION, ns, UPSTREAM_PLURAL, name
                )
            await asyncio.gather(*(self._delete_pod(ns, r, t0) for r in recs))
            return
        await super()._delete_gang(ns, name, recs, t0)


async def _nodes_ready(api: client.ApiClient, bodies: list[dict[str, Any]]) -> None:
    await create_nodes(api, bodies)
    core = client.CoreV1Api(api)
    names = {b["metadata"]["name"] for b in bodies}

    async def ready() -> bool:
        nodes = [n for n in (await core.list_node()).items if n.metadata.name in names]
        return len(nodes) == len(names) and all(node_is_ready(n) for n in nodes)

    await poll(ready, within=300, interval=0.5)


Placed = dict[str, list[Member]]


async def _live(
    cluster: DevCluster, shape: Shape, stream: Sequence[Gang], args: argparse.Namespace
) -> list[tuple[str, PolicyResult, list[str], Placed]]:
    """Per arm, one after another on the same nodes (each in a namespace of its own, the
    fleet emptied between them): its figures, its violations and the admitted gangs'
    members as read."""
    out = []
    async with api_client(cluster.kubeconfig) as api:
        await _nodes_ready(api, node_bodies(shape))
        core = client.CoreV1Api(api)
        nodes = (await core.list_node()).items  # the checks read the labels from the API
        labels = {n.metadata.name: dict(n.metadata.labels or {}) for n in nodes}
        node_gpus = {
            n.metadata.name: int((n.status.allocatable or {}).get("nvidia.com/gpu", "0"))
            for n in nodes
            if n.metadata.name in set(Layout.of(topology_cluster(shape)).names)
        }
        layout = Layout.of(topology_cluster(shape))
        for arm in args.arms:
            print(f"arm {arm}: {ARM_ROWS[arm]}", flush=True)
            bench = TopologyBench(cluster, api, stream, labels, node_gpus, args, arm)
            started = time.monotonic()
            records, windows, horizon = await bench.run(f"bench-topology-{arm}")
            seconds = time.monotonic() - started
            result = live_result(
                stream,
                records,
                windows,
                layout,
                node_gpus,
                horizon=horizon,
                seconds=seconds,
                policy=ARM_ROWS[arm],
            )
            violations = [
                v
                for g in stream
                if g.name in bench.placed
                for v in placement_violations(g, bench.placed[g.name], labels, arm=arm)
            ]
            for e in bench.errors:
                print(f"  ({arm}, benchmark side: {e})", flush=True)
            out.append((arm, result, violations, bench.placed))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topology", default="2x4x4x8", help="BLOCKSxRACKSxNODESxGPUS")
    parser.add_argument("--gangs", type=int, default=40, help="gangs in the stream")
    parser.add_argument("--load", type=float, default=1.2, help="offered GPU load")
    parser.add_argument("--mean-run", type=float, default=20.0, help="mean run time, s")
    parser.add_argument(
        "--patience",
        type=float,
        default=None,
        help="s before an unadmitted gang is given up "
        "(default: the stream's mean run time, as the simulator)",
    )
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--solver-time-limit", type=float, default=1.0, help="CP-SAT budget, s")
    parser.add_argument("--no-offline", action="store_true", help="skip the simulator's rows")
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=ARMS,
        default=["lattice", "kube"],
        help="live arms, run one after another on the same nodes (kube: kube-scheduler "
        "1.37 with GenericWorkload and TopologyAwareWorkloadScheduling on, the upstream "
        "PodGroup with one required key)",
    )
    args = parser.parse_args(argv)
    args.score_all = False  # kube-scheduler as its users run it (bench-gang's default)
    shape = Shape.parse(args.topology)
    stream = topology_stream(
        shape, gangs=args.gangs, load=args.load, seed=args.seed, mean_run=args.mean_run
    )
    if args.patience is None:
        args.patience = float(np.mean([g.run for g in stream]))
    kinds = Counter(g.kind for g in stream)
    print(
        f"topology {shape} ({shape.blocks * shape.racks * shape.nodes} kwok nodes, "
        f"{shape.total_gpus} GPUs); seed {args.seed}; {len(stream)} gangs "
        f"({', '.join(f'{k} {n}' for k, n in kinds.items())}) arriving over "
        f"{stream[-1].created:.0f} s at load {args.load:g}; mean run {args.mean_run:g} s; "
        f"patience {args.patience:.1f} s; solver time limit {args.solver_time_limit:g} s",
        flush=True,
    )
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="lattice-bench-topology-"))
    cluster = DevCluster(scratch / "state")
    kube = "kube" in args.arms
    if kube and kubernetes_version() < "v1.37":
        parser.error("the kube arm needs Kubernetes 1.37 (the upstream PodGroup's topology)")
    try:
        state = cluster.up(
            ClusterConfig(
                nodes=0,
                node_profile=NODE_PROFILE,
                node_ready_timeout=600,
                feature_gates=KUBE_GATES if kube else (),
                runtime_config=KUBE_RUNTIME_CONFIG if kube else (),
            )
        )
        apply_crds(cluster, state)
        print(f"control plane ready in {time.monotonic() - started:.0f}s", flush=True)
        arms = asyncio.run(_live(cluster, shape, stream, args))
    finally:
        cluster.down()
        shutil.rmtree(scratch, ignore_errors=True)
    results = [result for _, result, _, _ in arms]
    if not args.no_offline:
        for arm in args.arms:
            policy, row = OFFLINE_ROWS[arm]
            offline = replay_policy(
                topology_cluster(shape),
                stream,
                policy,
                patience=args.patience,
                seed=args.seed,
                time_limit_s=args.solver_time_limit,
            )
            offline.policy = row
            results.append(offline)
    print()
    print(format_rows([SeedRun(args.seed, len(stream), tuple(results))]))
    print("admitted per kind:")
    print("\n".join(by_kind_lines(results)))
    failed = False
    for arm, _, violations, placed in arms:
        required = sum(1 for g in stream if g.name in placed and g.spec.topology_key)
        sliced = sum(1 for g in stream if g.name in placed and g.spec.slice_size)
        print(
            f"{arm}: placement check, read from the API objects at each admission "
            f"({len(placed)} admitted gangs, {required} required-rack, {sliced} sliced): "
            f"{len(violations)} violations"
        )
        for v in violations:
            print(f"  {v}")
        failed = failed or bool(violations)
    print(f"(total {time.monotonic() - started:.0f}s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
