"""bench-dra's stream through the pure core: where Lattice's profile and kube-scheduler's
put the same claims, for many seeds in seconds.

Why. A live ``just bench-dra`` run takes minutes per arm and one seed; tuning GPUPlacement's
DRA ranking on it would tune on the one seed it reports. This replays the same objects
(:mod:`lattice_dev.benchmarks.dra`: the kwok nodes, GPU and NIC slices, device classes,
claim templates and the seeded pod stream) one pod at a time through
:class:`~scheduler.core.schedule.Framework` with Lattice's default profile and with
:func:`~scheduler.core.profile.kube_profile` (kube-scheduler's default plugins and weights
as the core computes them, for the release given), each allocation assumed and written
back before the next pod, as the controller does. The core's kube profile scores every
feasible node, where kube-scheduler 1.37 scores the first ``50 - N/125`` % it finds and
breaks ties at random: its live figures differ a little (1000 nodes, seed 0: 133 whole
nodes here, 144-149 live).

Printed per profile and seed: pods placed, GPUs stranded (free on partly used pcieRoots),
partly used roots, whole free nodes, and claims of at most one root's GPUs without a
pcieRoot constraint whose GPUs span two roots (what keeping whole nodes first costs).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lattice_dev.benchmarks.dra import (
    GPU_DRIVER,
    GPUS_PER_NODE,
    ROOTS_PER_NODE,
    Leftover,
    claim_templates,
    device_classes,
    gpu_root,
    gpu_slice,
    kwok_node,
    leftover,
    nic_slice,
    node_names,
    pod_body,
    workload,
)
from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import DraState
from scheduler.core.profile import DEFAULT_PROFILE, Profile, kube_profile
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.node import Node
from scheduler.model.pod import Pod

ARM = "offline"
NAMESPACE = "default"


@dataclass(frozen=True)
class Outcome:
    placed: int
    pods: int
    left: Leftover
    split: int
    """Claims of at most one root's GPUs, no pcieRoot constraint, spanning two roots."""
    devices: int
    """GPU and NIC devices allocated (each at most once: checked)."""


def replay(profile: Profile, nodes: int, pods: int, seed: int) -> Outcome:
    """One profile over bench-dra's stream of ``pods`` on ``nodes`` nodes."""
    names = node_names(ARM, nodes)
    dra = DraState()
    for cls in device_classes():
        dra.set_class(DeviceClass.from_api(cls))
    for name in names:
        dra.set_slice(ResourceSlice.from_api(gpu_slice(name, ARM)))
        dra.set_slice(ResourceSlice.from_api(nic_slice(name, ARM)))
    snapshot = Snapshot([Node.from_api(kwok_node(n, i, ARM)) for i, n in enumerate(names)])
    framework = Framework(profile)
    templates = {t["metadata"]["name"]: t for t in claim_templates()}
    used: set[tuple[str, str, str]] = set()
    placed = split = 0
    for i, shape in enumerate(workload(pods, seed)):
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"c{i}", "namespace": NAMESPACE, "uid": f"uc{i}"},
            "spec": copy.deepcopy(templates[shape.template]["spec"]["spec"]),
        }
        dra.set_claim(ResourceClaim.from_api(claim))
        body = pod_body(f"p{i}", shape, "lattice", ARM)
        body["metadata"].update(namespace=NAMESPACE, uid=f"u{i}")
        body["spec"]["resourceClaims"] = [{"name": "devices", "resourceClaimName": f"c{i}"}]
        pod = Pod.from_api(body)
        decision = framework.schedule(snapshot, pod, dra=dra, seed=seed * 100_003 + i)
        if decision.selected is None or decision.claim_plan is None:
            continue
        (write,) = decision.claim_plan.allocations
        if write.allocation is None:
            raise AssertionError(f"pod {i}: a plan without an allocation")
        placed += 1
        snapshot.add_pod(pod, decision.selected)
        dra.assume(decision.claim_plan)
        written = copy.deepcopy(claim)
        written["status"] = {"allocation": dict(write.allocation)}
        dra.set_claim(ResourceClaim.from_api(written))
        roots = set()
        for r in write.allocation["devices"]["results"]:
            device = (str(r["driver"]), str(r["pool"]), str(r["device"]))
            if device in used:
                raise AssertionError(f"pod {i}: device {device} allocated twice")
            used.add(device)
            if device[0] == GPU_DRIVER:
                roots.add(gpu_root(int(device[2].rsplit("-", 1)[1])))
        if not shape.constrained and shape.gpus <= GPUS_PER_NODE // ROOTS_PER_NODE:
            split += len(roots) > 1
    return Outcome(placed, pods, leftover(names, used), split, len(used))


def profiles(kube_minor: int) -> dict[str, Profile]:
    return {
        "lattice": DEFAULT_PROFILE,
        f"kube-1.{kube_minor}": kube_profile(kube_minor=kube_minor),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lattice_dev.benchmarks.dra_offline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--kube-minor", type=int, default=37, help="the kube profile's release")
    args = parser.parse_args(argv)
    rows: dict[str, list[Outcome]] = {}
    print(
        f"{'profile':<12} {'seed':>5} {'placed':>11} {'stranded':>9} {'partly roots':>13} "
        f"{'whole nodes':>12} {'split claims':>13} {'s':>5}"
    )
    for seed in args.seeds:
        for name, profile in profiles(args.kube_minor).items():
            t0 = time.monotonic()
            out = replay(profile, args.nodes, args.pods, seed)
            rows.setdefault(name, []).append(out)
            print(
                f"{name:<12} {seed:>5} {out.placed:>5}/{out.pods:<5} "
                f"{out.left.stranded_gpus:>9} {out.left.partly_used_roots:>13} "
                f"{out.left.free_nodes:>5}/{args.nodes:<6} {out.split:>13} "
                f"{time.monotonic() - t0:>5.0f}",
                flush=True,
            )
    if len(args.seeds) > 1:
        print("\nmedian over seeds (min-max):")
        for name, outs in rows.items():

            def spread(values: list[int]) -> str:
                return f"{statistics.median(values):g} ({min(values)}-{max(values)})"

            print(
                f"{name:<12} stranded {spread([o.left.stranded_gpus for o in outs])}, "
                f"whole nodes {spread([o.left.free_nodes for o in outs])}, "
                f"split claims {spread([o.split for o in outs])}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
