"""Micro-benchmark: the raw intake (``scheduler.control.intake``) vs kopf, on one pod burst.

``python -m lattice_dev.benchmarks.intake [--pods 5000] [--nodes 50] [--kubeconfig K]``

Each consumer runs alone in its own process (so its CPU time is its own), watching the
way Lattice would: the intake with the pending stream (our schedulerName) and the assigned
stream, server-side filtered; kopf with an ``on.event`` handler on all pods, with the
settings ``lattice run`` uses (no diffbase, no posting, no scanning). Both do the same
minimal work per event: note the pod's node and phase. Once the consumer has synced, the
driver creates ``--pods`` pods of a scheduler name nobody serves, binds each one itself
(a Binding per pod, 32 in flight) onto kwok nodes, and kwok runs them; the consumer stops
when it has seen every pod bound and Running (or after ``--timeout``) and reports the
events it handled and its CPU time from sync to done.

"burst s" is how long the driver took to create and bind the pods, "wall s" how long
the consumer took to see them all Running (from its sync); "events/s" is events handled
over that wall time, bounded by how fast the driver and the API server produce them (a
consumer that keeps up cannot beat the burst). "CPU/event" and "CPU/pod" are the honest
figures: 1 / CPU-per-event is what one core could absorb.
Without ``--kubeconfig`` a temporary devcluster is started (and stopped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

import kopf
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client
from scheduler.control.intake import (
    ASSIGNED_PODS,
    Batch,
    EventType,
    Intake,
    Relisted,
    assigned_pods,
    pending_pods,
)
from scheduler.control.kubeconfig import load_credentials

SCHEDULER_NAME = "bench-intake-nobody"
PAUSE = "registry.k8s.io/pause:3.10"


class Tally:
    """The same minimal work for both consumers: each pod's node and phase."""

    def __init__(self, namespace: str, pods: int) -> None:
        self.namespace = namespace
        self.pods = pods
        self.events = 0
        self.running: set[str] = set()
        self.done = asyncio.Event()

    def saw(self, kind: str | None, obj: dict[str, Any]) -> None:
        self.events += 1
        meta = obj.get("metadata") or {}
        if kind == "DELETED" or meta.get("namespace") != self.namespace:
            return
        if (obj.get("spec") or {}).get("nodeName") and (obj.get("status") or {}).get(
            "phase"
        ) == "Running":
            self.running.add(str(meta.get("name")))
            if len(self.running) >= self.pods:
                self.done.set()


async def _report(tally: Tally, ready: asyncio.Event, limit_s: float) -> None:
    await ready.wait()
    cpu0, wall0, events0 = time.process_time(), time.monotonic(), tally.events
    print("READY", flush=True)
    with contextlib.suppress(TimeoutError):  # report what was seen by then
        await asyncio.wait_for(tally.done.wait(), limit_s)
    result = {
        "events": tally.events - events0,
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.monotonic() - wall0,
        "running": len(tally.running),
    }
    print(json.dumps(result), flush=True)


async def child_intake(kubeconfig: Path, namespace: str, pods: int, limit_s: float) -> None:
    tally = Tally(namespace, pods)
    ready = asyncio.Event()
    async with (
        api_client(kubeconfig) as api,
        Intake(api, [pending_pods(SCHEDULER_NAME), assigned_pods()]) as intake,
    ):

        async def consume() -> None:
            while True:
                for update in await intake.get():
                    if isinstance(update, Batch):
                        for ev in update.events:
                            tally.saw(ev.type.value, cast(dict[str, Any], ev.obj))
                    elif isinstance(update, Relisted) and update.stream == ASSIGNED_PODS:
                        for item in update.items:
                            tally.saw(EventType.ADDED.value, cast(dict[str, Any], item))

        consumer = asyncio.create_task(consume())
        await intake.wait_synced()
        ready.set()
        try:
            await _report(tally, ready, limit_s)
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)


async def child_kopf(kubeconfig: Path, namespace: str, pods: int, limit_s: float) -> None:
    tally = Tally(namespace, pods)
    creds = await load_credentials(kubeconfig)
    login = creds.kopf_login()
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> kopf.ConnectionInfo:
        return login(**kwargs)

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def _pod(*, event: kopf.RawEvent, **_: Any) -> None:
        tally.saw(event.get("type"), cast(dict[str, Any], event["object"]))

    settings = kopf.OperatorSettings()

    class NoDiffBase(kopf.DiffBaseStorage):  # as scheduler/control/watch.py
        def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
            return cast(kopf.BodyEssence, None)

        def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
            return None

        def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
            return None

    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.peering.standalone = True
    stop, ready = asyncio.Event(), asyncio.Event()
    operator = asyncio.create_task(
        kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=True,
            standalone=True,
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    await ready.wait()
    await asyncio.sleep(2.0)  # kopf has no "listed" signal: give its initial list time
    try:
        await _report(tally, ready, limit_s)
    finally:
        stop.set()
        await asyncio.gather(operator, return_exceptions=True)


# -- the driver ---------------------------------------------------------------------------


async def burst(api: client.ApiClient, namespace: str, pods: int, node_names: list[str]) -> None:
    """Create ``pods`` pods and bind each one as soon as it exists."""
    core = client.CoreV1Api(api)
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        name = f"p-{i}"
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "bench"}},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "containers": [{"name": "c", "image": PAUSE}],
            },
        }
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_names[i % len(node_names)]},
        }
        async with sem:
            resp: Any = await core.create_namespaced_pod(
                namespace, cast(client.V1Pod, body), _preload_content=False
            )
            resp.release()
            resp = await core.create_namespaced_binding(
                namespace, cast(client.V1Binding, binding), _preload_content=False
            )
            resp.release()

    await asyncio.gather(*(one(i) for i in range(pods)))


SERVER_PROCESSES = ("kube-apiserver", "etcd", "kwok")


def server_cpu(pids: dict[str, int]) -> float:
    """CPU seconds the control plane's processes have used so far (0 if not ours)."""
    total = 0.0
    for name in SERVER_PROCESSES:
        pid = pids.get(name)
        if pid is None:
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def run_one(
    which: str,
    kubeconfig: Path,
    api: client.ApiClient,
    pods: int,
    limit_s: float,
    pids: dict[str, int],
) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    namespace = f"bench-intake-{uuid.uuid4().hex[:6]}"
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": namespace}}))
    node_names = [n.metadata.name for n in (await core.list_node()).items]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lattice_dev.benchmarks.intake",
        "--child",
        which,
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        namespace,
        "--pods",
        str(pods),
        "--timeout",
        str(limit_s),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        while (await proc.stdout.readline()).strip() != b"READY":
            if proc.returncode is not None:
                raise RuntimeError(f"{which} consumer exited before it was ready")
        started, server0 = time.monotonic(), server_cpu(pids)
        await burst(api, namespace, pods, node_names)
        produced = time.monotonic() - started
        result: dict[str, Any] = json.loads(await proc.stdout.readline())
        result["burst_s"] = produced
        result["server_cpu_s"] = server_cpu(pids) - server0
        return result
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        await core.delete_namespace(namespace)
        await _gone(core, namespace)


async def _gone(core: client.CoreV1Api, namespace: str) -> None:
    """Wait out the namespace's deletion, so the next consumer's burst is the only load
    (kopf, which cannot filter, would otherwise also handle 5000 pods being deleted)."""
    while True:
        try:
            await core.read_namespace(namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return
            raise
        await asyncio.sleep(1.0)


async def drive(
    args: argparse.Namespace, kubeconfig: Path, pids: dict[str, int] | None = None
) -> None:
    async with api_client(kubeconfig) as api:
        results = {
            which: await run_one(which, kubeconfig, api, args.pods, args.timeout, pids or {})
            for which in args.order.split(",")
        }
    print(f"{args.pods} pods created, bound and run (kwok) per consumer, one consumer at a time")
    print(
        f"{'consumer':<8} {'events':>7} {'running':>8} {'burst s':>8} {'wall s':>7} "
        f"{'events/s':>9} "
        f"{'CPU s':>6} {'CPU/event':>10} {'CPU/pod':>8} {'server CPU s':>13}"
    )
    for which, r in results.items():
        events = max(1, r["events"])
        print(
            f"{which:<8} {r['events']:>7} {r['running']:>8} {r['burst_s']:>8.1f} "
            f"{r['wall_s']:>7.1f} "
            f"{r['events'] / r['wall_s']:>9.0f} {r['cpu_s']:>6.2f} "
            f"{1e6 * r['cpu_s'] / events:>8.0f}us {1e3 * r['cpu_s'] / args.pods:>6.2f}ms "
            f"{r['server_cpu_s']:>13.1f}"
        )
    ratio = results["kopf"]["cpu_s"] / max(1e-9, results["intake"]["cpu_s"])
    print(f"kopf / intake CPU for the same burst: {ratio:.1f}x")
    if pids:
        print(f"server CPU: {' + '.join(SERVER_PROCESSES)} during the burst and until done")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=50, help="kwok nodes (own devcluster)")
    parser.add_argument("--kubeconfig", type=Path, help="an existing cluster (default: start one)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--order",
        default="intake,kopf",
        choices=["intake,kopf", "kopf,intake"],
        help="which consumer runs first (the first burst meets a colder cluster)",
    )
    parser.add_argument("--child", choices=["intake", "kopf"], help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child = child_intake if args.child == "intake" else child_kopf
        asyncio.run(child(args.kubeconfig, args.namespace, args.pods, args.timeout))
        return 0
    if args.kubeconfig is not None:
        asyncio.run(drive(args, args.kubeconfig))
        return 0
    with tempfile.TemporaryDirectory(prefix="lattice-bench-intake-") as scratch:
        cluster = DevCluster(Path(scratch) / "state")
        state = cluster.up(ClusterConfig(nodes=args.nodes))
        try:
            asyncio.run(drive(args, cluster.kubeconfig, dict(state.pids)))
        finally:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
