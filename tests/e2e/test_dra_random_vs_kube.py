"""Random DRA claims: Lattice reaches kube-scheduler v1.34.4's verdict and allocation.

Hundreds of seeded random cases (:mod:`tests.e2e.differential.dra_gen`: counts, All over
complete and incomplete pools, firstAvailable, matchAttribute on string/int/version/mixed
and sometimes-missing attributes, scoped constraints, a GPU+NIC pair over two drivers on
``resource.kubernetes.io/pcieRoot``, adminAccess, CEL selectors of many forms including
kube's runtime errors, 33 devices, an older pool generation, a missing class) run on one
plane in one go, each on disjoint devices as in ``test_dra_vs_kube.py``: kube-scheduler's
pod pinned to one node, Lattice's to the other. Once every pod's verdict (bound, or the
reason of PodScheduled=False) has held still for :data:`STABLE` seconds:

* both pods of a case have the same verdict;
* a bound pair's written ``status.allocation`` is equal once node and pool names are
  mapped (one pool of one slice per driver on the node: kube's first fit is deterministic);
* every allocation either scheduler wrote passes the independent checker
  (:mod:`tests.e2e.differential.dra_check`), and an unbound pod's claims stay unallocated.

The seed is ``LATTICE_DRA_SEED`` if set, else drawn per run; it is printed and named in
every assertion message. ``LATTICE_DRA_CASES`` changes the case count (default 300).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from typing import Any, Final

import pytest
from kubernetes_asyncio import client

from tests.conftest import report_line
from tests.e2e.differential.dra_cases import (
    BOUND,
    KUBE_NODE,
    as_kube,
    dra_plane,
    list_claims,
    pinned,
    scheduler_for,
    verdict,
)
from tests.e2e.differential.dra_check import check_pod
from tests.e2e.differential.dra_gen import Case, generate, objects, reproducer
from tests.e2e.test_scheduler import Plane, create_pods, list_pods

SEED_ENV: Final = "LATTICE_DRA_SEED"
CASES_ENV: Final = "LATTICE_DRA_CASES"
DEFAULT_CASES: Final = 300
STABLE: Final = 6.0
"""Seconds every verdict must hold still (Unschedulable and SchedulerError pods retry)."""
SETTLE_WITHIN: Final = 240.0


def choose_seed(env: dict[str, str] | os._Environ[str]) -> tuple[int, str]:
    raw = env.get(SEED_ENV, "").strip()
    if raw:
        return int(raw), SEED_ENV
    return time.time_ns() // 1000 % (1 << 31), "drawn"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with dra_plane(tmp_path_factory.mktemp("dra-random"), nodes=4) as p:
        yield p


def _pod_name(case: Case, node: str) -> str:
    return f"{case.name}-{node}"


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
    sched = plane.lattice().start()
    try:
        pods = [
            pinned(case.name, node, [case.claim_name(c, node) for c in case.claims])
            for case in cases
            for node in case.nodes
        ]
        await create_pods(api, ns, pods)
        settled = await _settle(api, ns, {p["metadata"]["name"] for p in pods}, tag)
        claims = await list_claims(api, ns)
    finally:
        sched.stop()
    elapsed = time.monotonic() - started

    def allocation(case: Case, node: str, claim_index: int) -> dict[str, Any] | None:
        body = claims[case.claim_name(case.claims[claim_index], node)]
        alloc: dict[str, Any] | None = (body.get("status") or {}).get("allocation")
        return alloc

    problems: list[str] = []
    verdicts: dict[str, int] = {}
    for case in cases:
        kube_node, our_node = case.nodes
        v = {node: verdict(settled[_pod_name(case, node)]) for node in case.nodes}
        key = f"{case.kind}:{v[kube_node]}"
        verdicts[key] = verdicts.get(key, 0) + 1
        if v[kube_node] != v[our_node]:
            problems.append(
                f"{case.describe()}: kube {v[kube_node]} "
                f"({_message(settled[_pod_name(case, kube_node)])!r}), Lattice {v[our_node]} "
                f"({_message(settled[_pod_name(case, our_node)])!r}); reproducer: "
                f"{json.dumps(reproducer(case, ns))}"
            )
        for node in case.nodes:
            allocs = [allocation(case, node, i) for i in range(len(case.claims))]
            who = "kube" if node == kube_node else "Lattice"
            if v[node] == BOUND:
                problems += [f"{case.describe()} {who}: {p}" for p in check_pod(case, node, allocs)]
            elif any(a is not None for a in allocs):
                problems.append(f"{case.describe()} {who}: unbound ({v[node]}) but allocated")
        if v[kube_node] == v[our_node] == BOUND:
            for i in range(len(case.claims)):
                ours, theirs = allocation(case, our_node, i), allocation(case, kube_node, i)
                mapped = None if ours is None else as_kube(ours, our_node, kube_node)
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
    report_line(f"DRA random differential {tag}: {elapsed:.0f}s; kube verdicts {summary}")
    print(f"{tag} {elapsed:.0f}s; {summary}")
    assert not problems, f"{tag} {len(problems)} problems:\n" + "\n".join(problems[:40])
    assert sched.proc is not None
    assert sched.proc.returncode == 0, tag
