"""Device taints (DRADeviceTaints, GA in 1.37): the allocator passes over a device with a
NoSchedule or NoExecute taint its request does not tolerate, as kube's ``allocateDevice``
does; DeviceTaintRules add their taint to the devices their selector names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from scheduler.core.dra.allocator import diagnose, untolerated_taints
from scheduler.core.dra.objects import (
    DeviceClass,
    DeviceTaint,
    DeviceTaintRule,
    DeviceToleration,
    ResourceClaim,
    ResourceSlice,
    claim_alpha_fields,
)
from scheduler.core.dra.state import DraState
from scheduler.core.plugins.dynamic_resources import CANNOT_ALLOCATE, cannot_allocate
from tests.core.dra.builders import (
    GPU_DRIVER,
    NIC_DRIVER,
    claim,
    device,
    device_class,
    exactly,
    first_available,
    request,
    resource_slice,
    taint,
    taint_rule,
    tainted,
    tolerating,
    toleration,
)

ECC = taint("gpu.example.com/unhealthy", value="ecc")
DRAINING = taint("gpu.example.com/draining", "NoExecute")


def state(slices: Sequence[dict[str, Any]], *, rules: Sequence[dict[str, Any]] = ()) -> DraState:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    dra.set_class(DeviceClass.from_api(device_class("nic", driver=NIC_DRIVER)))
    for s in slices:
        dra.set_slice(ResourceSlice.from_api(s))
    for r in rules:
        dra.set_taint_rule(DeviceTaintRule.from_api(r))
    return dra


def allocate(
    claims: Sequence[dict[str, Any]],
    slices: Sequence[dict[str, Any]],
    *,
    rules: Sequence[dict[str, Any]] = (),
    dra: DraState | None = None,
) -> list[dict[str, Any]] | None:
    dra = dra or state(slices, rules=rules)
    parsed = [ResourceClaim.from_api(c) for c in claims]
    return dra.allocator().allocate("n1", {}, parsed)


def devices_of(result: list[dict[str, Any]] | None) -> list[str]:
    assert result is not None
    return [r["device"] for a in result for r in a["devices"]["results"]]


def two_gpus(first: dict[str, Any], second: dict[str, Any] | None = None) -> dict[str, Any]:
    return resource_slice("n1-gpus", [first, second or device("gpu-1")], node="n1")


ONE_GPU = claim("c", request("gpu", exactly("gpu")))


def one_gpu_tolerating(*tolerations: dict[str, Any]) -> dict[str, Any]:
    return claim("c", request("gpu", tolerating(exactly("gpu"), *tolerations)))


# --- parsing -----------------------------------------------------------------------------


def test_slice_taints_and_request_tolerations_are_parsed_not_alpha() -> None:
    body = resource_slice(
        "s",
        [
            tainted(
                device("gpu-0"),
                {**ECC, "timeAdded": "2026-01-02T03:04:05Z"},
                {"key": "note", "effect": "None"},
            )
        ],
        node="n1",
    )
    (gpu,) = ResourceSlice.from_api(body).devices
    assert gpu.allocatable(35)
    assert gpu.taints == (
        DeviceTaint("gpu.example.com/unhealthy", "ecc", "NoSchedule", "2026-01-02T03:04:05Z"),
        DeviceTaint("note", "", "None"),
    )
    assert [str(t) for t in gpu.taints] == ["gpu.example.com/unhealthy=ecc:NoSchedule", "note:None"]
    assert gpu.blocking_taints
    spec = tolerating(
        exactly("gpu"),
        toleration("gpu.example.com/unhealthy", operator="Exists", effect="NoSchedule"),
        toleration("k", value="v", effect="NoExecute", seconds=30),
    )
    parsed = ResourceClaim.from_api(
        claim("c", request("gpu", spec), first_available("alt", ("a", spec)))
    )
    assert claim_alpha_fields(parsed, 35) == []
    exact = parsed.requests[0].exactly
    assert exact is not None
    assert exact.tolerations == (
        DeviceToleration("gpu.example.com/unhealthy", "Exists", "", "NoSchedule"),
        DeviceToleration("k", "Equal", "v", "NoExecute", 30),
    )
    assert parsed.requests[1].first_available[0].tolerations == exact.tolerations
    assert [t.to_api() for t in exact.tolerations] == spec["tolerations"]


def test_a_taint_rule_is_parsed_and_a_rule_without_selector_selects_nothing() -> None:
    rule = DeviceTaintRule.from_api(
        taint_rule("r", DRAINING, selector={"driver": GPU_DRIVER, "pool": "n1"})
    )
    assert rule.taint == DeviceTaint("gpu.example.com/draining", "", "NoExecute")
    assert (rule.selects, rule.driver, rule.pool, rule.device) == (True, GPU_DRIVER, "n1", None)
    assert rule.matches(GPU_DRIVER, "n1", "gpu-7")
    assert not rule.matches(NIC_DRIVER, "n1", "gpu-7")
    assert not rule.matches(GPU_DRIVER, "n2", "gpu-7")
    bare = DeviceTaintRule.from_api(taint_rule("bare", DRAINING))
    assert not bare.selects
    assert not bare.matches(GPU_DRIVER, "n1", "gpu-0")  # 1.37.1 (#141998): nothing
    everything = DeviceTaintRule.from_api(taint_rule("all", DRAINING, selector={}))
    assert everything.matches(NIC_DRIVER, "any", "thing")


# --- the allocator -----------------------------------------------------------------------


def test_a_tainted_device_is_passed_over_and_alone_does_not_fit() -> None:
    slices = [two_gpus(tainted(device("gpu-0"), ECC))]
    assert devices_of(allocate([ONE_GPU], slices)) == ["gpu-1"]
    two = claim("c", request("gpu", exactly("gpu", count=2)))
    assert allocate([two], slices) is None
    only = [resource_slice("n1-gpus", [tainted(device("gpu-0"), DRAINING)], node="n1")]
    assert allocate([ONE_GPU], only) is None


@pytest.mark.parametrize(
    ("taints", "tolerations", "tolerated"),
    [
        pytest.param([ECC], [toleration("gpu.example.com/unhealthy", operator="Exists")], True,
                     id="exists-key"),
        pytest.param([ECC], [toleration(operator="Exists")], True, id="exists-everything"),
        pytest.param([ECC], [toleration("gpu.example.com/unhealthy", value="ecc")], True,
                     id="equal-value"),
        pytest.param([ECC], [toleration("gpu.example.com/unhealthy", value="xid")], False,
                     id="equal-other-value"),
        pytest.param([ECC], [toleration("gpu.example.com/unhealthy")], False,
                     id="equal-empty-value"),
        pytest.param([ECC], [{"key": "gpu.example.com/unhealthy", "value": "ecc"}], True,
                     id="empty-operator-is-equal"),
        pytest.param([ECC], [toleration("other", operator="Exists")], False, id="other-key"),
        pytest.param([ECC], [toleration(operator="Exists", effect="NoSchedule")], True,
                     id="effect-matches"),
        pytest.param([ECC], [toleration(operator="Exists", effect="NoExecute")], False,
                     id="effect-differs"),
        pytest.param([DRAINING], [toleration(operator="Exists", effect="NoSchedule")], False,
                     id="noexecute-needs-its-own"),
        pytest.param([DRAINING], [toleration(operator="Exists", effect="NoExecute", seconds=0)],
                     True, id="noexecute-tolerated-seconds-ignored"),
        pytest.param([ECC], [{"operator": "Lt", "key": "gpu.example.com/unhealthy"}], False,
                     id="unknown-operator"),
        pytest.param([ECC, DRAINING], [toleration("gpu.example.com/unhealthy", value="ecc")],
                     False, id="one-of-two-tolerated"),
        pytest.param(
            [ECC, DRAINING],
            [toleration("gpu.example.com/unhealthy", value="ecc"),
             toleration("gpu.example.com/draining", operator="Exists")],
            True, id="both-tolerated",
        ),
        pytest.param([taint("note", "None")], [], True, id="none-effect-ignored"),
        pytest.param([taint("note", "PreferNoSchedule")], [], True, id="unknown-effect-ignored"),
    ],
)  # fmt: skip
def test_tolerations_as_kube_matches_them(
    taints: list[dict[str, Any]], tolerations: list[dict[str, Any]], tolerated: bool
) -> None:
    """kube's ``ToleratesTaint`` and ``taintPreventsAllocation``: every NoSchedule and
    NoExecute taint must be tolerated; None and unknown effects never block."""
    only = [resource_slice("n1-gpus", [tainted(device("gpu-0"), *taints)], node="n1")]
    result = allocate([one_gpu_tolerating(*tolerations)], only)
    assert (result is not None) is tolerated


def test_results_carry_a_copy_of_the_request_tolerations() -> None:
    tolerations = [
        toleration("gpu.example.com/unhealthy", operator="Exists", effect="NoSchedule"),
        toleration("gpu.example.com/draining", value="soon", effect="NoExecute", seconds=60),
    ]
    slices = [two_gpus(tainted(device("gpu-0"), ECC))]
    result = allocate([one_gpu_tolerating(*tolerations)], slices)
    assert result is not None
    assert result[0]["devices"]["results"] == [
        {
            "request": "gpu",
            "driver": GPU_DRIVER,
            "pool": "n1",
            "device": "gpu-0",
            "tolerations": tolerations,
        }
    ]
    plain = allocate([ONE_GPU], slices)
    assert plain is not None
    assert "tolerations" not in plain[0]["devices"]["results"][0]


def test_a_subrequest_is_judged_by_its_own_tolerations() -> None:
    """kube's ``tainted-two-devices-prioritized-list-tolerated``: the first subrequest
    tolerates nothing, the second the NoExecute taint."""
    slices = [two_gpus(tainted(device("gpu-0"), ECC), tainted(device("gpu-1"), DRAINING))]
    tolerate = toleration("gpu.example.com/draining", operator="Exists", effect="NoExecute")
    c = claim(
        "c",
        first_available(
            "gpu",
            ("plain", exactly("gpu")),
            ("tolerant", tolerating(exactly("gpu"), tolerate)),
        ),
    )
    result = allocate([c], slices)
    assert result is not None
    (entry,) = result[0]["devices"]["results"]
    assert (entry["request"], entry["device"]) == ("gpu/tolerant", "gpu-1")
    assert entry["tolerations"] == [tolerate]


def test_admin_access_does_not_bypass_taints() -> None:
    """kube's ``tainted-admin-access``: an adminAccess request may share devices in use,
    but not take an untolerated tainted one."""
    only = [resource_slice("n1-gpus", [tainted(device("gpu-0"), ECC)], node="n1")]
    admin = claim("c", request("gpu", exactly("gpu", admin=True)), namespace="ops")
    assert allocate([admin], only) is None
    tolerant = claim(
        "c",
        request("gpu", tolerating(exactly("gpu", admin=True), toleration(operator="Exists"))),
        namespace="ops",
    )
    assert devices_of(allocate([tolerant], only)) == ["gpu-0"]


def test_all_over_a_tainted_device_does_not_fit_and_is_no_error() -> None:
    """kube's ``tainted-all-devices-single``: All lists every selectable device, tainted
    ones too, and then cannot take them."""
    slices = [two_gpus(tainted(device("gpu-0"), ECC))]
    every = claim("c", request("gpu", exactly("gpu", mode="All")))
    assert allocate([every], slices) is None
    tolerant = claim(
        "c", request("gpu", tolerating(exactly("gpu", mode="All"), toleration(operator="Exists")))
    )
    assert devices_of(allocate([tolerant], slices)) == ["gpu-0", "gpu-1"]


# --- DeviceTaintRules --------------------------------------------------------------------


def gpu_and_nic_slices() -> list[dict[str, Any]]:
    return [
        resource_slice("n1-gpus", [device("gpu-0"), device("gpu-1")], node="n1"),
        resource_slice("n1-nics", [device("gpu-0")], node="n1", driver=NIC_DRIVER),
    ]


@pytest.mark.parametrize(
    ("selector", "free_gpus", "free_nics"),
    [
        pytest.param(None, ["gpu-0", "gpu-1"], ["gpu-0"], id="no-selector-nothing"),
        pytest.param({}, [], [], id="empty-selector-everything"),
        pytest.param({"driver": GPU_DRIVER}, [], ["gpu-0"], id="driver"),
        pytest.param({"pool": "n1"}, [], [], id="pool-of-both-drivers"),
        pytest.param({"pool": "n2"}, ["gpu-0", "gpu-1"], ["gpu-0"], id="other-pool"),
        pytest.param({"device": "gpu-0"}, ["gpu-1"], [], id="device-name-in-both-drivers"),
        pytest.param(
            {"driver": GPU_DRIVER, "pool": "n1", "device": "gpu-0"}, ["gpu-1"], ["gpu-0"],
            id="one-device",
        ),
    ],
)  # fmt: skip
def test_a_rule_taints_the_devices_its_selector_names(
    selector: dict[str, str] | None, free_gpus: list[str], free_nics: list[str]
) -> None:
    dra = state(gpu_and_nic_slices(), rules=[taint_rule("r", DRAINING, selector=selector)])
    index = dra.slice_index()
    gpus = index.pools("n1", {})[0].slices[0].devices
    nics = index.pools("n1", {})[1].slices[0].devices
    assert [d.name for d in gpus if not d.blocking_taints] == free_gpus
    assert [d.name for d in nics if not d.blocking_taints] == free_nics
    want = claim("c", request("gpu", exactly("gpu", count=len(free_gpus) or 1)))
    result = allocate([want], [], dra=dra)
    assert (devices_of(result) if result else []) == free_gpus


def test_rule_taints_follow_the_slice_taints_and_rules_go_by_name() -> None:
    slices = [resource_slice("n1-gpus", [tainted(device("gpu-0"), ECC)], node="n1")]
    rules = [
        taint_rule("b", taint("second", "None"), selector={"device": "gpu-0"}),
        taint_rule("a", DRAINING, selector={"device": "gpu-0"}),
    ]
    dra = state(slices, rules=rules)
    (gpu,) = dra.slice_index().pools("n1", {})[0].slices[0].devices
    assert [t.key for t in gpu.taints] == [
        "gpu.example.com/unhealthy",
        "gpu.example.com/draining",
        "second",
    ]
    assert dra.slices["n1-gpus"].devices[0].taints == gpu.taints[:1]  # the slice as read


def test_a_rule_change_reaches_the_next_allocation_and_the_memo_is_dropped() -> None:
    dra = state([two_gpus(device("gpu-0"))])
    assert devices_of(allocate([ONE_GPU], [], dra=dra)) == ["gpu-0"]
    dra.memo[("anything",)] = object()
    dra.set_taint_rule(DeviceTaintRule.from_api(taint_rule("r", ECC, selector={"device": "gpu-0"})))
    assert dra.memo == {}
    assert devices_of(allocate([ONE_GPU], [], dra=dra)) == ["gpu-1"]
    dra.remove_taint_rule("r")
    assert devices_of(allocate([ONE_GPU], [], dra=dra)) == ["gpu-0"]


# --- naming the taint --------------------------------------------------------------------


def test_the_untolerated_taints_are_named_only_where_they_keep_a_request_short() -> None:
    dra = state([two_gpus(tainted(device("gpu-0"), ECC), tainted(device("gpu-1"), DRAINING))])
    allocator = dra.allocator()
    one = [ResourceClaim.from_api(ONE_GPU)]
    assert untolerated_taints(allocator, "n1", {}, one) == (
        "gpu.example.com/unhealthy=ecc:NoSchedule",
        "gpu.example.com/draining:NoExecute",
    )
    (view,) = diagnose(allocator, "n1", {}, one)
    assert (view.matching, view.free, view.tainted) == (2, 0, 2)
    # Three devices asked: two would not do even untainted, so taints are not the reason.
    three = [ResourceClaim.from_api(claim("c", request("gpu", exactly("gpu", count=3))))]
    assert untolerated_taints(allocator, "n1", {}, three) == ()
    # Tolerating ECC leaves one free device: a 1-device claim is not short at all.
    partial = [
        ResourceClaim.from_api(
            one_gpu_tolerating(toleration(operator="Exists", effect="NoSchedule"))
        )
    ]
    assert untolerated_taints(allocator, "n1", {}, partial) == ()
    pair = ResourceClaim.from_api(
        claim(
            "c",
            request(
                "gpu",
                tolerating(
                    exactly("gpu", count=2), toleration(operator="Exists", effect="NoSchedule")
                ),
            ),
        )
    )
    assert untolerated_taints(allocator, "n1", {}, [pair]) == (
        "gpu.example.com/draining:NoExecute",
    )


def test_no_taint_anywhere_costs_nothing() -> None:
    dra = state([two_gpus(device("gpu-0"))])
    allocator = dra.allocator()
    assert not allocator.slices.tainted
    three = [ResourceClaim.from_api(claim("c", request("gpu", exactly("gpu", count=3))))]
    assert untolerated_taints(allocator, "n1", {}, three) == ()


def test_the_reason_keeps_kubes_words_and_adds_the_taints() -> None:
    assert cannot_allocate() == CANNOT_ALLOCATE
    assert cannot_allocate(["a:NoSchedule"]) == (
        "cannot allocate all claims (untolerated device taint: a:NoSchedule)"
    )
    assert cannot_allocate(["a:NoSchedule", "b=c:NoExecute", "d:NoSchedule", "e:NoSchedule"]) == (
        "cannot allocate all claims (untolerated device taints: a:NoSchedule and "
        "b=c:NoExecute and d:NoSchedule and 1 more)"
    )
