"""`lattice demo`: the main job on an embedded default, end to end.

A local control plane with 12 fake nodes in three zones (two of them tainted
for a dedicated team, one small), `lattice run` beside it, and a sample
workload that exercises what a scheduler is for: a zone-spread web tier, a
database with hostname anti-affinity, a cache that wants to sit with the web
pods, a batch job that tolerates the dedicated nodes, a training gang
(scheduler-plugins PodGroup) placed all-or-nothing, a gang too big for the
cluster that binds nothing, and one pod that fits nowhere. It prints where
each pod went and why, and the LatticeScheduler and PodGroup objects as
`kubectl get` shows them. The cluster (and Lattice) keep running
afterwards; `lattice devcluster down` stops everything.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio import client

from lattice_dev import demo_gpu
from lattice_dev.devcluster.build import BuildError, checkout_path
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client, poll

NS = "demo"
GANG_LABEL = "scheduling.x-k8s.io/pod-group"
GANGS = (("train", 4, "6"), ("too-big", 3, "40"))
"""(PodGroup, minMember, CPU per member): the second cannot fit anywhere."""
ZONE = "topology.kubernetes.io/zone"


def _pod(name: str, app: str, cpu: str, mem: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
        "spec": {
            "schedulerName": "lattice",
            "containers": [
                {
                    "name": app,
                    "image": f"example/{app}",
                    "resources": {"requests": {"cpu": cpu, "memory": mem}},
                }
            ],
            **spec,
        },
    }


def workload() -> list[tuple[dict[str, Any], str]]:
    """(pod, why) pairs: the why is what the demo table shows next to the placement."""
    pods: list[tuple[dict[str, Any], str]] = []
    for i in range(6):
        pods.append(
            (
                _pod(
                    f"web-{i}",
                    "web",
                    "500m",
                    "512Mi",
                    topologySpreadConstraints=[
                        {
                            "maxSkew": 1,
                            "topologyKey": ZONE,
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": {"app": "web"}},
                        }
                    ],
                ),
                "spread over zones (maxSkew 1)",
            )
        )
    for i in range(3):
        pods.append(
            (
                _pod(
                    f"db-{i}",
                    "db",
                    "2",
                    "8Gi",
                    affinity={
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "topologyKey": "kubernetes.io/hostname",
                                    "labelSelector": {"matchLabels": {"app": "db"}},
                                }
                            ]
                        }
                    },
                ),
                "one per node (required anti-affinity)",
            )
        )
    for i in range(3):
        pods.append(
            (
                _pod(
                    f"cache-{i}",
                    "cache",
                    "250m",
                    "1Gi",
                    affinity={
                        "podAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "topologyKey": "kubernetes.io/hostname",
                                        "labelSelector": {"matchLabels": {"app": "web"}},
                                    },
                                }
                            ]
                        }
                    },
                ),
                "near web pods (preferred affinity)",
            )
        )
    for i in range(3):
        pods.append(
            (
                _pod(
                    f"batch-{i}",
                    "batch",
                    "4",
                    "4Gi",
                    nodeSelector={"team": "ml"},
                    tolerations=[
                        {
                            "key": "dedicated",
                            "operator": "Equal",
                            "value": "ml",
                            "effect": "NoSchedule",
                        }
                    ],
                ),
                "dedicated ml nodes (selector + toleration)",
            )
        )
    for group, members, cpu in GANGS:
        for i in range(members):
            body = _pod(f"{group}-{i}", group, cpu, "4Gi")
            body["metadata"]["labels"][GANG_LABEL] = group
            why = (
                f"gang of {members}, all or nothing (PodGroup {group})"
                if group == "train"
                else f"gang of {members} x {cpu} CPUs: no member binds"
            )
            pods.append((body, why))
    pods.append((_pod("giant", "giant", "64", "1Gi"), "needs 64 CPUs: fits nowhere"))
    return pods


def podgroups() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": group, "namespace": NS},
            "spec": {"minMember": members},
        }
        for group, members, _ in GANGS
    ]


async def _prepare_nodes(api: client.ApiClient) -> None:
    """Taint two nodes for the ml team and label them, as an operator would."""
    core = client.CoreV1Api(api)
    for name in ("kwok-node-0010", "kwok-node-0011"):
        patch = {
            "metadata": {"labels": {"team": "ml"}},
            "spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
        }
        await core.patch_node(name, patch)


async def _run_workload(cluster: DevCluster) -> int:
    async with api_client(cluster.kubeconfig) as api:
        core = client.CoreV1Api(api)
        await _prepare_nodes(api)
        await demo_gpu.prepare(api)
        await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": NS}}))
        pods = workload()
        objects = client.CustomObjectsApi(api)
        for group in podgroups():
            await objects.create_namespaced_custom_object(
                "scheduling.x-k8s.io", "v1alpha1", NS, "podgroups", group
            )
        for body, _ in pods:
            await core.create_namespaced_pod(NS, cast(client.V1Pod, body))

        async def settled() -> list[dict[str, Any]] | None:
            raw: Any = await core.list_namespaced_pod(NS, _preload_content=False)
            items: list[dict[str, Any]] = json.loads(await raw.read())["items"]
            done = [
                p
                for p in items
                if p["spec"].get("nodeName")
                or any(
                    c.get("type") == "PodScheduled" and c.get("status") == "False"
                    for c in p.get("status", {}).get("conditions", [])
                )
            ]
            return items if len(done) == len(pods) else None

        items = await poll(settled, within=120, interval=0.5)
        nodes = {n.metadata.name: n for n in (await core.list_node()).items}
        by_name = {p["metadata"]["name"]: p for p in items}
        rows = [("POD", "NODE", "ZONE", "WHY")]
        failed = []
        for body, why in pods:
            live = by_name[body["metadata"]["name"]]
            node = live["spec"].get("nodeName")
            zone = nodes[node].metadata.labels.get(ZONE, "") if node else ""
            rows.append((body["metadata"]["name"], node or "-", zone or "-", why))
            if not node:
                cond = next(c for c in live["status"]["conditions"] if c["type"] == "PodScheduled")
                failed.append(f"{body['metadata']['name']}: {cond['reason']}: {cond['message']}")
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        print()
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        print()
        for line in failed:
            print(f"FailedScheduling {line}")
        print()
        for line in demo_gpu.render(await demo_gpu.run_scenes(api)):
            print(line)
    return 0


def main(nodes: int = 12) -> int:
    """Bring everything up from nothing and show the placements."""
    try:
        crds = checkout_path("crds")
    except BuildError as exc:
        print(f"lattice demo: {exc}", file=sys.stderr)
        return 1
    cluster = DevCluster()
    cluster.down()
    started = time.monotonic()
    state = cluster.up(ClusterConfig(nodes=nodes, with_kube_scheduler=True))
    print(
        f"control plane ready in {time.monotonic() - started:.1f}s ({state.server}, "
        f"{nodes} kwok nodes, kube-scheduler beside Lattice)"
    )
    kubectl = str(Path(state.binaries) / "kubectl")
    subprocess.run(
        [
            kubectl,
            f"--kubeconfig={cluster.kubeconfig}",
            "apply",
            "--server-side",
            "-f",
            str(crds),
        ],
        check=True,
        capture_output=True,
    )
    # Served only once Established: a PodGroup posted before that is a 404 (seen on a
    # first run in a fresh virtualenv).
    subprocess.run(
        [
            kubectl,
            f"--kubeconfig={cluster.kubeconfig}",
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
        check=True,
        capture_output=True,
    )
    cluster.start_process(
        "lattice",
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "run",
            f"--kubeconfig={cluster.kubeconfig}",
            "--metrics-host=127.0.0.1",
            "--metrics-port=0",
        ],
        marker="scheduler.cli",
    )
    print(f"lattice run started (log: {cluster.log('lattice')})")
    code = asyncio.run(_run_workload(cluster))
    time.sleep(5.5)  # one status period, so the object below shows this run
    print()
    subprocess.run(
        [kubectl, f"--kubeconfig={cluster.kubeconfig}", "get", "latticeschedulers"], check=False
    )
    print()
    subprocess.run(
        [kubectl, f"--kubeconfig={cluster.kubeconfig}", "get", "podgroups", "-n", NS], check=False
    )
    print(f"\nexplain any pod:  lattice explain --kubeconfig {cluster.kubeconfig} {NS}/web-0")
    print(
        f"explain a gang:   lattice explain --kubeconfig {cluster.kubeconfig} --gang {NS}/too-big"
    )
    print(
        f"explain a GPU pod: lattice explain --kubeconfig {cluster.kubeconfig} "
        f"{demo_gpu.NS}/l-{demo_gpu.BIG}gpu-big"
    )
    print(
        f"explain a rack gang: lattice explain --kubeconfig {cluster.kubeconfig} --gang "
        f"{demo_gpu.NS}/{demo_gpu.RACK_GANGS[0][0]}"
    )
    print("stop everything:  lattice devcluster down")
    return code
