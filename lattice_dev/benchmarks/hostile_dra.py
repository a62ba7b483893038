"""`just bench-hostile-dra`: plain pods' latency beside a hostile DRA pod.

Every node is a kwok node with one ResourceSlice of 16 devices. The hostile pod has two
claims of 9 devices each (a ResourceClaimTemplate whose request is a firstAvailable list of
one, which the allocator's count check leaves to the search): each alone fits a node,
together they fit none, and only the device search can tell; kube's allocator runs into
its 10 s filter timeout per node on it. Two arms on one control plane and one `lattice run` (leader
election on, as deployed): a stream of plain pods (100m cpu, ``--rate`` per second)
alone, then the same stream with the hostile pod created first and retried throughout.
Printed per arm: plain pods bound, p50/p99/max latency (create sent to bound seen by a
watch), and then how many FailedScheduling events the hostile pod got, and whether the
process logged ``leadership_lost``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final, cast

from kubernetes_asyncio import client

from lattice_dev.benchmarks.common import (
    Watcher,
    apply_crds,
    create_pods,
    precompile_lattice,
    wait_all,
)
from lattice_dev.benchmarks.common import wait_lattice_ready as _wait_ready
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client
from lattice_dev.devcluster.profiles import get_profile

DRIVER: Final = "hostile.bench.lattice.dev"
CLASS: Final = "hostile"
DEVICES: Final = 16
PER_CLAIM: Final = 9
RESOURCE: Final = ("resource.k8s.io", "v1")
LS: Final = ("lattice.dev", "v1alpha1", "latticeschedulers")


def node_body(index: int) -> dict[str, Any]:
    return get_profile("standard").node_body(f"hostile-{index:04d}", index)


def slice_body(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-devices"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"dev-{i}"} for i in range(DEVICES)],
        },
    }


def plain_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "lattice",
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
    }


def hostile_pod() -> dict[str, Any]:
    body = plain_pod("hostile")
    body["spec"]["resourceClaims"] = [
        {"name": "a", "resourceClaimTemplateName": "nine"},
        {"name": "b", "resourceClaimTemplateName": "nine"},
    ]
    return body


def template() -> dict[str, Any]:
    sub = {"name": "nine", "deviceClassName": CLASS, "count": PER_CLAIM}
    request = {"name": "dev", "firstAvailable": [sub]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "nine"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


async def _stream(
    api: client.ApiClient, ns: str, args: argparse.Namespace, hostile: bool
) -> tuple[list[float], int]:
    """(plain pods' latencies, the hostile pod's FailedScheduling events)."""
    core = client.CoreV1Api(api)
    objects = client.CustomObjectsApi(api)
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
    watcher = Watcher(api, ns)
    watcher.start()
    await watcher.started.wait()
    if hostile:
        await objects.create_namespaced_custom_object(
            *RESOURCE, ns, "resourceclaimtemplates", template()
        )
        await create_pods(core, ns, [hostile_pod()])
        await asyncio.sleep(args.lead)  # its first searches are under way
    bodies = [plain_pod(f"plain-{i:05d}") for i in range(args.plain)]
    sent = await create_pods(core, ns, bodies, rate=args.rate)
    await wait_all(watcher, set(sent), within=args.within)
    latencies = [watcher.bound[n] - t for n, t in sent.items() if n in watcher.bound]
    await watcher.stop()
    events = await core.list_namespaced_event(
        ns, field_selector="reason=FailedScheduling,involvedObject.name=hostile"
    )
    failed = sum(e.count or 1 for e in events.items)
    with contextlib.suppress(client.ApiException):
        await core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    return latencies, failed


async def _bench(cluster: DevCluster, args: argparse.Namespace) -> list[str]:
    lines: list[str] = []
    async with api_client(cluster.kubeconfig) as api:
        objects: Any = client.CustomObjectsApi(api)
        await cluster.add_nodes([node_body(i) for i in range(args.nodes)])
        device_class = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
        await objects.create_cluster_custom_object(*RESOURCE, "deviceclasses", device_class)
        sem = asyncio.Semaphore(32)

        async def one(node: int) -> None:
            async with sem:
                body = slice_body(f"hostile-{node:04d}")
                await objects.create_cluster_custom_object(*RESOURCE, "resourceslices", body)

        await asyncio.gather(*(one(i) for i in range(args.nodes)))
        spec = {"schedulerName": "lattice", "dra": {"searchBudgetSeconds": args.budget}}
        await objects.create_cluster_custom_object(
            *LS,
            {
                "apiVersion": f"{LS[0]}/{LS[1]}",
                "kind": "LatticeScheduler",
                "metadata": {"name": "lattice"},
                "spec": spec,
            },
        )
        precompile_lattice()
        started = time.time()
        cluster.start_process(
            "lattice",
            [
                sys.executable,
                "-m",
                "scheduler.cli",
                "run",
                f"--kubeconfig={cluster.kubeconfig}",
                "--lease-namespace=default",
                "--metrics-host=127.0.0.1",
                "--metrics-port=0",
                "--log-level=warning",
            ],
            marker="scheduler.cli",
        )
        await _wait_ready(objects, started)
        for arm, hostile in (("alone", False), ("hostile", True)):
            latencies, failed = await _stream(api, f"bench-{arm}", args, hostile)
            line = f"{arm:8s} plain pods bound {len(latencies)}/{args.plain}"
            if latencies:
                p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
                line += f", p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
                line += f", max {max(latencies) * 1000:.0f} ms"
            if hostile:
                line += f"; hostile pod: {failed} FailedScheduling"
            print(line, flush=True)
            lines.append(line)
    log = cluster.log("lattice").read_text(errors="replace")
    lost = log.count('"leadership_lost"')
    lines.append(f"leadership lost: {'yes' if lost else 'no'} ({lost} times)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200, help="kwok DRA nodes")
    parser.add_argument("--plain", type=int, default=300, help="plain pods per arm")
    parser.add_argument("--rate", type=float, default=20.0, help="plain pods per second")
    parser.add_argument("--budget", type=float, default=2.0, help="spec.dra.searchBudgetSeconds")
    parser.add_argument("--lead", type=float, default=3.0, help="s between hostile and stream")
    parser.add_argument("--within", type=float, default=120.0, help="s to wait for bindings")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="lattice-bench-hostile-"))
    cluster = DevCluster(scratch / "state")
    started = time.monotonic()
    try:
        state = cluster.up(ClusterConfig(nodes=0, node_ready_timeout=600))
        apply_crds(cluster, state)
        lines = asyncio.run(_bench(cluster, args))
    finally:
        cluster.down()
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"\n{args.nodes} kwok nodes x {DEVICES} devices; hostile pod: 2 claims x {PER_CLAIM}; "
        f"{args.plain} plain pods at {args.rate:g}/s per arm; budget {args.budget:g}s"
    )
    print("\n".join(lines))
    print(f"(total {time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
