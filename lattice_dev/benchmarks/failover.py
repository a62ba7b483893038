"""A new leader's first binding after the old one dies (``just bench-failover``).

Why: a scheduler under leader election is only as available as its slowest takeover.
A standby that starts listing when it wins the lease pays the lease *and* the list of
30 000 pods and the cache build before its first binding; Lattice's standbys follow the
same watches as the leader (``/readyz`` says when their cache has synced), so a takeover
should cost the lease and little more. The bar (#35): the first binding within the lease
duration + 5 s of the leader's death, at 5000 nodes and 30 000 pods.

How: a devcluster with ``--nodes`` kwok nodes and ``--existing`` bound pods (the memory
benchmark's set-up, kept in ``--state-dir`` when given), two replicas under leader
election with the default lease settings (15 s lease, 10 s renew deadline, 2 s retry, as
kube-scheduler's), each with its own metrics port. Per round: both replicas ready; the
leader is SIGKILLed right after one of its renewals is seen, the worst case (the whole
lease still to run); then ``--pods`` plain pods are created, which only the standby can
bind. Printed per round, from the kill: when the lease changed hands, the first binding,
the last. The killed replica is started again as the next round's standby.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from lattice_dev.benchmarks.common import (
    apply_crds,
    start_lattice,
    wait_all,
)
from lattice_dev.benchmarks.memory import ensure_existing, watched_backlog
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client
from lattice_dev.devcluster.process import free_port
from scheduler.config import LeaderElectionConfig

LEASE = ("lattice-scheduler", "kube-system")
REPLICAS = ("failover-a", "failover-b")


@dataclass(frozen=True)
class Replica:
    identity: str
    port: int


@dataclass(frozen=True)
class Round:
    lease: float
    """Seconds from the kill until the standby held the lease."""
    first: float
    """Seconds from the kill until the first of the round's pods was bound."""
    last: float
    bound: int


def start(cluster: DevCluster, replica: Replica) -> int:
    """`lattice run` under leader election at its default lease settings; its pid."""
    return start_lattice(
        cluster,
        name=replica.identity,
        election=(f"--identity={replica.identity}", f"--lease-namespace={LEASE[1]}"),
        metrics_port=replica.port,
    )


def ready(replica: Replica) -> bool:
    """The replica's /readyz: its cache has synced once (a standby's is kept warm)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{replica.port}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


async def until_ready(replicas: list[Replica], within: float) -> float:
    t0 = time.monotonic()
    while not all([await asyncio.to_thread(ready, r) for r in replicas]):
        if time.monotonic() - t0 > within:
            raise SystemExit(f"replicas not ready within {within:.0f}s")
        await asyncio.sleep(0.5)
    return time.monotonic() - t0


async def lease(coord: client.CoordinationV1Api) -> tuple[str | None, Any]:
    """(holder, renewTime) of the lease, (None, None) before it exists."""
    try:
        got = await coord.read_namespaced_lease(*LEASE)
    except client.ApiException as exc:
        if exc.status == 404:
            return None, None
        raise
    return got.spec.holder_identity or None, got.spec.renew_time


async def one_round(
    cluster: DevCluster, api: client.ApiClient, replicas: dict[str, Replica], n: int, pods: int
) -> Round:
    coord = client.CoordinationV1Api(api)
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + 120
    holder, renewed = await lease(coord)
    while holder not in replicas:
        if time.monotonic() > deadline:
            raise SystemExit("no replica took the lease within 120s")
        await asyncio.sleep(0.2)
        holder, renewed = await lease(coord)
    assert holder is not None
    # The worst case: killed just after a renewal, so the whole lease is still to run.
    while True:
        now_holder, now_renewed = await lease(coord)
        if now_holder == holder and now_renewed != renewed:
            break
        await asyncio.sleep(0.05)
    pids = cluster.load_state()
    assert pids is not None
    killed_at = time.monotonic()
    os.kill(pids.pids[holder], signal.SIGKILL)
    ns = f"failover-{n}-{int(time.time())}"
    watcher, names = await watched_backlog(api, ns, pods)
    try:
        took_lease = asyncio.create_task(_new_holder(coord, holder, killed_at))
        unbound = await wait_all(watcher, set(names), 120.0)
        lease_at = await asyncio.wait_for(took_lease, 60)
    finally:
        await watcher.stop()
        await core.delete_namespace(ns, _preload_content=False)
    times = sorted(t - killed_at for t in watcher.bound.values())
    start(cluster, replicas[holder])  # back as the next round's standby
    return Round(lease_at, times[0] if times else float("nan"), times[-1], pods - unbound)


async def _new_holder(coord: client.CoordinationV1Api, old: str, since: float) -> float:
    while True:
        holder, _ = await lease(coord)
        if holder is not None and holder != old:
            return time.monotonic() - since
        await asyncio.sleep(0.05)


async def bench(cluster: DevCluster, args: argparse.Namespace) -> list[Round]:
    replicas = {name: Replica(name, free_port()) for name in REPLICAS}
    for replica in replicas.values():
        start(cluster, replica)
    rounds: list[Round] = []
    async with api_client(cluster.kubeconfig) as api:
        try:
            for n in range(1, args.rounds + 1):
                warm = await until_ready(list(replicas.values()), within=900)
                r = await one_round(cluster, api, replicas, n, args.pods)
                rounds.append(r)
                print(
                    f"round {n}: both ready after {warm:.1f}s; from the leader's SIGKILL: "
                    f"lease taken {r.lease:.1f}s, first binding {r.first:.1f}s, "
                    f"{r.bound}/{args.pods} bound by {r.last:.1f}s",
                    flush=True,
                )
        finally:
            for name in replicas:
                cluster.stop_component(name)
    return rounds


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--existing", type=int, default=30_000)
    p.add_argument("--pods", type=int, default=100, help="created after each kill")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--state-dir", type=Path, default=None, help="keep the plane here")
    p.add_argument("--down", action="store_true", help="stop a kept plane at the end")
    args = p.parse_args(argv)
    keep = args.state_dir is not None
    cluster = DevCluster(args.state_dir or Path(f"/tmp/lattice-failover-{int(time.time())}"))
    if cluster.load_state() is None:
        state = cluster.up(ClusterConfig(nodes=args.nodes), progress=print)
        apply_crds(cluster, state)
    try:
        asyncio.run(ensure_existing(cluster, args.nodes, args.existing))
        rounds = asyncio.run(bench(cluster, args))
    finally:
        if not keep or args.down:
            cluster.down()
    bar = LeaderElectionConfig().lease_duration + 5
    firsts = [r.first for r in rounds]
    print(
        f"first binding after the leader's death, {len(rounds)} rounds, {args.nodes} nodes, "
        f"{args.existing} existing pods: min {min(firsts):.1f} / median "
        f"{statistics.median(firsts):.1f} / max {max(firsts):.1f} s (bar: lease + 5 = {bar} s)"
    )


if __name__ == "__main__":
    main()
