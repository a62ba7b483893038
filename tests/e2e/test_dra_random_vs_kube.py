"""Random DRA claims: Lattice reaches kube-scheduler v1.34.4's verdict and allocation.

Hundreds of seeded random cases (:mod:`tests.e2e.differential.dra_gen`: counts, All over
complete and incomplete pools, firstAvailable, matchAttribute on string/int/version/mixed
and sometimes-missing attributes, scoped constraints, a GPU+NIC pair over two drivers on
``resource.kubernetes.io/pcieRoot``, adminAccess, CEL selectors of many forms including
kube's runtime errors, 33 devices, an older pool generation, a missing class, claims shared
by several pods, claims already allocated when the pod comes (used, only taking devices, or
pinned elsewhere so PostFilter frees them), claims generated from templates, pools of two
slices; from 1.36 tainted devices against tolerations and pools with shared counters) run
on one plane in one go, each on disjoint devices as in ``test_dra_vs_kube.py``:
kube-scheduler's pods pinned to one node, Lattice's to the other. Once every pod's verdict
(bound, or the reason of PodScheduled=False) has held still for :data:`STABLE` seconds:

* each pod has the same verdict as its twin on the other node;
* a bound pair's written ``status.allocation`` is equal once node and pool names are
  mapped (one pool of one slice per driver on the node: kube's first fit is deterministic),
  or differs only in devices that span no more PCIe roots (:func:`better_by_rule`:
  Lattice's root-aware device order); with a pool of two slices kube's first fit follows
  its informer's slice order, so there only validity is compared;
* every allocation either scheduler wrote passes the independent checker
  (:mod:`tests.e2e.differential.dra_check`), each bound pod is in its claims'
  ``reservedFor`` with kube's finalizer on what a scheduler allocated, and an unbound
  pod's claims stay unallocated (a held claim's allocation is the test's).

The seed is ``LATTICE_DRA_SEED`` if set, else drawn per run; it is printed and named in
every assertion message. ``LATTICE_DRA_CASES`` changes the case count (default 300).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
from collections.abc import Iterator
from typing import Any, Final

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.build import kubernetes_version
from tests.conftest import report_line
from tests.e2e.differential.dra_cases import (
    BOUND,
    KUBE_NODE,
    as_kube,
    dra_plane,
    list_claims,
    pinned,
    pod_claim_name,
    scheduler_for,
    unstamped,
    verdict,
)
from tests.e2e.differential.dra_check import (
    check_pod,
    check_reserved,
    expected_config,
    tolerates,
)
from tests.e2e.differential.dra_gen import (
    COUNTER_SET,
    KINDS,
    NEW_IN_136,
    NODE_PAIRS,
    PCIE_ROOT,
    Case,
    Claim,
    Constraint,
    Driver,
    Request,
    Sel,
    SelectorError,
    Sub,
    _quantity,
    generate,
    held_status,
    kinds,
    objects,
    reproducer,
)
from tests.e2e.test_scheduler import Plane, create_pods, list_pods

SEED_ENV: Final = "LATTICE_DRA_SEED"
CASES_ENV: Final = "LATTICE_DRA_CASES"
DEFAULT_CASES: Final = 300
STABLE: Final = 6.0
"""Seconds every verdict must hold still (Unschedulable and SchedulerError pods retry)."""
SETTLE_WITHIN: Final = 240.0


def without_share_ids(allocation: dict[str, Any] | None) -> dict[str, Any] | None:
    """``allocation`` with each share's ``shareID`` (a random UUID on both sides) marked
    only as present, and ``consumedCapacity`` as exact integers (kube writes ``8Gi`` where
    Lattice writes ``8589934592``: the same quantity). The checker sees them as written."""
    if allocation is None:
        return None
    results = []
    for r in (allocation.get("devices") or {}).get("results") or []:
        entry = dict(r)
        if "shareID" in entry:
            entry["shareID"] = "<uuid>"
        if "consumedCapacity" in entry:
            entry["consumedCapacity"] = {
                k: str(_quantity(v)) for k, v in entry["consumedCapacity"].items()
            }
        results.append(entry)
    return {**allocation, "devices": {**allocation["devices"], "results": results}}


def choose_seed(env: dict[str, str] | os._Environ[str]) -> tuple[int, str]:
    raw = env.get(SEED_ENV, "").strip()
    if raw:
        return int(raw), SEED_ENV
    return time.time_ns() // 1000 % (1 << 31), "drawn"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with dra_plane(tmp_path_factory.mktemp("dra-random"), nodes=2 * NODE_PAIRS) as p:
        yield p


def _roots(case: Case, allocation: dict[str, Any]) -> int:
    """PCIe roots an allocation's devices span (devices without the attribute: none)."""
    by_device = {
        (d.name, dev["name"]): dev["attributes"].get(PCIE_ROOT)
        for d in case.drivers
        for dev in d.devices
    }
    roots = {
        json.dumps(by_device.get((r["driver"], r["device"])))
        for r in allocation["devices"]["results"]
    }
    roots.discard("null")
    return len(roots)


def better_by_rule(case: Case, ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """Why Lattice's different allocation is its stated rule at work (the allocator's
    root-aware order: whole PCIe roots that hold a request first), or None: the same
    requests, drivers, pools, configs and nodeSelector, only other devices, spanning no
    more PCIe roots than kube's first fit (the order's best fit among roots is
    ``tests/core/test_dra_placement.py``'s to check). Both are checked valid elsewhere."""

    def shape(a: dict[str, Any]) -> Any:
        strip = copy.deepcopy(a)
        for r in strip["devices"]["results"]:
            r.pop("device", None)
        return strip

    if shape(ours) != shape(theirs):
        return None
    mine, kubes = _roots(case, ours), _roots(case, theirs)
    if mine > kubes:
        return None
    if mine == kubes:
        return f"{mine} PCIe root(s), as kube's, another root (best fit)"
    return f"{mine} PCIe root(s) against kube's {kubes}"


def _pod_name(case: Case, node: str) -> str:
    return f"{case.name}-{node}"


def kube_waits_after_deallocating(case: Case, kube_pod: dict[str, Any], ours: str | None) -> bool:
    """kube-scheduler 1.34.4 deallocated a held claim pinned elsewhere (its PostFilter) and
    did not try the pod again within the test: the deallocation's event reached its queue
    while the pod was still in flight, so the pod waits for the periodic flush (up to 5
    minutes), seen in 3 of 5 such cases. Lattice retries the pod itself once its own
    deallocation is written, so it must be bound (its allocation is checked as any)."""
    return (
        any(c.held_elsewhere for c in case.claims)
        and verdict(kube_pod) == "Unschedulable"
        and "deallocation of ResourceClaim completed" in _message(kube_pod)
        and ours == BOUND
    )


KUBE_TIMEOUT: Final = "timed out trying to allocate devices"


def kube_timed_out(kube_pod: dict[str, Any]) -> bool:
    """kube-scheduler's DRA filter gave up (its 10 s DRASchedulerFilterTimeout) and so gave
    no verdict: a SchedulerError that retries. Its allocator backtracks through every
    subset before it finds that, say, 5 + 8 devices do not fit in 12; under CI load that
    took longer than 10 s (seed 1359661391, c189), alone it did not."""
    return verdict(kube_pod) == "SchedulerError" and KUBE_TIMEOUT in _message(kube_pod)


def claim_object(
    case: Case,
    node: str,
    claim: Claim,
    pod: dict[str, Any] | None,
    claims: dict[str, dict[str, Any]],
) -> dict[str, Any] | None:
    """``claim``'s object on ``node``: by name, or for a template's through ``pod``'s
    ``status.resourceClaimStatuses`` (the name kube-controller-manager generated)."""
    if not claim.template:
        return claims.get(case.claim_name(claim, node))
    if pod is None:
        return None
    entry = pod_claim_name(case.used_claims().index(claim))
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if st.get("name") == entry and st.get("resourceClaimName"):
            return claims.get(st["resourceClaimName"])
    return None


async def write_held(api: client.ApiClient, ns: str, cases: list[Case]) -> int:
    """Allocate every held claim as the case says, before any pod exists (status subresource,
    as a scheduler writes it); the count written."""
    custom: Any = client.CustomObjectsApi(api)
    sem = asyncio.Semaphore(16)

    async def one(name: str, status: dict[str, Any]) -> None:
        async with sem:
            await custom.patch_namespaced_custom_object_status(
                "resource.k8s.io",
                "v1",
                ns,
                "resourceclaims",
                name,
                {"status": status},
                _content_type="application/merge-patch+json",
            )

    writes = [
        one(case.claim_name(claim, node), held_status(case, claim, node))
        for case in cases
        for claim in case.claims
        if claim.held is not None
        for node in case.nodes
    ]
    await asyncio.gather(*writes)
    return len(writes)


async def _settle(
    api: client.ApiClient, ns: str, names: set[str], tag: str
) -> dict[str, dict[str, Any]]:
    """The pods once each has a verdict and none changed for :data:`STABLE` seconds."""
    last: dict[str, str | None] = {}
    since = start = report = time.monotonic()
    changed: set[str] = set()
    while True:
        pods = {p["metadata"]["name"]: p for p in await list_pods(api, ns)}
        now = {n: verdict(pods[n]) if n in pods else None for n in names}
        t = time.monotonic()
        if now != last:
            changed = {n for n in names if now[n] != last.get(n)}
            last, since = now, t
        elif all(v is not None for v in now.values()) and t - since >= STABLE:
            return pods
        if t >= report:
            report = t + 15
            counts: dict[str, int] = {}
            for n, v in now.items():
                k = f"{scheduler_for(n[-len(KUBE_NODE) :])}:{v}"
                counts[k] = counts.get(k, 0) + 1
            print(f"{tag} {t - start:.0f}s: {sorted(counts.items())}, changed {len(changed)}")
        if t - start > SETTLE_WITHIN:
            waiting = sorted(n for n, v in now.items() if v is None)
            raise AssertionError(
                f"{tag} not settled within {SETTLE_WITHIN:.0f}s: {len(waiting)} pods without a "
                f"verdict {waiting[:10]}; last changed {sorted(changed)[:10]}"
            )
        await asyncio.sleep(1.0)


def _message(p: dict[str, Any]) -> str:
    for c in p.get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled":
            return str(c.get("message") or "")
    return ""


async def test_random_claims_agree_with_kube_scheduler(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    seed, source = choose_seed(os.environ)
    count = int(os.environ.get(CASES_ENV, DEFAULT_CASES))
    tag = f"[DRA seed {seed} ({source}); rerun with {SEED_ENV}={seed}]"
    print(tag)
    report_line(f"DRA random differential: {tag}, {count} cases")
    started = time.monotonic()
    cases = generate(seed, count)
    bodies = [o for case in cases for o in objects(case, ns)]
    # adminAccess needs the namespace label (API admission checks it).
    plane.run("label", "namespace", ns, "resource.kubernetes.io/admin-access=true")
    # JSON, not YAML: kubectl reads a bare y/n as a bool.
    plane.run(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": bodies})
    )
    held = await write_held(api, ns, cases)
    sched = plane.lattice().start()
    try:
        per_node = [case.pods(node) for case in cases for node in case.nodes]
        first = [bodies[0] for bodies in per_node]
        later = [body for bodies in per_node for body in bodies[1:]]
        pods = first + later
        # A shared claim's later pods come once the first has its verdict: they then find
        # the claim allocated (or not) and only reserve it. Created together, kube 1.34.4's
        # second pod can see the first's allocation still in flight, fail, and wait for the
        # 5-minute flush: no event follows the end of an in-flight allocation.
        await create_pods(api, ns, first)
        await _settle(api, ns, {p["metadata"]["name"] for p in first}, tag)
        if later:
            await create_pods(api, ns, later)
        settled = await _settle(api, ns, {p["metadata"]["name"] for p in pods}, tag)
        claims = await list_claims(api, ns)
    finally:
        sched.stop()
    elapsed = time.monotonic() - started

    def allocation(case: Case, node: str, claim_index: int) -> dict[str, Any] | None:
        body = claim_object(
            case, node, case.claims[claim_index], settled.get(_pod_name(case, node)), claims
        )
        return unstamped(((body or {}).get("status") or {}).get("allocation"))

    problems: list[str] = []
    realigned: list[str] = []
    validity_only = 0
    waited: list[str] = []
    timed_out: list[str] = []
    verdicts: dict[str, int] = {}
    for case in cases:
        kube_node, our_node = case.nodes
        v = {node: verdict(settled[_pod_name(case, node)]) for node in case.nodes}
        key = f"{case.kind}:{v[kube_node]}"
        verdicts[key] = verdicts.get(key, 0) + 1
        for kube_pod, our_pod in zip(
            case.pod_names(kube_node), case.pod_names(our_node), strict=True
        ):
            kv, ov = verdict(settled[kube_pod]), verdict(settled[our_pod])
            if kube_waits_after_deallocating(case, settled[kube_pod], ov):
                waited.append(f"{case.describe()} {kube_pod}")
                continue
            if kube_timed_out(settled[kube_pod]) and ov in (BOUND, "Unschedulable"):
                # No kube verdict to compare; a bound Lattice pod's devices are still
                # checked below.
                timed_out.append(f"{case.describe()} {kube_pod}: Lattice {ov}")
                continue
            if kv != ov:
                problems.append(
                    f"{case.describe()} {our_pod}: kube {kv} ({_message(settled[kube_pod])!r}), "
                    f"Lattice {ov} ({_message(settled[our_pod])!r}); reproducer: "
                    f"{json.dumps(reproducer(case, ns))}"
                )
        for node in case.nodes:
            allocs = [allocation(case, node, i) for i in range(len(case.claims))]
            who = "kube" if node == kube_node else "Lattice"
            if v[node] == BOUND:
                problems += [f"{case.describe()} {who}: {p}" for p in check_pod(case, node, allocs)]
            elif any(
                a is not None for a, c in zip(allocs, case.claims, strict=True) if c.held is None
            ):
                problems.append(f"{case.describe()} {who}: unbound ({v[node]}) but allocated")
            for name in case.pod_names(node):
                body = settled[name]
                if verdict(body) != BOUND:
                    continue
                used = [(c, claim_object(case, node, c, body, claims)) for c in case.used_claims()]
                problems += [f"{case.describe()} {who}: {p}" for p in check_reserved(body, used)]
        if v[kube_node] == v[our_node] == BOUND and not case.same_devices_expected:
            validity_only += 1
        elif v[kube_node] == v[our_node] == BOUND:
            for i in range(len(case.claims)):
                ours = without_share_ids(allocation(case, our_node, i))
                theirs = without_share_ids(allocation(case, kube_node, i))
                mapped = None if ours is None else as_kube(ours, our_node, kube_node)
                if mapped != theirs and mapped is not None and theirs is not None:
                    better = better_by_rule(case, mapped, theirs)
                    if better is not None:
                        realigned.append(f"{case.describe()} claim {i}: {better}")
                        continue
                if mapped != theirs:
                    problems.append(
                        f"{case.describe()} claim {i}: Lattice {mapped} != kube {theirs}; "
                        f"reproducer: {json.dumps(reproducer(case, ns))}"
                    )
    record = {
        "seed": seed,
        "cases": [
            {
                "case": case.describe(),
                "verdicts": {
                    node: [
                        verdict(settled[_pod_name(case, node)]),
                        _message(settled[_pod_name(case, node)]),
                    ]
                    for node in case.nodes
                },
                "objects": objects(case, ns),
            }
            for case in cases
        ],
    }
    out = plane.tmp / f"dra-random-{seed}.json"
    out.write_text(json.dumps(record, indent=1))
    print(f"{tag} cases, verdicts and messages: {out}")
    summary = ", ".join(f"{k}={n}" for k, n in sorted(verdicts.items()))
    summary += f"; {len(realigned)} allocations other than kube's, on no more PCIe roots"
    summary += f"; {held} claims allocated before their pods"
    summary += f"; {validity_only} bound pairs on two-slice pools (validity compared only)"
    summary += (
        f"; {len(waited)} held-elsewhere pods kube left waiting after its own deallocation"
        " while Lattice bound"
    )
    summary += f"; {len(timed_out)} pods kube's allocator timed out on"
    for line in timed_out:
        print(f"{tag} kube timed out: {line}")
    for line in realigned[:5]:
        print(f"{tag} Lattice's device order: {line}")
    report_line(f"DRA random differential {tag}: {elapsed:.0f}s; kube verdicts {summary}")
    print(f"{tag} {elapsed:.0f}s; {summary}")
    assert not problems, f"{tag} {len(problems)} problems:\n" + "\n".join(problems[:40])
    assert sched.proc is not None
    assert sched.proc.returncode == 0, tag


# The generator and the checker themselves (no cluster).


def test_the_generator_is_a_pure_function_of_the_seed_and_covers_every_kind() -> None:
    a, b = generate(5, DEFAULT_CASES), generate(5, DEFAULT_CASES)
    assert [objects(c, "ns") for c in a] == [objects(c, "ns") for c in b]
    assert [objects(c, "ns") for c in generate(6, 20)] != [objects(c, "ns") for c in a[:20]]
    assert {c.kind for c in a} == {k for k, _ in kinds()}
    assert {k for k, _ in kinds("v1.37.2")} == {k for k, _ in KINDS}
    assert not {k for k, _ in kinds("v1.35.4")} & set(NEW_IN_136)
    assert not {c.kind for c in generate(5, DEFAULT_CASES, "v1.35.4")} & set(NEW_IN_136)
    new = [c for c in generate(5, DEFAULT_CASES, "v1.37.2") if c.kind in NEW_IN_136]
    devices = [x for c in new for d in c.drivers for x in d.devices]
    effects = {t["effect"] for x in devices for t in x.get("taints") or []}
    assert effects == {"NoSchedule", "NoExecute", "None"}
    tolerations = [
        t
        for c in new
        for cl in c.claims
        for q in cl.requests
        for s in q.alternatives
        for t in s.tolerations
    ]
    assert {(t["operator"], "key" in t, "effect" in t) for t in tolerations} >= {
        ("Exists", False, False),
        ("Exists", True, True),
        ("Equal", True, False),
        ("Equal", True, True),
    }
    assert any(c.claims[0].requests[0].first_available and c.kind == "tainted" for c in new)
    for c in new:
        # kube-controller-manager evicts a pod whose NoExecute device is tolerated only by
        # an effect-less toleration: such cases would leave no pod to compare.
        if any(
            t["effect"] == "NoExecute"
            for d in c.drivers
            for x in d.devices
            for t in x.get("taints") or []
        ):
            subs = [s for cl in c.claims for q in cl.requests for s in q.alternatives]
            assert all("effect" in t for s in subs for t in s.tolerations), c.describe()
    partitioned = [c for c in new if c.kind == "partitioned"]
    assert not any(PCIE_ROOT in x["attributes"] for x in devices)
    assert all(
        d.counters and all(x.get("consumesCounters") for x in d.devices)
        for c in partitioned
        for d in c.drivers
    )
    assert any(len(c.claims) == 2 for c in partitioned)
    slices = [o for o in objects(partitioned[0], "ns") if o["kind"] == "ResourceSlice"]
    assert [("sharedCounters" in o["spec"], "devices" in o["spec"]) for o in slices] == [
        (True, False),
        (False, True),
    ] * 2
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in slices} == {2}
    shares = [c for c in new if c.kind == "shares"]
    memory = [x["capacity"]["memory"] for c in shares for d in c.drivers for x in d.devices]
    policies = {tuple(sorted(m.get("requestPolicy") or {})) for m in memory}
    assert policies == {(), ("default",), ("default", "validRange"), ("default", "validValues")}
    multiple = {
        x.get("allowMultipleAllocations", False) for c in shares for x in c.drivers[0].devices
    }
    assert multiple == {True, False}
    assert any(k.distinct for c in shares for cl in c.claims for k in cl.constraints)
    asks = [
        s.capacity for c in shares for cl in c.claims for q in cl.requests for s in q.alternatives
    ]
    assert None in asks
    assert any(ask is not None for ask in asks)
    assert all(len(d.devices) <= 16 for c in a for d in c.drivers)
    assert any(c.side for c in a)
    assert all(c.side for c in a if any(d.slice_count > 1 and not d.split for d in c.drivers))
    assert not any(c.side for c in a if any(d.split for d in c.drivers))
    claims = [cl for c in a for cl in c.claims]
    assert any(cl.template for cl in claims)
    assert {(cl.unused, cl.held_elsewhere) for cl in claims if cl.held} == {
        (False, False),
        (True, False),
        (False, True),
    }
    assert any(c.pods_per_node > 1 for c in a)
    assert any(c.pods_per_node > 1 and c.claims[0].held for c in a)
    per_pair: dict[tuple[str, str], int] = {}
    for c in a:
        per_pair[c.nodes] = per_pair.get(c.nodes, 0) + c.pods_per_node
    assert len(per_pair) == NODE_PAIRS
    assert max(per_pair.values()) <= 100, "a kwok node holds 110 pods"


def test_only_kube_allocator_timeouts_count_as_no_verdict() -> None:
    def pod(reason: str, message: str) -> dict[str, Any]:
        cond = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        return {"spec": {}, "status": {"conditions": [cond]}}

    timeout = (
        'running "DynamicResources" filter plugin: node kwok-node-0005: '
        "timed out trying to allocate devices"
    )
    assert kube_timed_out(pod("SchedulerError", timeout))
    assert not kube_timed_out(pod("SchedulerError", "claim ns/c: class gpu not found"))
    assert not kube_timed_out(pod("Unschedulable", "cannot allocate all claims"))
    assert not kube_timed_out({"spec": {"nodeName": "n"}, "status": {}})


def test_held_shared_template_and_two_slice_cases_have_the_objects_they_say() -> None:
    by_kind: dict[str, list[Case]] = {}
    for c in generate(12, DEFAULT_CASES):  # a seed that draws every variant read below
        by_kind.setdefault(c.kind, []).append(c)
    held = next(c for c in by_kind["held"] if c.claims[0].held_elsewhere)
    (claim,) = [o for o in objects(held, "ns") if o["kind"] == "ResourceClaim"][:1]
    pinned_to = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
    assert pinned_to["matchFields"][0]["values"] == ["kwok-node-elsewhere"]
    assert check_pod(held, held.nodes[0], [claim["status"]["allocation"]])
    blocking = next(c for c in by_kind["held"] if c.claims[0].unused)
    assert len(blocking.pods(blocking.nodes[1])) == 1
    (spec,) = [p["spec"]["resourceClaims"] for p in blocking.pods(blocking.nodes[1])]
    assert [e["resourceClaimName"] for e in spec] == [
        blocking.claim_name(blocking.claims[1], blocking.nodes[1])
    ]
    shared = next(c for c in by_kind["shared"])
    node = shared.nodes[0]
    bodies = shared.pods(node)
    assert len(bodies) == shared.pods_per_node > 1
    assert len({b["metadata"]["name"] for b in bodies}) == len(bodies)
    assert {b["spec"]["resourceClaims"][0]["resourceClaimName"] for b in bodies} == {
        shared.claim_name(shared.claims[0], node)
    }
    template = by_kind["template"][0]
    kinds = {o["kind"] for o in objects(template, "ns")}
    assert "ResourceClaimTemplate" in kinds
    assert "ResourceClaim" not in kinds
    entry = template.pods(template.nodes[0])[0]["spec"]["resourceClaims"][0]
    assert entry["resourceClaimTemplateName"] == template.claim_name(
        template.claims[0], template.nodes[0]
    )
    split = by_kind["multi-slice"][0]
    slices = [o for o in objects(split, "ns") if o["kind"] == "ResourceSlice"]
    assert len(slices) == 4
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    mine = [s for s in slices if s["spec"]["nodeName"] == split.nodes[0]]
    names = sorted(x["name"] for s in mine for x in s["spec"]["devices"])
    assert names == sorted(x["name"] for x in split.drivers[0].devices)


def _small_case() -> tuple[Case, dict[str, Any]]:
    driver = Driver(
        name="t.dra.lattice.dev",
        cls="t-gpu",
        devices=[
            {"name": f"dev-{i}", "attributes": {"numa": {"int": i % 2}, "model": {"string": m}}}
            for i, m in enumerate(("A100", "H100", "A100", "A100"))
        ],
    )
    sub = Sub("", "t-gpu", [Sel("model-eq", ("==", "A100"))], count=2)
    claim = Claim("", [Request("gpu", [sub])], [Constraint([], "t.dra.lattice.dev/numa")])
    case = Case(0, "exact", [driver], [claim])
    node = case.nodes[1]
    good = {
        "devices": {
            "results": [
                {"request": "gpu", "driver": driver.name, "pool": driver.pool(node), "device": d}
                for d in ("dev-0", "dev-2")
            ],
            "config": expected_config(case, claim, {"gpu": sub}),
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }
    return case, good


def test_the_checker_accepts_a_valid_allocation_and_rejects_each_kind_of_invalid_one() -> None:
    case, good = _small_case()
    node = case.nodes[1]
    assert check_pod(case, node, [good]) == []

    def broken(change: Any) -> list[str]:
        bad = json.loads(json.dumps(good))
        change(bad["devices"])
        return check_pod(case, node, [bad])

    def set_device(i: int, name: str) -> Any:
        return lambda d: d["results"][i].update(device=name)

    assert broken(set_device(1, "dev-1")), "H100 fails the selector"
    assert broken(set_device(1, "dev-3")), "numa 1 breaks the matchAttribute"
    assert broken(set_device(1, "dev-0")), "a device twice"
    assert broken(set_device(1, "dev-9")), "no such device"
    assert broken(lambda d: d["results"].pop()), "count 2"
    assert broken(lambda d: d["results"][0].update(pool="elsewhere")), "another pool"
    assert broken(lambda d: d["results"][0].update(adminAccess=True)), "not adminAccess"
    assert broken(lambda d: d["results"][0].update(request="gpu/s0")), "no subrequests"
    assert broken(lambda d: d.pop("config")), "config copied"
    assert check_pod(case, node, [None]), "bound without an allocation"
    assert check_pod(case, node, [{**good, "nodeSelector": None}])


def test_toleration_matching_follows_kube() -> None:
    taint = {"key": "k", "value": "a", "effect": "NoSchedule"}
    assert tolerates({"operator": "Exists"}, taint)
    assert tolerates({"operator": "Exists", "key": "k"}, taint)
    assert not tolerates({"operator": "Exists", "key": "j"}, taint)
    assert not tolerates({"operator": "Exists", "effect": "NoExecute"}, taint)
    assert tolerates({"operator": "Exists", "effect": "NoSchedule"}, taint)
    assert tolerates({"operator": "Equal", "key": "k", "value": "a"}, taint)
    assert tolerates({"key": "k", "value": "a"}, taint), "Equal is the default"
    assert not tolerates({"operator": "Equal", "key": "k", "value": "b"}, taint)
    assert not tolerates({"operator": "Equal", "key": "k"}, taint), "absent value is empty"
    assert tolerates({"operator": "Equal", "key": "k"}, {"key": "k", "effect": "NoExecute"})
    assert not tolerates({"operator": "Lt", "key": "k", "value": "a"}, taint)


def _tainted_and_partitioned() -> tuple[Case, dict[str, Any], dict[str, Any]]:
    """Two claims over a pool of four devices sharing 8 counters: dev-0 (needs 8, NoSchedule
    k=a), dev-1 (4, NoExecute j), dev-2 (4, None k=b) and dev-3 (4, untainted); claim 0
    tolerates k=a and takes dev-0 alone; claim 1 takes one more device."""

    def dev(i: int, used: int, taints: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "name": f"dev-{i}",
            "attributes": {"model": {"string": "A100"}},
            "taints": taints,
            "consumesCounters": [
                {"counterSet": COUNTER_SET, "counters": {"compute": {"value": str(used)}}}
            ],
        }

    driver = Driver(
        name="p.dra.lattice.dev",
        cls="p-gpu",
        devices=[
            dev(0, 8, [{"key": "k", "value": "a", "effect": "NoSchedule"}]),
            dev(1, 4, [{"key": "j", "effect": "NoExecute"}]),
            dev(2, 4, [{"key": "k", "value": "b", "effect": "None"}]),
            dev(3, 4, []),
        ],
        counters={"compute": "8"},
    )
    tol = [{"key": "k", "operator": "Equal", "value": "a"}]
    first = Sub("", "p-gpu", count=1, tolerations=tol)
    second = Sub("", "p-gpu", count=1)
    claims = [Claim("", [Request("gpu", [first])]), Claim("-b", [Request("gpu", [second])])]
    case = Case(1, "tainted", [driver], claims)
    node = case.nodes[1]
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }

    def alloc(claim: Claim, sub: Sub, device: str) -> dict[str, Any]:
        result: dict[str, Any] = {"request": "gpu", "driver": driver.name, "device": device}
        result["pool"] = driver.pool(node)
        if sub.tolerations:
            result["tolerations"] = sub.tolerations
        return {
            "devices": {
                "results": [result],
                "config": expected_config(case, claim, {"gpu": sub}),
            },
            "nodeSelector": selector,
        }

    return case, alloc(claims[0], first, "dev-0"), alloc(claims[1], second, "dev-2")


def test_the_checker_enforces_device_taints_tolerations_and_shared_counters() -> None:
    case, first, second = _tainted_and_partitioned()
    node = case.nodes[1]
    assert check_pod(case, node, [first, None]) == [
        "c1-b-" + node + ": pod bound but claim not allocated"
    ]
    alone = Case(1, "tainted", case.drivers, case.claims[:1])
    assert check_pod(alone, node, [first]) == [], "dev-0's taint is tolerated"

    def with_device(a: dict[str, Any], name: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(json.dumps(a))
        out["devices"]["results"][0]["device"] = name
        return out

    assert check_pod(alone, node, [with_device(first, "dev-2")]) == [], "None never blocks"
    assert check_pod(alone, node, [with_device(first, "dev-3")]) == []
    assert check_pod(alone, node, [with_device(first, "dev-1")]), "NoExecute j not tolerated"
    second_alone = Case(1, "tainted", case.drivers, case.claims[1:])
    assert check_pod(second_alone, node, [second]) == []
    assert check_pod(second_alone, node, [with_device(second, "dev-0")]), "k=a not tolerated"
    untold = json.loads(json.dumps(first))
    del untold["devices"]["results"][0]["tolerations"]
    assert check_pod(alone, node, [untold]), "the result copies the request's tolerations"
    extra = json.loads(json.dumps(second))
    extra["devices"]["results"][0]["tolerations"] = [{"operator": "Exists"}]
    assert check_pod(second_alone, node, [extra]), "no tolerations where the request has none"
    assert check_pod(case, node, [first, second]), "8 + 4 of 8 compute: over-spent"
    assert check_pod(case, node, [with_device(first, "dev-3"), second]) == [], "4 + 4 of 8"
    three = json.loads(json.dumps(second))
    three["devices"]["results"].append({**three["devices"]["results"][0], "device": "dev-3"})
    two = Case(
        1, "tainted", case.drivers, [Claim("", [Request("gpu", [Sub("", "p-gpu", count=2)])])]
    )
    assert check_pod(two, node, [three]) == [], "dev-2 + dev-3: 8 of 8"
    admin = json.loads(json.dumps(first))
    admin["devices"]["results"][0]["adminAccess"] = True
    assert check_pod(case, node, [admin, second]), "adminAccess: not an admin request"


def test_the_checker_enforces_shares_of_consumable_capacity() -> None:
    """Shares (1.36+): the rounded consumption, a UUID shareID, the device's capacity over
    the pod's claims, and distinctAttribute; a device allowing one allocation has neither
    field."""
    range_policy = {
        "default": "8Gi",
        "validRange": {"min": "4Gi", "max": "16Gi", "step": "4Gi"},
    }

    def dev(i: int, policy: dict[str, Any] | None, multiple: bool = True) -> dict[str, Any]:
        memory: dict[str, Any] = {"value": "16Gi"}
        if policy is not None:
            memory["requestPolicy"] = policy
        body: dict[str, Any] = {
            "name": f"dev-{i}",
            "attributes": {"uid": {"string": f"u{i}"}},
            "capacity": {"memory": memory},
        }
        if multiple:
            body["allowMultipleAllocations"] = True
        return body

    driver = Driver(
        "s.dra.lattice.dev", "s-gpu", [dev(0, range_policy), dev(1, None), dev(2, None, False)]
    )
    a = Sub("", "s-gpu", capacity={"memory": "6Gi"})
    b = Sub("", "s-gpu")
    claim = Claim("", [Request("a", [a]), Request("b", [b])])
    case = Case(2, "shares", [driver], [claim])
    node = case.nodes[1]
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }

    def result(request: str, device: str, consumed: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"request": request, "driver": driver.name}
        out.update(pool=driver.pool(node), device=device)
        if consumed is not None:
            out["shareID"] = "0b4f5a0e-8a8f-4a4c-9f53-3d0ad1b2c3d4"
            out["consumedCapacity"] = {"memory": consumed}
        return out

    def alloc(*results: dict[str, Any]) -> dict[str, Any]:
        chosen = {"a": a, "b": b}
        config = expected_config(case, claim, chosen)
        return {"devices": {"results": list(results), "config": config}, "nodeSelector": selector}

    # 6Gi rounds up to 8Gi; the omitted request takes the default 8Gi: 16Gi of 16Gi.
    good = alloc(result("a", "dev-0", "8Gi"), result("b", "dev-0", "8589934592"))
    assert check_pod(case, node, [good]) == []
    assert check_pod(case, node, [alloc(result("a", "dev-0", "6Gi"), result("b", "dev-0", "8Gi"))])
    no_id = json.loads(json.dumps(good))
    no_id["devices"]["results"][0]["shareID"] = "share-1"
    assert check_pod(case, node, [no_id]), "a shareID is a UUID"
    # No policy: an omitted request takes the whole 16Gi, so the two overspend dev-1.
    whole = alloc(result("a", "dev-1", "6Gi"), result("b", "dev-1", "16Gi"))
    assert any("shares consume" in p for p in check_pod(case, node, [whole]))
    plain = alloc(result("a", "dev-0", "8Gi"), result("b", "dev-2", None))
    assert check_pod(case, node, [plain]) == [], "one allocation: no share fields"
    shared_plain = alloc(result("a", "dev-0", "8Gi"), result("b", "dev-2", "16Gi"))
    assert check_pod(case, node, [shared_plain]), "dev-2 allows one allocation"
    claim.constraints.append(Constraint([], "s.dra.lattice.dev/uid", distinct=True))
    assert any("distinct" in p for p in check_pod(case, node, [good]))
    apart = alloc(result("a", "dev-0", "8Gi"), result("b", "dev-1", "16Gi"))
    assert check_pod(case, node, [apart]) == []


def test_selector_truth_follows_kube_semantics_for_the_generator_forms() -> None:
    dev = {
        "name": "d",
        "attributes": {
            "fw": {"version": "1.2.0+b1"},
            "numa": {"int": 1},
            "tag": {"string": "a"},
            "model": {"string": "H100"},
        },
        "capacity": {"memory": {"value": "40Gi"}},
    }
    drv = "x.dra.lattice.dev"
    assert Sel("fw", ("eq", "1.2.0")).truth(dev, drv), "build metadata is ignored"
    assert Sel("fw", ("isGreaterThan", "2.0.0-rc.1")).truth(dev, drv) is False
    assert Sel("fw", ("isLessThan", "2.0.0-rc.1")).truth(dev, drv)
    assert Sel("memory", ("eq", "40960Mi")).truth(dev, drv), "quantities compare by value"
    assert Sel("memory", ("compareTo", "16Gi")).truth(dev, drv)
    assert Sel("tag-int", (1,)).truth(dev, drv) is False, "a string is not equal to an int"
    assert Sel("other-has").truth(dev, drv) is False
    assert Sel("other-not-has").truth(dev, drv)
    assert Sel("model-in", ("A100", "H100")).truth(dev, drv)
    assert 'in ["A100", "H100"]' in Sel("model-in", ("A100", "H100")).cel(drv)
    for kind in ("unknown-key", "unknown-capacity", "other-get"):
        with pytest.raises(SelectorError):
            Sel(kind).truth(dev, drv)
    with pytest.raises(SelectorError):
        Sel("opt-eq", ("x",)).truth(dev, drv)


def _all_fallback(index: int, first_count: int) -> Case:
    """firstAvailable [s0: ``first_count`` B200s (there are none), s1: All] over 2 A100s."""
    driver = Driver(
        name=f"c{index}-gpu.dra.lattice.dev",
        cls=f"c{index}-gpu",
        devices=[{"name": f"dev-{i}", "attributes": {"model": {"string": "A100"}}} for i in (0, 1)],
    )
    subs = [
        Sub("s0", driver.cls, [Sel("model-eq", ("==", "B200"))], count=first_count),
        Sub("s1", driver.cls, mode="All"),
    ]
    return Case(index, "all-fallback", [driver], [Claim("", [Request("gpu", subs, True)])])


async def test_an_all_subrequest_after_the_first_takes_every_device_as_in_kube_136(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    """kube 1.34.4 and 1.35.4 (DRA lib structured allocator): the All branch of
    ``allocateOne`` recursed with ``deviceIndices{claimIndex, requestIndex, deviceIndex+1}``,
    dropping ``subRequestIndex``, so an All subrequest other than the first continued after
    its first device with subrequest 0's data: with s0 asking for 1 device it stopped there
    (bound with one of the two devices, not All); with s0 asking for 3 it looked for two more
    s0 devices and failed (Unschedulable). dynamic-resource-allocation v0.36 keeps
    ``subRequestIndex`` (``allocator_incubating.go``), so from 1.36 kube takes every matching
    device, as Lattice does in every release. On 1.35 this test pins kube's bug; on 1.36+
    both schedulers agree."""
    cases = [_all_fallback(9000, 1), _all_fallback(9001, 3)]  # names apart from the random cases'
    bodies = [o for case in cases for o in objects(case, ns)]
    plane.run(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": bodies})
    )
    sched = plane.lattice().start()
    try:
        await create_pods(
            api,
            ns,
            [pinned(c.name, n, [c.claim_name(c.claims[0], n)]) for c in cases for n in c.nodes],
        )
        names = {_pod_name(c, n) for c in cases for n in c.nodes}
        settled = await _settle(api, ns, names, "[all-fallback]")
        claims = await list_claims(api, ns)
    finally:
        sched.stop()

    def written(case: Case, node: str) -> list[str] | None:
        status = claims[case.claim_name(case.claims[0], node)].get("status") or {}
        if "allocation" not in status:
            return None
        return [f"{r['request']}:{r['device']}" for r in status["allocation"]["devices"]["results"]]

    for case in cases:
        our_node = case.nodes[1]
        assert verdict(settled[_pod_name(case, our_node)]) == BOUND
        assert written(case, our_node) == ["gpu/s1:dev-0", "gpu/s1:dev-1"]
        assert (
            check_pod(
                case,
                our_node,
                [claims[case.claim_name(case.claims[0], our_node)]["status"]["allocation"]],
            )
            == []
        )
    one, three = cases
    if kubernetes_version() >= "v1.36":
        for case in cases:
            kube_node = case.nodes[0]
            assert verdict(settled[_pod_name(case, kube_node)]) == BOUND
            assert written(case, kube_node) == ["gpu/s1:dev-0", "gpu/s1:dev-1"]
        return
    assert verdict(settled[_pod_name(one, one.nodes[0])]) == BOUND
    assert written(one, one.nodes[0]) == ["gpu/s1:dev-0"], "kube's All took one device"
    assert verdict(settled[_pod_name(three, three.nodes[0])]) == "Unschedulable"
    assert written(three, three.nodes[0]) is None
