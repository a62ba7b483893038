"""The device search budget: one attempt's search over all its nodes ends in time, says
why, and a deferred search leaves its nodes to a worker and is decided again."""

from __future__ import annotations

import dataclasses
import time

import pytest

from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.core.dra.search import (
    BUSY_PAUSE,
    PAUSE,
    UNSCHEDULABLE,
    UNSCHEDULABLE_AND_UNRESOLVABLE,
    WORK_SLICE,
    DeviceSearch,
    Fit,
    feasible_to_find,
    run_jobs,
)
from scheduler.core.dra.state import DraState
from scheduler.core.explain import Decision
from scheduler.core.framework import Code
from scheduler.core.plugins.dynamic_resources import remember
from scheduler.core.profile import DEFAULT_PROFILE, DynamicResourcesArgs
from scheduler.core.schedule import Framework
from scheduler.model.pod import Pod
from tests.builders import cluster, make_node, make_pod
from tests.core.dra.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
)

BUDGET = 0.3
"""Seconds: far below kube's 10 s per node, so only the budget can end these searches."""
HOSTILE = 16
"""Devices on a hostile node: two claims of 9 each fit alone, together they do not, and
only the search can tell (it walks subsets of 16, or orders before 1.36): each a
firstAvailable list of one, which the allocator's count check leaves to the search."""


def framework(kube_minor: int, budget: float = BUDGET) -> Framework:
    return Framework(
        dataclasses.replace(
            DEFAULT_PROFILE,
            kube_minor=kube_minor,
            dynamic_resources=DynamicResourcesArgs(search_budget=budget),
        )
    )


def dra_state(devices: dict[str, int]) -> DraState:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    for node, n in devices.items():
        body = resource_slice(f"{node}-gpus", [device(f"gpu-{i}") for i in range(n)], node=node)
        dra.set_slice(ResourceSlice.from_api(body))
    for name in ("a", "b"):
        nine = first_available("gpu", ("nine", exactly("gpu", count=9)))
        dra.set_claim(ResourceClaim.from_api(claim(name, nine)))
    return dra


def hostile_pod() -> Pod:
    pod = make_pod("p", cpu="100m")
    pod.body["spec"]["resourceClaims"] = [
        {"name": "a", "resourceClaimName": "a"},
        {"name": "b", "resourceClaimName": "b"},
    ]
    return pod.build()


def decide(
    fw: Framework, devices: dict[str, int], dra: DraState, search: DeviceSearch | None = None
) -> tuple[Decision, float]:
    nodes = [make_node(name, cpu="8", memory="16Gi") for name in devices]
    started = time.monotonic()
    decision = fw.schedule(cluster(nodes), hostile_pod(), dra=dra, search=search)
    return decision, time.monotonic() - started


def test_the_status_codes_are_the_frameworks() -> None:
    assert Code(UNSCHEDULABLE) is Code.UNSCHEDULABLE
    assert Code(UNSCHEDULABLE_AND_UNRESOLVABLE) is Code.UNSCHEDULABLE_AND_UNRESOLVABLE


def test_on_1_35_the_budget_ends_the_attempt_as_unschedulable_naming_it() -> None:
    """1.35: a node kube's search gives up on does not fit, so the budget's end is an
    Unschedulable over the nodes not searched (10 s per node without it: 60 s)."""
    devices = {f"n{i}": HOSTILE for i in range(6)}
    decision, took = decide(framework(35), devices, dra_state(devices))
    assert took < BUDGET + 1.0
    assert decision.selected is None
    # Unresolvable: preemption's dry runs could not search these nodes either.
    assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert decision.summary.startswith(
        "0/6 nodes are available: 6 node(s) not searched: the device search budget "
        "(0.3s per attempt) ran out after 1 node(s)."
    )


@pytest.mark.parametrize("kube_minor", [36, 37])
def test_from_1_36_a_node_search_the_budget_ends_is_an_error_of_the_attempt(
    kube_minor: int,
) -> None:
    """From 1.36 kube's search that does not end is an error of the attempt (backoff)."""
    devices = {f"n{i}": HOSTILE for i in range(6)}
    decision, took = decide(framework(kube_minor), devices, dra_state(devices))
    assert took < BUDGET + 1.0
    assert decision.code is Code.ERROR
    assert "node n0: the device search budget (0.3s per attempt) ran out" in decision.summary


def test_nodes_found_before_the_budget_ran_out_still_place_the_pod() -> None:
    """18 devices take both claims at once; the 16-device nodes after it exhaust the
    budget, and the pod goes where it fits."""
    devices = {"n0": 18, **{f"n{i}": HOSTILE for i in range(1, 4)}}
    decision, took = decide(framework(35), devices, dra_state(devices))
    assert took < BUDGET + 1.0
    assert decision.selected == "n0"


def test_a_deferred_search_leaves_its_nodes_to_the_worker_then_decides_from_the_memo() -> None:
    devices = {"n0": 4, "n1": 18, "n2": 20}
    dra = dra_state(devices)
    fw = framework(37, budget=5.0)
    search = DeviceSearch(5.0, deferred=True)
    first, _ = decide(fw, devices, dra, search)
    jobs = search.take_jobs()
    assert [j.node for j in jobs] == ["n0", "n1", "n2"]
    assert first.selected is None
    assert search.searched == 0, "the filter searched nothing itself"
    run_jobs(search, jobs, None)
    fits = {j.node for j in jobs if isinstance(search.outcomes.get(j.key), Fit)}
    assert fits == {"n1", "n2"}
    for job in jobs:
        outcome = search.outcomes.get(job.key)
        if outcome is not None:
            remember(dra, job.key, outcome)
    again, _ = decide(fw, devices, dra, search)
    assert search.take_jobs() == []
    assert again.selected in {"n1", "n2"}


def test_a_deferred_search_stops_once_enough_nodes_fit() -> None:
    devices = {f"n{i}": 18 for i in range(5)}
    dra = dra_state(devices)
    fw = framework(37, budget=5.0)
    search = DeviceSearch(5.0, deferred=True, enough=2)
    decide(fw, devices, dra, search)
    jobs = search.take_jobs()
    assert len(jobs) == 5
    run_jobs(search, jobs, search.enough)
    assert search.searched == 2
    for job in jobs:
        outcome = search.outcomes.get(job.key)
        if outcome is not None:
            remember(dra, job.key, outcome)
    decision, _ = decide(fw, devices, dra, search)
    assert search.take_jobs() == []
    assert decision.selected in {"n0", "n1"}
    assert decision.explanation.node("n4").reasons == (
        "node(s) not searched: 2 node(s) with devices for the pod found already",
    )


def test_an_abandoned_search_stops_at_its_next_look_at_the_clock() -> None:
    devices = {f"n{i}": HOSTILE for i in range(3)}
    dra = dra_state(devices)
    search = DeviceSearch(30.0, deferred=True)
    decide(framework(35, budget=30.0), devices, dra, search)
    jobs = search.take_jobs()
    search.abandon()
    started = time.monotonic()
    run_jobs(search, jobs, None)
    assert time.monotonic() - started < 0.5
    assert search.outcomes == {}


def test_the_worker_pauses_longer_while_the_loop_has_pods_to_schedule() -> None:
    """The worker lets the GIL go after each slice of search: briefly while the loop is
    idle, for BUSY_PAUSE while it has cycles to run, so plain pods' cycles come first."""
    now = [0.0]
    slept: list[float] = []
    busy = [False]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    search = DeviceSearch(10.0, clock=lambda: now[0], loop_busy=lambda: busy[0], sleep=sleep)
    for step in range(40):  # 40 looks at the clock, 0.5 ms of search apart
        busy[0] = step >= 20
        now[0] += WORK_SLICE / 4
        search.yielding_now()
    assert slept == [PAUSE] * 5 + [BUSY_PAUSE] * 5
    assert BUSY_PAUSE >= 4 * WORK_SLICE  # the loop gets at least 80 % while busy


@pytest.mark.parametrize(
    ("nodes", "percentage", "expected"),
    [
        (50, 0, 50),  # under 100 nodes: all of them
        (1000, 0, 420),  # adaptive: 50 - 1000/125 = 42 %
        (1000, 10, 100),  # never fewer than 100
        (10_000, 0, 500),  # adaptive floor: 5 %
        (1000, 100, 1000),
    ],
)
def test_feasible_to_find_is_kubes_num_feasible_nodes_to_find(
    nodes: int, percentage: int, expected: int
) -> None:
    assert feasible_to_find(nodes, percentage) == expected
