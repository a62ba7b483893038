"""The hostile-DRA benchmark's pure parts: its objects and its percentile."""

from __future__ import annotations

import itertools

import pytest

from lattice_dev.benchmarks.hostile_dra import (
    CLASS,
    DEVICES,
    DRIVER,
    PER_CLAIM,
    hostile_pod,
    percentile,
    slice_body,
    template,
)
from scheduler.core.dra.allocator import AllocationError, Allocator, SliceIndex
from scheduler.core.dra.cel import SelectorCompiler
from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice


def test_the_hostile_pod_asks_more_than_a_node_has_in_claims_that_each_fit() -> None:
    body = slice_body("hostile-0001")
    parsed = ResourceSlice.from_api(body)
    assert parsed.node_name == "hostile-0001"
    assert len(parsed.devices) == DEVICES
    claims = hostile_pod()["spec"]["resourceClaims"]
    assert len(claims) * PER_CLAIM > DEVICES >= PER_CLAIM
    (request,) = template()["spec"]["spec"]["devices"]["requests"]
    assert [sub["count"] for sub in request["firstAvailable"]] == [PER_CLAIM]


def test_only_the_search_can_refuse_the_hostile_pod() -> None:
    """The bench measures a search that runs to its limit: the allocator's count check
    must not refuse the pod up front (it would, were the claims plain ExactCount)."""
    ticks = itertools.count()
    allocator = Allocator(
        classes={
            CLASS: DeviceClass.from_api(
                {
                    "metadata": {"name": CLASS},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
                    },
                }
            )
        },
        slices=SliceIndex([ResourceSlice.from_api(slice_body("hostile-0001"))]),
        allocated=frozenset(),
        compiler=SelectorCompiler(),
        timeout=1000.0,
        clock=lambda: float(next(ticks)),
        kube_minor=37,
    )
    spec = template()["spec"]["spec"]
    claims = [
        ResourceClaim.from_api({"metadata": {"name": ref["name"]}, "spec": spec})
        for ref in hostile_pod()["spec"]["resourceClaims"]
    ]
    with pytest.raises(AllocationError, match="timed out trying to allocate devices"):
        allocator.allocate("hostile-0001", {}, claims)
    assert next(ticks) >= 1000, "searched until the deadline"


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0], 99) == 3.0
