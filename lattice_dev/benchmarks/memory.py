"""Peak RSS of `lattice run` on a big cluster (``python -m lattice_dev.benchmarks.memory``).

Why: at 5000 nodes and 30 000 pods what a scheduler holds, and what it holds while it
reads the cluster, decides whether it fits its container's limit; the throughput
benchmark reports peak RSS too, but takes half an hour per side at that size. This one
measures Lattice alone, as often as wanted on one plane kept between runs.

How: a devcluster with ``--nodes`` kwok nodes (kept in ``--state-dir`` when given, so a
second run skips the ~15 min set-up), ``--existing`` plain pods created already bound
(the throughput benchmark's placement) and left to kwok until Running; then per run a
namespace with ``--pods`` pending pods, `lattice run` started, its ``VmRSS`` sampled every
0.5 s until every pod is bound, and ``VmHWM`` (peak RSS) printed with the curve.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio import client

from lattice_dev.benchmarks.common import Watcher, apply_crds, create_pods, start_lattice, wait_all
from lattice_dev.benchmarks.scheduling import existing_node_index, plain
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client
from lattice_dev.devcluster.profiles import node_name

EXISTING_NS = "memory-existing"


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    values = {"VmRSS": math.nan, "VmHWM": math.nan}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in values:
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


async def _settle(core: client.CoreV1Api, ns: str, within: float) -> int:
    """Until kwok runs every pod of ``ns``; how many are still not Running."""
    deadline = time.monotonic() + within
    left = -1
    while time.monotonic() < deadline:
        page: Any = await core.list_namespaced_pod(
            ns, field_selector="status.phase!=Running", limit=1
        )
        left = int(page.metadata.remaining_item_count or 0) + len(page.items)
        if not left:
            return 0
        await asyncio.sleep(5.0)
    return left


async def ensure_existing(cluster: DevCluster, nodes: int, existing: int) -> None:
    """``existing`` plain pods bound across ``nodes`` nodes and left to kwok until Running,
    unless an earlier run on a kept plane made them already."""
    async with api_client(cluster.kubeconfig) as api:
        core = client.CoreV1Api(api)
        try:
            await core.read_namespace(EXISTING_NS)
            print(f"existing pods: kept from an earlier run in {EXISTING_NS}", flush=True)
            return
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": EXISTING_NS}}))
        bodies = []
        for i in range(existing):
            body = plain(f"e-{i}", "lattice")
            body["spec"]["nodeName"] = node_name(existing_node_index(i, nodes))
            bodies.append(body)
        t0 = time.monotonic()
        await create_pods(core, EXISTING_NS, bodies)
        left = await _settle(core, EXISTING_NS, within=1800)
        note = f", {left} not Running yet" if left else ""
        print(f"existing pods: {existing} in {time.monotonic() - t0:.0f}s{note}", flush=True)


async def watched_backlog(api: client.ApiClient, ns: str, pods: int) -> tuple[Watcher, list[str]]:
    """A new namespace ``ns`` with ``pods`` pending plain pods, watched from before their
    creation so that no binding is missed; the watcher (the caller stops it) and the names."""
    core = client.CoreV1Api(api)
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
    watcher = Watcher(api, ns)
    watcher.start()
    try:
        await watcher.started.wait()
        names = [f"p-{i}" for i in range(pods)]
        await create_pods(core, ns, [plain(n, "lattice") for n in names])
    except BaseException:
        await watcher.stop()
        raise
    return watcher, names


async def _run(cluster: DevCluster, args: argparse.Namespace, run: int) -> float:
    async with api_client(cluster.kubeconfig) as api:
        core = client.CoreV1Api(api)
        ns = f"memory-run-{run}-{int(time.time())}"
        watcher, names = await watched_backlog(api, ns, args.pods)
        try:
            pid = start_lattice(cluster)
            t0 = time.monotonic()
            curve: list[tuple[float, float]] = []

            async def sample() -> None:
                while True:
                    curve.append((time.monotonic() - t0, rss_mib(pid)[0]))
                    await asyncio.sleep(0.5)

            sampler = asyncio.create_task(sample())
            try:
                unbound = await wait_all(watcher, set(names), args.timeout)
                took = time.monotonic() - t0
                await asyncio.sleep(2.0)
                rss, peak = rss_mib(pid)
            finally:
                sampler.cancel()
                cluster.stop_component("lattice")
        finally:
            await watcher.stop()
            await core.delete_namespace(ns, _preload_content=False)
    print(
        f"run {run}: {args.pods - unbound}/{args.pods} bound in {took:.0f}s from start; "
        f"peak RSS {peak:.0f} MiB (VmHWM), {rss:.0f} MiB at the end "
        f"({args.nodes} nodes, {args.existing} existing pods)",
        flush=True,
    )
    step = max(1, len(curve) // 12)
    print("  RSS MiB over time: " + ", ".join(f"{t:.0f}s {m:.0f}" for t, m in curve[::step]))
    return peak


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--existing", type=int, default=30_000)
    p.add_argument("--pods", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--state-dir", type=Path, default=None, help="keep the plane here")
    p.add_argument("--down", action="store_true", help="stop a kept plane at the end")
    args = p.parse_args(argv)
    keep = args.state_dir is not None
    state_dir = args.state_dir or Path(f"/tmp/lattice-memory-{int(time.time())}")
    cluster = DevCluster(state_dir)
    if cluster.load_state() is None:
        state = cluster.up(ClusterConfig(nodes=args.nodes), progress=print)
        apply_crds(cluster, state)
    try:
        asyncio.run(ensure_existing(cluster, args.nodes, args.existing))
        peaks = [asyncio.run(_run(cluster, args, run)) for run in range(1, args.repeat + 1)]
        print(f"peak RSS over {len(peaks)} run(s): {', '.join(f'{x:.0f}' for x in peaks)} MiB")
    finally:
        if not keep or args.down:
            cluster.down()


if __name__ == "__main__":
    main()
