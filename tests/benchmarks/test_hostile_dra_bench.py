"""The hostile-DRA benchmark's pure parts: its objects and its percentile."""

from __future__ import annotations

from lattice_dev.benchmarks.hostile_dra import (
    DEVICES,
    PER_CLAIM,
    hostile_pod,
    percentile,
    slice_body,
    template,
)
from scheduler.core.dra.objects import ResourceSlice


def test_the_hostile_pod_asks_more_than_a_node_has_in_claims_that_each_fit() -> None:
    body = slice_body("hostile-0001")
    parsed = ResourceSlice.from_api(body)
    assert parsed.node_name == "hostile-0001"
    assert len(parsed.devices) == DEVICES
    claims = hostile_pod()["spec"]["resourceClaims"]
    assert len(claims) * PER_CLAIM > DEVICES >= PER_CLAIM
    assert template()["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == PER_CLAIM


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0], 99) == 3.0
