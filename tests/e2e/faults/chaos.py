"""`just chaos`: the fault run of tests/e2e/test_faults.py at the issue's size, many seeds.

One control plane (six kwok nodes, our CRDs and RBAC) for the whole run; per seed a fresh
namespace and a fresh `lattice run` behind a fresh proxy: 60 s of faults while 345 pods
stream in (300 plain, 10 with WaitForFirstConsumer claims, 20 with DRA claims, 3 gangs of
4 and a DRA gang of 3), with kube-apiserver restarted mid-window on every other seed,
then up to 120 s after the heal. Prints one row per seed and exits non-zero if any seed
lost, doubled or leaked anything, left a gang partly bound, or needed more than
kube-scheduler's 34 s after the heal.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import api_client
from tests.e2e.faults.scenario import HEADER, KUBE_BAR, Outcome, Workload, row, run_seed
from tests.e2e.test_scheduler import Plane, lattice_plane

CHAOS = Workload(plain=300, volume=10, dra=20, gangs=3, window=60.0, grace=120.0)


async def run(
    plane: Plane, seeds: list[int], workload: Workload, restart_every: int, tmp: Path
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    async with api_client(plane.cluster.kubeconfig) as api:
        core = client.CoreV1Api(api)
        print(HEADER + f" {'restart':>8}", flush=True)
        for i, seed in enumerate(seeds):
            restart = restart_every > 0 and i % restart_every == restart_every - 1
            w = replace(workload, restart=restart)
            ns = f"chaos-{seed}"
            await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            o = await run_seed(plane, api, ns, seed, w, tmp)
            outcomes.append(o)
            down = "-" if o.restart_down is None else f"{o.restart_down:.1f} s"
            print(row(o) + f" {down:>8}", flush=True)
            if o.failure is not None:
                print(f"    run failed: {o.failure}", flush=True)
            for problem in o.problems[:10]:
                print(f"    {problem}", flush=True)
            await core.delete_namespace(ns)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", help="seeds to run (default: drawn)")
    parser.add_argument("--runs", type=int, default=5, help="seeds to draw (default 5)")
    parser.add_argument("--window", type=float, default=CHAOS.window, help="seconds of faults")
    parser.add_argument(
        "--restart-every",
        type=int,
        default=2,
        help="restart kube-apiserver mid-window every Nth seed (0: never; default 2)",
    )
    args = parser.parse_args(argv)
    seeds = args.seeds or [random.SystemRandom().randrange(2**31) for _ in range(args.runs)]
    print(f"chaos seeds: {' '.join(map(str, seeds))}", flush=True)
    workload = replace(CHAOS, window=args.window)
    tmp = Path(tempfile.mkdtemp(prefix="lattice-chaos-"))
    print(f"logs of each run (lattice, kubeconfig): {tmp}", flush=True)
    with lattice_plane(tmp, ClusterConfig(nodes=6)) as plane:
        outcomes = asyncio.run(run(plane, seeds, workload, args.restart_every, tmp))
    bad = [
        o.seed for o in outcomes if not o.clean or o.after_heal is None or o.after_heal > KUBE_BAR
    ]
    times = sorted(o.after_heal for o in outcomes if o.after_heal is not None)
    if times:
        print(f"bound after heal: max {times[-1]:.1f} s (kube-scheduler: {KUBE_BAR:.0f} s)")
    print("all seeds clean" if not bad else f"seeds with problems: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
