"""`just bench-dra`: Dynamic Resource Allocation at scale, Lattice against kube-scheduler.

Every node is a kwok node with two ResourceSlices of its own, one per driver (our own
NVIDIA-like names, :data:`GPU_DRIVER` and :data:`NIC_DRIVER`): 8 GPUs with productName,
architecture, cudaComputeCapability (a version), uuid, ``resource.kubernetes.io/pcieRoot``
(2 roots of 4 GPUs) and a memory capacity; 2 NICs, one per root, with the same pcieRoot
attribute. DeviceClasses ``gpu`` and ``nic`` select the drivers. Each arm's namespace has
ResourceClaimTemplates for 1, 2, 4 and 8 GPUs and, for the constrained pods, for 1, 2 and
4 GPUs plus a NIC under ``matchAttribute: resource.kubernetes.io/pcieRoot`` (a root has 4
GPUs). The pods (a seeded draw: half constrained, sizes uniform) name a template in
``spec.resourceClaims``; kube-controller-manager creates their claims.

Arms run one after another on one control plane, each on a fresh set of nodes and slices
of its own (labelled with the arm, and the pods select that label), created before its
clock starts and deleted with its pods afterwards, so no arm sees another's devices or
allocations: kube-scheduler (already running, pods with the default schedulerName) and
Lattice (``lattice run`` started for the arm, pods with schedulerName ``lattice``); the
order alternates between repeats. The clock runs from the first pod created until every
pod is bound, or no binding came for ``--settle`` s and every unbound pod was reported
Unschedulable, or ``--arm-timeout``.

Printed per arm: pods bound, pods/s (bound over first create to last binding), the
scheduler's CPU ms per bound pod (user + system of its process over the same span), claims
allocated (``status.allocation`` written), GPUs stranded (free GPUs on pcieRoots with at
least one GPU allocated) and whole free nodes; then Lattice / kube-scheduler per repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import aiohttp
from kubernetes_asyncio import client

from lattice_dev.benchmarks.common import Watcher, apply_crds, create_pods, start_lattice
from lattice_dev.benchmarks.common import wait_lattice_ready as _wait_ready
from lattice_dev.benchmarks.frag import unschedulable
from lattice_dev.benchmarks.scheduling import cpu_seconds, ratio
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client
from lattice_dev.devcluster.profiles import get_profile

KUBE, LATTICE = "kube-scheduler", "lattice"
SCHEDULER_NAMES: Final = {KUBE: "default-scheduler", LATTICE: "lattice"}
GPU_DRIVER: Final = "gpu.bench.lattice.dev"
NIC_DRIVER: Final = "nic.bench.lattice.dev"
PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
GPUS_PER_NODE: Final = 8
ROOTS_PER_NODE: Final = 2
GPU_SIZES: Final = (1, 2, 4, 8)
CONSTRAINED_SIZES: Final = (1, 2, 4)
"""GPUs of a pod whose GPUs and NIC share one pcieRoot (a root has 4 GPUs)."""
ARM_LABEL: Final = "bench.lattice.dev/dra-arm"
RESOURCE: Final = ("resource.k8s.io", "v1")
LS: Final = ("lattice.dev", "v1alpha1", "latticeschedulers")
PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10"


# -- the objects: pure -------------------------------------------------------------


def root_name(root: int) -> str:
    return f"pci0000:{root:02x}"


def gpu_root(index: int) -> int:
    """The pcieRoot of a node's ``index``-th GPU: GPUs 0-3 on root 0, 4-7 on root 1."""
    return index // (GPUS_PER_NODE // ROOTS_PER_NODE)


def _slice(node: str, driver: str, kind: str, devices: list[dict[str, Any]], arm: str) -> Any:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{kind}", "labels": {ARM_LABEL: arm}},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def gpu_slice(node: str, arm: str) -> dict[str, Any]:
    """The node's GPUs: H100-like attributes, 2 pcieRoots x 4 GPUs, 80Gi memory each."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "architecture": {"string": "Hopper"},
                "cudaComputeCapability": {"version": "9.0.0"},
                "driverVersion": {"version": "550.54.15"},
                "uuid": {"string": f"GPU-{node}-{i}"},
                "index": {"int": i},
                PCIE_ROOT: {"string": root_name(gpu_root(i))},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(GPUS_PER_NODE)
    ]
    return cast(dict[str, Any], _slice(node, GPU_DRIVER, "gpu", devices, arm))


def nic_slice(node: str, arm: str) -> dict[str, Any]:
    """The node's NICs: one per pcieRoot."""
    devices = [
        {
            "name": f"nic-{r}",
            "attributes": {
                "productName": {"string": "ConnectX-7"},
                "linkSpeedGbps": {"int": 400},
                PCIE_ROOT: {"string": root_name(r)},
            },
        }
        for r in range(ROOTS_PER_NODE)
    ]
    return cast(dict[str, Any], _slice(node, NIC_DRIVER, "nic", devices, arm))


def device_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
        for name, driver in (("gpu", GPU_DRIVER), ("nic", NIC_DRIVER))
    ]


def template_name(gpus: int, constrained: bool) -> str:
    return f"gpu-{gpus}" + ("-nic" if constrained else "")


def claim_template(gpus: int, constrained: bool) -> dict[str, Any]:
    """``gpus`` GPUs; constrained: plus one NIC, all on one pcieRoot."""
    requests: list[dict[str, Any]] = [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": gpus}}
    ]
    devices: dict[str, Any] = {"requests": requests}
    if constrained:
        if gpus > GPUS_PER_NODE // ROOTS_PER_NODE:
            raise ValueError(f"a pcieRoot has {GPUS_PER_NODE // ROOTS_PER_NODE} GPUs, not {gpus}")
        requests.append({"name": "nic", "exactly": {"deviceClassName": "nic"}})
        devices["constraints"] = [{"requests": ["gpu", "nic"], "matchAttribute": PCIE_ROOT}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(gpus, constrained)},
        "spec": {"spec": {"devices": devices}},
    }


def claim_templates() -> list[dict[str, Any]]:
    return [claim_template(g, False) for g in GPU_SIZES] + [
        claim_template(g, True) for g in CONSTRAINED_SIZES
    ]


@dataclass(frozen=True)
class PodShape:
    gpus: int
    constrained: bool

    @property
    def template(self) -> str:
        return template_name(self.gpus, self.constrained)


def workload(pods: int, seed: int) -> list[PodShape]:
    """``pods`` shapes, seeded: exactly half (rounded down) constrained, in shuffled order;
    sizes uniform over :data:`GPU_SIZES` (constrained: :data:`CONSTRAINED_SIZES`)."""
    rng = random.Random(seed)
    half = pods // 2
    shapes = [PodShape(rng.choice(CONSTRAINED_SIZES), True) for _ in range(half)]
    shapes += [PodShape(rng.choice(GPU_SIZES), False) for _ in range(pods - half)]
    rng.shuffle(shapes)
    return shapes


def pod_body(name: str, shape: PodShape, scheduler: str, arm: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {ARM_LABEL: arm},
            "containers": [
                {
                    "name": "c",
                    "image": PAUSE_IMAGE,
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "claims": [{"name": "devices"}],
                    },
                }
            ],
            "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": shape.template}],
        },
    }


def node_names(arm: str, nodes: int) -> list[str]:
    return [f"dra-{arm}-{i:04d}" for i in range(nodes)]


def kwok_node(name: str, index: int, arm: str) -> dict[str, Any]:
    body = get_profile("standard").node_body(name, index)
    body["metadata"]["labels"][ARM_LABEL] = arm
    return body


# -- the figures: pure -------------------------------------------------------------


Device = tuple[str, str, str]
"""(driver, pool, device) as an allocation result names it."""


def allocated_devices(claims: Iterable[dict[str, Any]]) -> tuple[int, set[Device]]:
    """The claims with ``status.allocation`` and every device their results name."""
    count, devices = 0, set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            continue
        count += 1
        for r in (allocation.get("devices") or {}).get("results") or []:
            devices.add((str(r["driver"]), str(r["pool"]), str(r["device"])))
    return count, devices


@dataclass(frozen=True)
class Leftover:
    stranded_gpus: int
    """Free GPUs on pcieRoots with at least one GPU allocated."""
    partly_used_roots: int
    free_nodes: int
    """Nodes with no GPU allocated."""
    free_gpus: int


def leftover(nodes: Sequence[str], used: set[Device]) -> Leftover:
    """What the allocations leave on ``nodes`` (each a pool of :func:`gpu_slice`)."""
    stranded = partly = free_nodes = free = 0
    per_root = GPUS_PER_NODE // ROOTS_PER_NODE
    for node in nodes:
        node_used = 0
        for root in range(ROOTS_PER_NODE):
            taken = sum(
                (GPU_DRIVER, node, f"gpu-{i}") in used
                for i in range(root * per_root, (root + 1) * per_root)
            )
            node_used += taken
            if 0 < taken < per_root:
                partly += 1
                stranded += per_root - taken
        free += GPUS_PER_NODE - node_used
        free_nodes += node_used == 0
    return Leftover(stranded, partly, free_nodes, free)


@dataclass
class ArmResult:
    arm: str
    run: int
    pods: int
    bound: int
    seconds: float
    cpu_s: float
    claims_allocated: int
    left: Leftover
    unresolved: int = 0
    """Pods neither bound nor reported Unschedulable when the arm ended."""
    failed_events: int = 0
    """FailedScheduling events of the arm's pods (``count`` summed): failed attempts, as
    the scheduler reported them (a pod tried before its claim exists is one)."""
    timed_out: bool = False

    @property
    def pods_per_s(self) -> float:
        return self.bound / self.seconds if self.seconds > 0 else float("nan")

    @property
    def cpu_ms_per_pod(self) -> float:
        return 1000 * self.cpu_s / self.bound if self.bound else float("nan")


def _f(v: float, fmt: str) -> str:
    return "n/a" if v != v else format(v, fmt)


def report(results: Sequence[ArmResult], nodes: int) -> list[str]:
    lines = [
        f"{'run':>3} {'scheduler':<15} {'bound':>11} {'pods/s':>7} {'CPU ms/pod':>10} "
        f"{'claims alloc':>12} {'stranded GPUs':>13} {'partly roots':>12} "
        f"{'free nodes':>10} {'free GPUs':>9} {'FailedSched':>11}"
    ]
    for r in results:
        note = (f"  ({r.unresolved} pods unresolved)" if r.unresolved else "") + (
            "  (arm timed out)" if r.timed_out else ""
        )
        lines.append(
            f"{r.run:>3} {r.arm:<15} {f'{r.bound}/{r.pods}':>11} {_f(r.pods_per_s, '.1f'):>7} "
            f"{_f(r.cpu_ms_per_pod, '.2f'):>10} {r.claims_allocated:>12} "
            f"{r.left.stranded_gpus:>13} {r.left.partly_used_roots:>12} "
            f"{f'{r.left.free_nodes}/{nodes}':>10} {r.left.free_gpus:>9} "
            f"{r.failed_events:>11}" + note
        )
    by = {(r.run, r.arm): r for r in results}
    for run in sorted({r.run for r in results}):
        k, lat = by.get((run, KUBE)), by.get((run, LATTICE))
        if k is None or lat is None:
            continue
        lines.append(
            f"run {run} L/K: pods/s {_f(ratio(lat.pods_per_s, k.pods_per_s), '.2f')}x, "
            f"CPU/pod {_f(ratio(lat.cpu_ms_per_pod, k.cpu_ms_per_pod), '.2f')}x, "
            f"claims {lat.claims_allocated - k.claims_allocated:+d}, "
            f"stranded GPUs {lat.left.stranded_gpus - k.left.stranded_gpus:+d}, "
            f"free nodes {lat.left.free_nodes - k.left.free_nodes:+d}"
        )
    return lines


# -- running -----------------------------------------------------------------------


async def _create_all(
    objects: client.CustomObjectsApi, plural: str, bodies: list[dict[str, Any]], ns: str = ""
) -> None:
    sem = asyncio.Semaphore(32)

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            try:
                if ns:
                    await objects.create_namespaced_custom_object(*RESOURCE, ns, plural, body)
                else:
                    await objects.create_cluster_custom_object(*RESOURCE, plural, body)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise

    await asyncio.gather(*(one(b) for b in bodies))


async def _list_claims(objects: client.CustomObjectsApi, ns: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    token = ""
    while True:
        page: dict[str, Any] = {"_continue": token} if token else {}
        raw: Any = await objects.list_namespaced_custom_object(
            *RESOURCE, ns, "resourceclaims", limit=500, _preload_content=False, **page
        )
        body = json.loads(await raw.read())
        out += body.get("items") or []
        token = (body.get("metadata") or {}).get("continue") or ""
        if not token:
            return out


async def _unresolved(core: client.CoreV1Api, ns: str) -> int:
    resp: Any = await core.list_namespaced_pod(ns, _preload_content=False)
    items = json.loads(await resp.read()).get("items") or []
    return sum(
        1 for p in items if not (p.get("spec") or {}).get("nodeName") and not unschedulable(p)
    )


async def _failed_events(core: client.CoreV1Api, ns: str) -> int:
    resp: Any = await core.list_namespaced_event(
        ns, field_selector="reason=FailedScheduling", _preload_content=False
    )
    items = json.loads(await resp.read()).get("items") or []
    return sum(int(e.get("count") or 1) for e in items)


async def _teardown(api: client.ApiClient, ns: str, arm: str) -> None:
    """The arm's pods (forced, until none is left), namespace, slices and nodes."""
    core = client.CoreV1Api(api)
    objects = client.CustomObjectsApi(api)
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
    selector = f"{ARM_LABEL}={arm}"
    await objects.delete_collection_cluster_custom_object(
        *RESOURCE, "resourceslices", label_selector=selector
    )
    await core.delete_collection_node(label_selector=selector)


async def run_arm(
    cluster: DevCluster, api: client.ApiClient, arm: str, run: int, args: argparse.Namespace
) -> ArmResult:
    core = client.CoreV1Api(api)
    objects = client.CustomObjectsApi(api)
    tag = f"{'k' if arm == KUBE else 'l'}{run}"
    ns = f"dra-{tag}"
    names = node_names(tag, args.nodes)
    await cluster.add_nodes([kwok_node(n, i, tag) for i, n in enumerate(names)])
    await _create_all(objects, "resourceslices", [gpu_slice(n, tag) for n in names])
    await _create_all(objects, "resourceslices", [nic_slice(n, tag) for n in names])
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
    await _create_all(objects, "resourceclaimtemplates", claim_templates(), ns)
    if arm == LATTICE:
        started = time.time()
        pid = start_lattice(cluster, args.lattice_log_level)
        await _wait_ready(objects, started)
    else:
        state = cluster.load_state()
        assert state is not None
        pid = state.pids["kube-scheduler"]
        await asyncio.sleep(2.0)  # its informers see the new slices
    watcher = Watcher(api, ns)
    watcher.start()
    await watcher.started.wait()
    shapes = workload(args.pods, args.seed)
    bodies = [pod_body(f"p-{i:05d}", s, SCHEDULER_NAMES[arm], tag) for i, s in enumerate(shapes)]
    pods = {b["metadata"]["name"] for b in bodies}
    cpu0 = cpu_seconds(pid)
    t0 = time.monotonic()
    await create_pods(core, ns, bodies)
    deadline = t0 + args.arm_timeout
    unresolved, timed_out = len(pods), True
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        if not pods - watcher.bound.keys():
            unresolved, timed_out = 0, False
            break
        last = max(watcher.bound.values(), default=t0)
        if time.monotonic() - last < args.settle:
            continue
        unresolved = await _unresolved(core, ns)
        if unresolved == 0:
            timed_out = False
            break
    cpu_s = cpu_seconds(pid) - cpu0
    bound = len(pods & watcher.bound.keys())
    last = max((watcher.bound[p] for p in pods & watcher.bound.keys()), default=t0)
    await watcher.stop()
    if arm == LATTICE:
        cluster.stop_component(LATTICE)
    claims, used = allocated_devices(await _list_claims(objects, ns))
    result = ArmResult(arm, run, len(pods), bound, last - t0, cpu_s, claims, leftover(names, used))
    result.unresolved, result.timed_out = unresolved, timed_out
    result.failed_events = await _failed_events(core, ns)
    await _teardown(api, ns, tag)
    return result


async def _bench(cluster: DevCluster, args: argparse.Namespace) -> list[ArmResult]:
    results: list[ArmResult] = []
    async with api_client(cluster.kubeconfig) as api:
        objects: Any = client.CustomObjectsApi(api)
        await _create_all(objects, "deviceclasses", device_classes())
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
        for run in range(1, args.repeat + 1):
            order = (KUBE, LATTICE) if run % 2 else (LATTICE, KUBE)
            for arm in order:
                t = time.monotonic()
                r = await run_arm(cluster, api, arm, run, args)
                print(
                    f"  run {run} {arm}: bound {r.bound}/{r.pods}, "
                    f"{_f(r.pods_per_s, '.1f')} pods/s, {_f(r.cpu_ms_per_pod, '.2f')} ms CPU/pod, "
                    f"{r.left.stranded_gpus} GPUs stranded [{time.monotonic() - t:.0f}s]",
                    flush=True,
                )
                results.append(r)
            print("\n".join(report([r for r in results if r.run == run], args.nodes)), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000, help="kwok nodes per arm")
    parser.add_argument("--pods", type=int, default=2000, help="pods per arm")
    parser.add_argument("--repeat", type=int, default=1, help="runs of both arms")
    parser.add_argument("--seed", type=int, default=0, help="the pods' sizes and order")
    parser.add_argument("--settle", type=float, default=10.0, help="s without a binding to end")
    parser.add_argument("--arm-timeout", type=float, default=1800.0)
    parser.add_argument("--lattice-log-level", default="warning")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="lattice-bench-dra-"))
    cluster = DevCluster(scratch / "state")
    started = time.monotonic()
    try:
        state = cluster.up(ClusterConfig(nodes=0, with_kube_scheduler=True, node_ready_timeout=600))
        apply_crds(cluster, state)
        results = asyncio.run(_bench(cluster, args))
    finally:
        cluster.down()
        shutil.rmtree(scratch, ignore_errors=True)
    shapes = workload(args.pods, args.seed)
    asked = sum(s.gpus for s in shapes)
    print(
        f"\n{args.nodes} kwok nodes x {GPUS_PER_NODE} GPUs + {ROOTS_PER_NODE} NICs per arm; "
        f"{args.pods} pods ({sum(s.constrained for s in shapes)} with a pcieRoot GPU+NIC "
        f"constraint) asking {asked} GPUs ({100 * asked / (GPUS_PER_NODE * args.nodes):.0f}%)"
    )
    if args.repeat > 1:  # each run's table is printed as it ends
        print("\n".join(report(results, args.nodes)))
    print(f"\n(total {time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
