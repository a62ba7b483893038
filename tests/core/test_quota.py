"""ElasticQuota admission model: CapacityScheduling's PreFilter rules on exact integers."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.batch import Batch
from scheduler.core.dra.objects import DeviceClass, ResourceClaim
from scheduler.core.fairshare import FairShare
from scheduler.core.framework import Code
from scheduler.core.quota import (
    Nominated,
    Quota,
    QuotaContext,
    QuotaSnapshot,
    Rule,
    add,
    admit,
    admit_gang,
    aggregated_over_min,
    claim_request,
    format_amount,
    format_vector,
    gang_room,
    more_than_min_with,
    over_max,
    parse_quota,
    pod_request,
    used_over_min,
)
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.errors import InvalidObjectError
from scheduler.model.quantity import Quantity
from tests.builders import cluster, make_node, make_pod, quota_body
from tests.core.dra.builders import claim, device_class, exactly, first_available, request

GPU = "nvidia.com/gpu"


def snap(*quotas: Quota) -> QuotaSnapshot:
    return QuotaSnapshot({q.namespace: q for q in quotas})


def quota(
    ns: str,
    *,
    min: Mapping[str, int] | None = None,
    max: Mapping[str, int] | None = None,
    used: Mapping[str, int] | None = None,
) -> Quota:
    return Quota(ns, "q", dict(min or {}), dict(max or {}), dict(used or {}))


# --- parsing ---------------------------------------------------------------------------


def test_parse_rounds_like_node_resources_fit() -> None:
    q = parse_quota(
        quota_body(
            "team-a",
            min={"cpu": "1500m", "memory": "1Gi", GPU: 4},
            max={"cpu": "0.0001", GPU: "16"},
        )
    )
    assert (q.namespace, q.name, q.key) == ("team-a", "quota", "team-a/quota")
    assert dict(q.min) == {"cpu": 1500, "memory": 1 << 30, GPU: 4}
    assert dict(q.max) == {"cpu": 1, GPU: 16}  # MilliValue rounds up
    assert dict(q.used) == {}


def test_parse_without_min_or_max_is_zero_min_and_unlimited_max() -> None:
    q = parse_quota(quota_body("ns"))
    assert (dict(q.min), dict(q.max)) == ({}, {})
    assert over_max(q, {GPU: 10**12, "cpu": 10**9}) is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"max": {"cpu": "lots"}}, "spec.max[cpu]"),
        ({"min": {GPU: "-1"}}, f"spec.min[{GPU}]"),
        ({"min": ["cpu"]}, "spec.min"),
        ({"max": {"memory": "1e40"}}, "spec.max[memory]"),
        ("nope", "spec"),
    ],
)
def test_parse_refuses_broken_quantities_naming_the_field(spec: object, field: str) -> None:
    body = quota_body("ns")
    body["spec"] = spec
    with pytest.raises(InvalidObjectError) as e:
        parse_quota(body)
    assert e.value.field == field


def test_broken_quota_refuses_its_pods_with_the_reason_others_untouched() -> None:
    bad = quota_body("team-a", "eq", max={"cpu": "x"})
    good = quota_body("team-b", min={"cpu": "2"}, max={"cpu": "4"})
    s = QuotaSnapshot.build([bad, good])
    assert s.governs("team-a")
    assert s.of("team-a") is None
    v = admit(s, "team-a", {"cpu": 100})
    assert v.rule is Rule.INVALID
    assert not v.admitted
    assert v.message.startswith("quota team-a/eq is invalid: invalid spec.max[cpu] 'x'")
    assert admit(s, "team-b", {"cpu": 100}).rule is Rule.ADMITTED
    assert admit(s, "elsewhere", {"cpu": 10**9}).rule is Rule.NO_QUOTA
    assert admit(s, "elsewhere", {"cpu": 10**9}).admitted


def test_one_quota_per_namespace_first_by_name_and_usage_attached() -> None:
    s = QuotaSnapshot.build(
        [
            quota_body("ns", "zeta", max={"cpu": "1"}),
            quota_body("ns", "alpha", max={"cpu": "2"}),
        ],
        {"ns": {"cpu": 500}, "other": {"cpu": 7}},
    )
    q = s.of("ns")
    assert q is not None
    assert q.name == "alpha"
    assert dict(q.used) == {"cpu": 500}
    assert set(s.quotas) == {"ns"}


# --- the max rule ----------------------------------------------------------------------


def test_max_refuses_past_max_with_the_issue_wording() -> None:
    s = snap(quota("team-a", min={GPU: 16}, max={GPU: 16}, used={GPU: 14}))
    v = admit(s, "team-a", {GPU: 4, "cpu": 1000})
    assert v.rule is Rule.MAX
    assert v.resource == GPU
    assert v.message == "quota team-a/q: 14 of max 16 nvidia.com/gpu used, pod asks 4"
    assert admit(s, "team-a", {GPU: 2}).admitted  # exactly max is within


def test_max_missing_resource_is_unlimited_but_native_resources_always_compared() -> None:
    q = quota("ns", max={GPU: 2})
    assert over_max(q, {"cpu": 10**9, "example.com/fpga": 10**6}) is None
    # used already past a lowered max: upstream compares cpu/memory/ephemeral-storage even
    # for a pod asking none of them.
    lowered = quota("ns", max={"cpu": 1000}, used={"cpu": 1500})
    assert over_max(lowered, {GPU: 1}) == "cpu"
    # a scalar the pod does not ask for is not compared (upstream loops the request's).
    assert over_max(quota("ns", max={GPU: 1}, used={GPU: 5}), {"cpu": 1}) is None


def test_max_counts_nominated_pods_of_the_same_quota_at_equal_or_higher_priority() -> None:
    s = snap(quota("a", min={GPU: 8}, max={GPU: 8}, used={GPU: 4}))
    nominated = [
        Nominated("a", 10, {GPU: 2}),  # same quota, equal priority: counts
        Nominated("a", 5, {GPU: 8}),  # lower priority: ignored
        Nominated("nowhere", 100, {GPU: 8}),  # namespace without a quota: ignored
    ]
    assert admit(s, "a", {GPU: 2}, priority=10, nominated=nominated).admitted
    v = admit(s, "a", {GPU: 3}, priority=10, nominated=nominated)
    assert v.rule is Rule.MAX
    assert v.message == "quota a/q: 4 of max 8 nvidia.com/gpu used, pod asks 3 (+2 nominated)"


# --- the min rule ----------------------------------------------------------------------


def test_borrowing_is_bounded_by_the_sum_of_mins() -> None:
    a = quota("a", min={GPU: 4}, max={GPU: 16}, used={GPU: 10})
    b = quota("b", min={GPU: 8}, max={GPU: 16}, used={GPU: 0})
    s = snap(a, b)
    assert admit(s, "a", {GPU: 2}).admitted  # 12 of 12: borrows b's idle min
    v = admit(s, "a", {GPU: 3})
    assert v.rule is Rule.MIN
    assert v.message == (
        "quota a/q: all quotas use 10 of the 12 nvidia.com/gpu their mins sum to, pod asks 3"
    )
    # the same rule stops b, under its min, while a borrows: reclaim must make room.
    s2 = snap(a.with_used({GPU: 12}), b)
    assert admit(s2, "b", {GPU: 1}).rule is Rule.MIN


def test_min_rule_counts_other_quotas_nominated_pods_only_when_they_do_not_borrow() -> None:
    a = quota("a", min={GPU: 4}, max={GPU: 8}, used={GPU: 2})
    lender = quota("b", min={GPU: 4}, max={GPU: 8}, used={GPU: 2})
    borrower = quota("c", min={GPU: 0}, max={GPU: 8}, used={GPU: 2})
    s = snap(a, lender, borrower)  # total used 6 of min 8
    assert admit(s, "a", {GPU: 2}).admitted
    assert not admit(s, "a", {GPU: 2}, nominated=[Nominated("b", 0, {GPU: 1})]).admitted
    assert admit(s, "a", {GPU: 2}, nominated=[Nominated("c", 0, {GPU: 1})]).admitted


def test_min_rule_counts_a_borrowers_nominated_pod_within_its_fair_share() -> None:
    """Fair share's second rule lets a quota above its min reclaim for a pod that keeps it
    within its share: that pod's room is spoken for against every quota, as a lender's."""
    a = quota("a", min={GPU: 4}, max={GPU: 8}, used={GPU: 2})
    borrower = quota("c", min={GPU: 0}, max={GPU: 8}, used={GPU: 2})
    s = snap(a, quota("b", min={GPU: 4}, max={GPU: 8}, used={GPU: 2}), borrower)
    capacity = {GPU: 8}
    share = FairShare({GPU: Fraction(0)}, {GPU: Fraction(3)}, Fraction(3, 8))
    within = Nominated.of(s, "c", 0, {GPU: 1}, {"c": share}, capacity)
    beyond = Nominated.of(s, "c", 0, {GPU: 2}, {"c": share}, capacity)  # 4 > its share of 3
    assert (within.within_share, beyond.within_share) == (True, False)
    assert not Nominated.of(s, "c", 0, {GPU: 1}).within_share  # fair share off
    assert not admit(s, "a", {GPU: 2}, nominated=[within]).admitted
    assert admit(s, "a", {GPU: 2}, nominated=[beyond]).admitted


def test_min_rule_governs_only_resources_some_quota_names() -> None:
    s = snap(quota("a", min={GPU: 4}, max={GPU: 8}))
    # cpu named by no quota: a GPU-only quota does not refuse the pod's cpu.
    assert aggregated_over_min(s, {"cpu": 4000, GPU: 4}) is None
    assert aggregated_over_min(s, {GPU: 5}) == GPU
    # named in a max only: governed, against a sum of min of 0 (as upstream).
    s2 = snap(quota("a", max={"cpu": 8000}))
    assert aggregated_over_min(s2, {"cpu": 1}) == "cpu"


def test_min_rule_compares_every_used_resource_not_only_the_requested() -> None:
    s = snap(quota("a", min={"cpu": 1000, GPU: 4}, used={"cpu": 2000}))
    assert aggregated_over_min(s, {GPU: 1}) == "cpu"


def test_memory_amounts_in_messages_are_quantities() -> None:
    s = snap(quota("a", max={"memory": 16 << 30}, used={"memory": 15 << 30}))
    v = admit(s, "a", {"memory": 2 << 30})
    assert v.message == "quota a/q: 15Gi of max 16Gi memory used, pod asks 2Gi"


# --- gangs -----------------------------------------------------------------------------


def test_gang_is_admitted_as_one_unit() -> None:
    s = snap(quota("a", min={GPU: 8}, max={GPU: 8}, used={GPU: 2}))
    members = [{GPU: 2}, {GPU: 2}, {GPU: 2}]
    assert admit_gang(s, "a", members).admitted
    v = admit_gang(s, "a", [*members, {GPU: 2}])
    assert v.rule is Rule.MAX
    assert v.message == "quota a/q: 2 of max 8 nvidia.com/gpu used, gang of 4 asks 8"
    # every member alone would fit: the unit does not.
    assert all(admit(s, "a", m).admitted for m in [*members, {GPU: 2}])


def test_snapshot_with_used_assumes_and_releases() -> None:
    s = snap(quota("a", min={GPU: 4}, max={GPU: 4}))
    s1 = s.with_used("a", {GPU: 3})
    assert not admit(s1, "a", {GPU: 2}).admitted
    s2 = s1.with_used("a", {GPU: -3})
    assert admit(s2, "a", {GPU: 4}).admitted
    assert s.with_used("nowhere", {GPU: 1}) is s


# --- reclaim helpers -------------------------------------------------------------------


def test_used_over_min_and_more_than_min_with() -> None:
    q = quota("a", min={GPU: 4, "cpu": 4000}, used={GPU: 4, "cpu": 1000})
    assert not used_over_min(q)
    assert used_over_min(q.with_used({GPU: 5}))
    assert used_over_min(q.with_used({"example.com/fpga": 1}))  # missing from min is 0
    assert not more_than_min_with(q, {"cpu": 3000})
    assert more_than_min_with(q, {GPU: 1})
    # a scalar used past min but not requested is not compared (upstream loops the request)
    assert not more_than_min_with(q.with_used({GPU: 9}), {"cpu": 1})
    # restricted to the resources quotas name: cpu under a GPU-only min does not borrow
    gpu_only = quota("a", min={GPU: 4}, used={GPU: 4, "cpu": 8000})
    assert used_over_min(gpu_only)
    assert not used_over_min(gpu_only, governed=frozenset({GPU}))
    assert more_than_min_with(gpu_only, {"cpu": 1})
    assert not more_than_min_with(gpu_only, {"cpu": 1}, governed=frozenset({GPU}))


# --- requests --------------------------------------------------------------------------


def test_pod_request_is_node_resources_fit_request_with_extended_resources() -> None:
    pod = (
        make_pod("p", cpu="500m", memory="1Gi", resources={GPU: "2", "example.com/x": "1"})
        .init_container(cpu="2")
        .build()
    )
    assert pod_request(pod) == {"cpu": 2000, "memory": 1 << 30, GPU: 2, "example.com/x": 1}
    assert pod_request(pod, claims={GPU: 1}) == {
        "cpu": 2000,
        "memory": 1 << 30,
        GPU: 3,
        "example.com/x": 1,
    }


def _class(name: str, extended: str = "") -> DeviceClass:
    body = device_class(name)
    if extended:
        body["spec"]["extendedResourceName"] = extended
    return DeviceClass.from_api(body)


def test_claim_request_counts_devices_of_mapped_classes() -> None:
    classes = {"gpu": _class("gpu", GPU), "nic": _class("nic")}
    pending = ResourceClaim.from_api(
        claim(
            "c1",
            request("a", exactly("gpu", count=2)),
            request("b", exactly("nic", count=4)),
            first_available("c", ("big", exactly("gpu", count=3)), ("small", exactly("gpu"))),
            request("d", exactly("gpu", mode="All")),
        )
    )
    assert claim_request([pending], classes) == {GPU: 5}
    allocated_body = claim("c2", request("a", exactly("gpu", count=2)))
    allocated_body["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "a", "driver": "d", "pool": "p", "device": "g0"},
                    {"request": "a", "driver": "d", "pool": "p", "device": "g1"},
                    {
                        "request": "a",
                        "driver": "d",
                        "pool": "p",
                        "device": "g2",
                        "adminAccess": True,
                    },
                ]
            }
        }
    }
    assert claim_request([ResourceClaim.from_api(allocated_body)], classes) == {GPU: 2}
    generated = claim("c3", request("a", exactly("gpu", count=2)))
    generated["metadata"]["annotations"] = {
        "resource.kubernetes.io/extended-resource-claim": "true"
    }
    assert claim_request([ResourceClaim.from_api(generated)], classes) == {}


# --- formatting and properties -----------------------------------------------------------

_RESOURCES = st.sampled_from(["cpu", "memory", "ephemeral-storage", GPU, "hugepages-2Mi"])


@given(_RESOURCES, st.integers(min_value=0, max_value=2**62))
def test_format_amount_round_trips(resource: str, amount: int) -> None:
    q = Quantity.parse(format_amount(resource, amount))
    assert (q.milli_value() if resource == "cpu" else q.value()) == amount


def test_format_vector_is_a_resource_list() -> None:
    assert format_vector({"cpu": 1500, "memory": 3 << 20, GPU: 2}) == {
        "cpu": "1500m",
        "memory": "3Mi",
        GPU: "2",
    }


_AMOUNTS = st.dictionaries(st.sampled_from(["cpu", "memory", GPU]), st.integers(0, 64), max_size=3)


@given(
    st.lists(st.tuples(_AMOUNTS, _AMOUNTS, _AMOUNTS), min_size=1, max_size=4),
    _AMOUNTS,
    _AMOUNTS,
)
def test_admission_is_monotone_and_matches_a_direct_reading(
    specs: list[tuple[dict[str, int], dict[str, int], dict[str, int]]],
    request: dict[str, int],
    smaller_by: dict[str, int],
) -> None:
    s = snap(
        *(quota(f"ns{i}", min=mn, max=mx, used=used) for i, (mn, mx, used) in enumerate(specs))
    )
    q = s.quotas["ns0"]
    # a direct reading of the two rules
    keys = set(request) | {"cpu", "memory", "ephemeral-storage"}
    max_ok = all(r not in q.max or q.used.get(r, 0) + request.get(r, 0) <= q.max[r] for r in keys)
    total = add(*(x.used for x in s.quotas.values()), request)
    mins = add(*(x.min for x in s.quotas.values()))
    named = {r for x in s.quotas.values() for r in (*x.min, *x.max)}
    min_ok = all(total[r] <= mins.get(r, 0) for r in total if r in named)
    verdict = admit(s, "ns0", request)
    assert verdict.admitted == (max_ok and min_ok)
    if not max_ok:
        assert verdict.rule is Rule.MAX
    # asking for less never turns an admission into a refusal
    less = {r: max(0, a - smaller_by.get(r, 0)) for r, a in request.items()}
    if verdict.admitted:
        assert admit(s, "ns0", less).admitted


# --- the PreFilter in the framework --------------------------------------------------------


def _gpu_nodes() -> Snapshot:
    return cluster([make_node(f"n{i}", cpu="32", memory="64Gi").resource(GPU, 8) for i in range(2)])


def test_capacity_scheduling_prefilter_refuses_before_any_node_and_skips_others() -> None:
    snapshot = _gpu_nodes()
    context = QuotaContext(snap(quota("team-a", min={GPU: 8}, max={GPU: 8}, used={GPU: 6})))
    pod = make_pod("p", cpu="1", namespace="team-a", resources={GPU: "4"}).build()
    decision = Framework().schedule(snapshot, pod, quota=context)
    assert decision.selected is None
    rejection = decision.explanation.prefilter_rejection
    assert rejection is not None
    assert rejection.plugin == "CapacityScheduling"
    # Unschedulable, as upstream: every node stays a potential node for reclaim's PostFilter
    assert rejection.code is Code.UNSCHEDULABLE
    assert rejection.message == "quota team-a/q: 6 of max 8 nvidia.com/gpu used, pod asks 4"
    other = make_pod("o", cpu="1", namespace="elsewhere", resources={GPU: "4"}).build()
    assert Framework().schedule(snapshot, other, quota=context).selected is not None
    # Without quotas in the cycle (simulations, tests) the plugin stays out of the way.
    assert Framework().schedule(snapshot, pod).selected is not None


def test_nominated_pods_of_the_quota_hold_their_room_except_the_pod_itself() -> None:
    snapshot = _gpu_nodes()
    q = snap(quota("team-a", min={GPU: 8}, max={GPU: 8}, used={GPU: 2}))
    pod = make_pod("p", cpu="1", namespace="team-a", resources={GPU: "4"}).uid("me").build()
    own = QuotaContext(q, (("me", Nominated("team-a", 0, {GPU: 4})),))
    assert Framework().schedule(snapshot, pod, quota=own).selected is not None
    held = QuotaContext(q, (("other", Nominated("team-a", 5, {GPU: 4})),))
    assert Framework().schedule(snapshot, pod, quota=held).selected is None


def test_pods_of_a_quota_namespace_are_never_served_from_the_batch_memo() -> None:
    snapshot = _gpu_nodes()
    q = snap(quota("team-a", min={GPU: 16}, max={GPU: 6}))
    batch = Batch()
    framework = Framework()
    for i in range(3):
        pod = make_pod(f"p{i}", cpu="1", namespace="team-a", resources={GPU: "2"}).build()
        context = QuotaContext(q.with_used("team-a", {GPU: 2 * i}))
        decision = framework.schedule(snapshot, pod, batch=batch, quota=context)
        assert decision.selected is not None
        snapshot.add_pod(pod, decision.selected)
        batch.assumed(snapshot, decision.selected)
    assert batch.hits == 0
    pod = make_pod("p3", cpu="1", namespace="team-a", resources={GPU: "2"}).build()
    context = QuotaContext(q.with_used("team-a", {GPU: 6}))
    assert framework.schedule(snapshot, pod, batch=batch, quota=context).selected is None


def test_gang_room_admits_the_quorum_as_a_unit_then_as_many_as_fit() -> None:
    s = snap(quota("a", min={GPU: 16}, max={GPU: 7}))
    members = [{GPU: 2}] * 5
    count, verdict = gang_room(s, "a", members, 2)
    assert (count, verdict.admitted) == (3, True)
    count, verdict = gang_room(s, "a", members, 4)
    assert count == 0
    assert verdict.message == "quota a/q: 0 of max 7 nvidia.com/gpu used, gang of 4 asks 8"
