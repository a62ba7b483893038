"""Lattice beside kube-scheduler on one control plane: throughput, latency, CPU, memory.

For each workload and each scheduler, on the same 1000-node kwok cluster and
with equal client QPS/burst (500/1000) and every node scored
(percentageOfNodesToScore 100 for kube-scheduler; Lattice always scores all):

* throughput: N pods are created while no scheduler runs, then the scheduler
  is started; pods/s = N / (last binding - first binding), as seen by a watch;
* latency: with the scheduler running, a stream of pods at a fixed rate;
  p50/p99 from the client's create call to the watch showing the binding;
* the scheduler process's CPU seconds and peak RSS over its whole run.

Each scheduler runs in its own namespace with its own fresh process, so the
figures are per workload. Run: `just bench` (or `python -m
scheduler.benchmarks.scheduling --help`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
from kubernetes_asyncio import client

from scheduler.benchmarks.common import Watcher, start_lattice
from scheduler.benchmarks.common import create_pods as _create
from scheduler.benchmarks.common import wait_all as _wait_all
from scheduler.devcluster.cluster import ClusterConfig, DevCluster
from scheduler.devcluster.kube import api_client

REPO = Path(__file__).resolve().parents[2]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _pod(name: str, scheduler: str, app: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
            **spec,
        },
    }


def plain(name: str, scheduler: str) -> dict[str, Any]:
    return _pod(name, scheduler, "plain")


def anti_affinity(name: str, scheduler: str) -> dict[str, Any]:
    return _pod(
        name,
        scheduler,
        "anti",
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "anti"}},
                    }
                ]
            }
        },
    )


def preferred_affinity(name: str, scheduler: str) -> dict[str, Any]:
    return _pod(
        name,
        scheduler,
        "pref",
        affinity={
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "topology.kubernetes.io/zone",
                            "labelSelector": {"matchLabels": {"app": "pref"}},
                        },
                    }
                ]
            }
        },
    )


def spread(name: str, scheduler: str) -> dict[str, Any]:
    return _pod(
        name,
        scheduler,
        "spread",
        topologySpreadConstraints=[
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}},
            },
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}},
            },
        ],
    )


WORKLOADS: dict[str, Callable[[str, str], dict[str, Any]]] = {
    "plain": plain,
    "anti-affinity": anti_affinity,
    "preferred-affinity": preferred_affinity,
    "topology-spread": spread,
}


@dataclass
class Result:
    workload: str
    scheduler: str
    pods: int
    pods_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_s: float
    rss_mib: float
    unbound: int = 0
    notes: list[str] = field(default_factory=list)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Bench:
    def __init__(self, cluster: DevCluster, nodes: int, timeout: float) -> None:
        self.cluster = cluster
        self.nodes = nodes
        self.timeout = timeout

    def start_scheduler(self, which: str) -> int:
        if which == "kube-scheduler":
            return self.cluster.start_kube_scheduler(
                ClusterConfig(
                    kube_scheduler_qps=500,
                    kube_scheduler_burst=1000,
                    percentage_of_nodes_to_score=100,
                )
            )
        return start_lattice(self.cluster)

    async def run_one(
        self, api: client.ApiClient, workload: str, which: str, n: int, stream: int, rate: float
    ) -> Result:
        core = client.CoreV1Api(api)
        ns = f"bench-{workload}-{'kube' if which == 'kube-scheduler' else 'lattice'}"
        await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
        sched_name = "default-scheduler" if which == "kube-scheduler" else "lattice"
        make = WORKLOADS[workload]
        watcher = Watcher(api, ns)
        watcher.start()
        await watcher.started.wait()
        backlog = [make(f"p-{i}", sched_name) for i in range(n)]
        await _create(core, ns, backlog)
        pid = self.start_scheduler(which)
        cpu0 = _cpu_seconds(pid)
        unbound = await _wait_all(watcher, {b["metadata"]["name"] for b in backlog}, self.timeout)
        times = sorted(
            watcher.bound[b["metadata"]["name"]]
            for b in backlog
            if b["metadata"]["name"] in watcher.bound
        )
        span = times[-1] - times[0] if len(times) > 1 else float("nan")
        pods_per_s = (len(times) - 1) / span if span and span > 0 else float("nan")
        streamed = [make(f"s-{i}", sched_name) for i in range(stream)]
        sent = await _create(core, ns, streamed, rate=rate)
        unbound += await _wait_all(watcher, set(sent), self.timeout)
        lat = np.array([watcher.bound[k] - t for k, t in sent.items() if k in watcher.bound])
        p50, p99 = (np.percentile(lat, [50, 99]) * 1000).tolist() if len(lat) else (0.0, 0.0)
        result = Result(
            workload,
            which,
            n,
            pods_per_s,
            p50,
            p99,
            _cpu_seconds(pid) - cpu0,
            _peak_rss_mib(pid),
            unbound,
        )
        await watcher.stop()
        self.cluster.stop_component("kube-scheduler" if which == "kube-scheduler" else "lattice")
        return result


def _table(results: list[Result]) -> str:
    rows = [
        (
            "workload",
            "scheduler",
            "pods",
            "pods/s",
            "p50 ms",
            "p99 ms",
            "CPU s",
            "RSS MiB",
            "unbound",
        )
    ]
    for r in results:
        rows.append(
            (
                r.workload,
                r.scheduler,
                str(r.pods),
                f"{r.pods_per_s:.1f}",
                f"{r.p50_ms:.0f}",
                f"{r.p99_ms:.0f}",
                f"{r.cpu_s:.1f}",
                f"{r.rss_mib:.0f}",
                str(r.unbound),
            )
        )
    by = {(r.workload, r.scheduler): r for r in results}
    ratios = []
    for w in dict.fromkeys(r.workload for r in results):
        k, lat = by.get((w, "kube-scheduler")), by.get((w, "lattice"))
        if k and lat and k.pods_per_s > 0:
            ratios.append(
                f"{w}: Lattice / kube-scheduler = {lat.pods_per_s / k.pods_per_s:.2f}x "
                f"pods/s, {lat.p99_ms / max(k.p99_ms, 1e-9):.2f}x p99 latency, "
                f"{lat.cpu_s / max(k.cpu_s, 1e-9):.2f}x CPU"
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(wd) for c, wd in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([*lines, "", *ratios])


async def _bench(cluster: DevCluster, args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    async with api_client(cluster.kubeconfig) as api:
        bench = Bench(cluster, args.nodes, args.timeout)
        for workload in args.workloads:
            n = args.pods if workload == "plain" else args.affinity_pods
            for which in ("kube-scheduler", "lattice"):
                r = await bench.run_one(api, workload, which, n, args.stream, args.rate)
                results.append(r)
                print(
                    f"{workload:>18} {which:>14}: {r.pods_per_s:7.1f} pods/s, "
                    f"p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms, CPU {r.cpu_s:.1f}s, "
                    f"RSS {r.rss_mib:.0f} MiB, unbound {r.unbound}",
                    flush=True,
                )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000, help="plain-pod backlog")
    parser.add_argument(
        "--affinity-pods",
        type=int,
        default=800,
        help="backlog for the affinity and spread workloads",
    )
    parser.add_argument("--stream", type=int, default=200, help="pods in the latency stream")
    parser.add_argument("--rate", type=float, default=40.0, help="latency stream, pods/s")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = parser.parse_args(argv)
    cluster = DevCluster(Path(tempfile.mkdtemp(prefix="lattice-bench-")) / "state")
    started = time.monotonic()
    try:
        state = cluster.up(ClusterConfig(nodes=args.nodes, node_ready_timeout=600))
        print(
            f"control plane with {args.nodes} kwok nodes ready in "
            f"{time.monotonic() - started:.0f}s",
            flush=True,
        )
        subprocess.run(
            [
                str(Path(state.binaries) / "kubectl"),
                f"--kubeconfig={cluster.kubeconfig}",
                "apply",
                "--server-side",
                "-f",
                str(REPO / "crds"),
            ],
            check=True,
            capture_output=True,
        )
        results = asyncio.run(_bench(cluster, args))
    finally:
        cluster.down()
    print()
    print(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
