"""DynamicResources' per-node memo changes nothing: the same pods on the same cluster get
the same nodes and devices with it as with it cleared before every cycle, while devices
are taken, freed, and a slice changes."""

from __future__ import annotations

import copy
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from lattice_dev.benchmarks import dra as bench
from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import DraState
from scheduler.core.schedule import Framework
from tests.builders import cluster, make_node, make_pod

NODES = [f"n{i}" for i in range(6)]
TEMPLATES = {t["metadata"]["name"]: t for t in bench.claim_templates()}


def run(seed: int, pods: int, *, memo: bool) -> list[tuple[str | None, str]]:
    rng = random.Random(seed)
    dra = DraState()
    for c in bench.device_classes():
        dra.set_class(DeviceClass.from_api(c))
    for n in NODES:
        dra.set_slice(ResourceSlice.from_api(bench.gpu_slice(n, "a")))
        dra.set_slice(ResourceSlice.from_api(bench.nic_slice(n, "a")))
    snapshot = cluster([make_node(n, cpu="64", memory="256Gi") for n in NODES])
    framework = Framework()
    placed: list[tuple[str, str]] = []  # (pod key, claim name)
    out: list[tuple[str | None, str]] = []
    for i in range(pods):
        if placed and rng.random() < 0.25:  # a pod ends: its claim goes
            key, name = placed.pop(rng.randrange(len(placed)))
            snapshot.remove_pod(key)
            dra.remove_claim("default", name)
        if rng.random() < 0.05:  # a driver republishes a node's NICs
            dra.set_slice(ResourceSlice.from_api(bench.nic_slice(rng.choice(NODES), "a")))
        template = TEMPLATES[rng.choice(sorted(TEMPLATES))]
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"c{i}", "namespace": "default", "uid": f"uc{i}"},
            "spec": copy.deepcopy(template["spec"]["spec"]),
        }
        dra.set_claim(ResourceClaim.from_api(body))
        builder = make_pod(f"p{i}", cpu="100m").uid(f"u{i}")
        builder.body["spec"]["resourceClaims"] = [{"name": "d", "resourceClaimName": f"c{i}"}]
        pod = builder.build()
        if not memo:
            dra.memo.clear()
        decision = framework.schedule(snapshot, pod, dra=dra)
        devices = ""
        if decision.selected is not None and decision.claim_plan is not None:
            snapshot.add_pod(pod, decision.selected)
            dra.assume(decision.claim_plan)
            (write,) = decision.claim_plan.allocations
            assert write.allocation is not None
            devices = ",".join(r["device"] for r in write.allocation["devices"]["results"])
            # the write comes back (PreBind): the allocation is written, no longer assumed
            written = copy.deepcopy(body)
            written["status"] = {"allocation": dict(write.allocation)}
            dra.set_claim(ResourceClaim.from_api(written))
            placed.append((pod.key, f"c{i}"))
        out.append((decision.selected, devices))
    return out


def test_a_long_run_places_every_pod_as_without_the_memo() -> None:
    with_memo = run(1, 150, memo=True)
    assert with_memo == run(1, 150, memo=False)
    assert sum(1 for node, _ in with_memo if node is None) > 0  # it got full at times
    assert sum(1 for node, _ in with_memo if node is not None) > 50


@settings(max_examples=15, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_any_seed_places_every_pod_as_without_the_memo(seed: int) -> None:
    assert run(seed, 60, memo=True) == run(seed, 60, memo=False)
